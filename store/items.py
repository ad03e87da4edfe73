"""Typed records of the table: each a frozen dataclass with `to_item`/`from_item`.

Timestamps are stored as fixed-width ISO 8601 UTC strings, so that string order is
time order in sort keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from store import keys
from store.enums import CapsuleStatus, ContentStatus
from store.port import Item, Key, Update, eq


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _opt(item: Item, name: str) -> Any:
    return item.get(name)


@dataclass(frozen=True)
class User:
    id: str
    created_at: str
    email: str | None = None
    given_name: str | None = None
    family_name: str | None = None
    profile_image_url: str | None = None
    onboarding_complete: bool = False

    @property
    def key(self) -> Key:
        return keys.user(self.id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "User",
            "id": self.id,
            "createdAt": self.created_at,
            "email": self.email,
            "givenName": self.given_name,
            "familyName": self.family_name,
            "profileImageUrl": self.profile_image_url,
            "onboardingComplete": self.onboarding_complete,
        }

    @classmethod
    def from_item(cls, item: Item) -> User:
        return cls(
            id=item["id"],
            created_at=item["createdAt"],
            email=_opt(item, "email"),
            given_name=_opt(item, "givenName"),
            family_name=_opt(item, "familyName"),
            profile_image_url=_opt(item, "profileImageUrl"),
            onboarding_complete=bool(item.get("onboardingComplete", False)),
        )


@dataclass(frozen=True)
class Family:
    id: str
    name: str
    admin_user_id: str
    trust_level: str
    vouch_threshold: int
    invite_code: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.family(self.id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "Family",
            "id": self.id,
            "name": self.name,
            "adminUserId": self.admin_user_id,
            "trustLevel": self.trust_level,
            "vouchThreshold": self.vouch_threshold,
            "inviteCode": self.invite_code,
            "createdAt": self.created_at,
        }

    @classmethod
    def from_item(cls, item: Item) -> Family:
        return cls(
            id=item["id"],
            name=item["name"],
            admin_user_id=item["adminUserId"],
            trust_level=item["trustLevel"],
            vouch_threshold=int(item["vouchThreshold"]),
            invite_code=item["inviteCode"],
            created_at=item["createdAt"],
        )


@dataclass(frozen=True)
class Membership:
    family_id: str
    user_id: str
    role: str  # ADMIN | MEMBER | PENDING
    joined_at: str
    vouch_score: int = 0

    @property
    def key(self) -> Key:
        return keys.member(self.family_id, self.user_id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "Membership",
            "familyId": self.family_id,
            "userId": self.user_id,
            "role": self.role,
            "joinedAt": self.joined_at,
            "vouchScore": self.vouch_score,
        }

    @classmethod
    def from_item(cls, item: Item) -> Membership:
        return cls(
            family_id=item["familyId"],
            user_id=item["userId"],
            role=item["role"],
            joined_at=item["joinedAt"],
            vouch_score=int(item.get("vouchScore", 0)),
        )


@dataclass(frozen=True)
class UserFamily:
    """The mirror of a membership under the user, written in the same transaction."""

    user_id: str
    family_id: str
    joined_at: str

    @property
    def key(self) -> Key:
        return keys.user_family(self.user_id, self.family_id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "UserFamily",
            "userId": self.user_id,
            "familyId": self.family_id,
            "joinedAt": self.joined_at,
        }

    @classmethod
    def from_item(cls, item: Item) -> UserFamily:
        return cls(user_id=item["userId"], family_id=item["familyId"], joined_at=item["joinedAt"])


@dataclass(frozen=True)
class Vouch:
    family_id: str
    user_id: str
    voucher_id: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.vouch(self.family_id, self.user_id, self.voucher_id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "Vouch",
            "familyId": self.family_id,
            "userId": self.user_id,
            "voucherId": self.voucher_id,
            "createdAt": self.created_at,
        }

    @classmethod
    def from_item(cls, item: Item) -> Vouch:
        return cls(
            family_id=item["familyId"],
            user_id=item["userId"],
            voucher_id=item["voucherId"],
            created_at=item["createdAt"],
        )


@dataclass(frozen=True)
class Invite:
    code: str
    family_id: str

    @property
    def key(self) -> Key:
        return keys.invite(self.code)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {"PK": pk, "SK": sk, "type": "Invite", "code": self.code, "familyId": self.family_id}

    @classmethod
    def from_item(cls, item: Item) -> Invite:
        return cls(code=item["code"], family_id=item["familyId"])


@dataclass(frozen=True)
class InviteGuesses:
    """Wrong invite codes sent by one user in the current window."""

    user_id: str
    window_start: str
    count: int
    blocked_until: str | None = None

    @property
    def key(self) -> Key:
        return keys.invite_guesses(self.user_id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "InviteGuesses",
            "userId": self.user_id,
            "windowStart": self.window_start,
            "count": self.count,
            "blockedUntil": self.blocked_until,
        }

    @classmethod
    def from_item(cls, item: Item) -> InviteGuesses:
        return cls(
            user_id=item["userId"],
            window_start=item["windowStart"],
            count=int(item["count"]),
            blocked_until=_opt(item, "blockedUntil"),
        )


IN_PIPELINE = (ContentStatus.PROCESSING, ContentStatus.TRANSCODING, ContentStatus.TRANSCRIBING)


def _content_gsi2(content_id: str, status: str, since: str) -> dict[str, str]:
    if status in IN_PIPELINE:
        pk, sk = keys.pipeline_gsi2(since, content_id)
    elif status in (ContentStatus.READY, ContentStatus.DELIVERED):
        pk, sk = keys.archive_gsi2(since, content_id)
    else:
        return {}
    return {"GSI2PK": pk, "GSI2SK": sk}


# Reaction counts are top-level attributes because DynamoDB's ADD works only there.
REACTION_ATTR = "R#"


def reaction_attr(emoji: str) -> str:
    return REACTION_ATTR + emoji


@dataclass(frozen=True)
class Content:
    id: str
    family_id: str
    author_id: str
    type: str  # VIDEO | AUDIO | PHOTO | TEXT
    status: str
    mime_type: str
    size_bytes: int
    created_at: str
    title: str | None = None
    capsule_id: str | None = None
    s3_key: str | None = None
    media_key: str | None = None
    thumbnail_key: str | None = None
    transcription: str | None = None
    failure_reason: str | None = None
    ready_at: str | None = None
    comment_count: int = 0
    reactions: dict[str, int] = field(default_factory=dict)
    in_feed: bool = True

    @property
    def key(self) -> Key:
        return keys.content(self.id)

    def feed_keys(self) -> dict[str, str]:
        gsi1pk, gsi1sk = keys.feed_gsi1(self.family_id, self.created_at, self.id)
        return {"GSI1PK": gsi1pk, "GSI1SK": gsi1sk}

    def to_item(self) -> Item:
        pk, sk = self.key
        item: Item = {
            "PK": pk,
            "SK": sk,
            "type": "Content",
            "id": self.id,
            "familyId": self.family_id,
            "authorId": self.author_id,
            "contentType": self.type,
            "status": self.status,
            "mimeType": self.mime_type,
            "sizeBytes": self.size_bytes,
            "createdAt": self.created_at,
            "title": self.title,
            "capsuleId": self.capsule_id,
            "s3Key": self.s3_key,
            "mediaKey": self.media_key,
            "thumbnailKey": self.thumbnail_key,
            "transcription": self.transcription,
            "failureReason": self.failure_reason,
            "readyAt": self.ready_at,
            "commentCount": self.comment_count,
        }
        item.update({reaction_attr(emoji): n for emoji, n in self.reactions.items()})
        if self.in_feed:
            item.update(self.feed_keys())
        item.update(_content_gsi2(self.id, self.status, self.ready_at or self.created_at))
        return item

    def transition(self, to: str, at: str, **changes: Any) -> Update:
        """The conditional write of one state-machine move: it succeeds only
        while the item is still in the state this record was read in."""
        fields: dict[str, Any] = {"status": to, **changes}
        remove: list[str] = []
        ready_at = changes.get("readyAt", self.ready_at) or at
        gsi2 = _content_gsi2(
            self.id, to, ready_at if to in (ContentStatus.READY, ContentStatus.DELIVERED) else at
        )
        if gsi2:
            fields.update(gsi2)
        else:
            remove = ["GSI2PK", "GSI2SK"]
        return Update(self.key, set=fields, remove=remove, condition=eq("status", self.status))

    @classmethod
    def from_item(cls, item: Item) -> Content:
        return cls(
            id=item["id"],
            family_id=item["familyId"],
            author_id=item["authorId"],
            type=item["contentType"],
            status=item["status"],
            mime_type=item["mimeType"],
            size_bytes=int(item["sizeBytes"]),
            created_at=item["createdAt"],
            title=_opt(item, "title"),
            capsule_id=_opt(item, "capsuleId"),
            s3_key=_opt(item, "s3Key"),
            media_key=_opt(item, "mediaKey"),
            thumbnail_key=_opt(item, "thumbnailKey"),
            transcription=_opt(item, "transcription"),
            failure_reason=_opt(item, "failureReason"),
            ready_at=_opt(item, "readyAt"),
            comment_count=int(item.get("commentCount", 0)),
            reactions={
                name[len(REACTION_ATTR) :]: int(n)
                for name, n in item.items()
                if name.startswith(REACTION_ATTR) and int(n) > 0
            },
            in_feed="GSI1PK" in item,
        )


@dataclass(frozen=True)
class Comment:
    content_id: str
    id: str
    author_id: str
    body: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.comment(self.content_id, self.created_at, self.id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "Comment",
            "contentId": self.content_id,
            "id": self.id,
            "authorId": self.author_id,
            "body": self.body,
            "createdAt": self.created_at,
        }

    @classmethod
    def from_item(cls, item: Item) -> Comment:
        return cls(
            content_id=item["contentId"],
            id=item["id"],
            author_id=item["authorId"],
            body=item["body"],
            created_at=item["createdAt"],
        )


@dataclass(frozen=True)
class Reaction:
    content_id: str
    emoji: str
    user_id: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.reaction(self.content_id, self.emoji, self.user_id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "Reaction",
            "contentId": self.content_id,
            "emoji": self.emoji,
            "userId": self.user_id,
            "createdAt": self.created_at,
        }

    @classmethod
    def from_item(cls, item: Item) -> Reaction:
        return cls(
            content_id=item["contentId"],
            emoji=item["emoji"],
            user_id=item["userId"],
            created_at=item["createdAt"],
        )


@dataclass(frozen=True)
class Capsule:
    id: str
    family_id: str
    creator_id: str
    title: str
    unlock_date: str
    status: str
    created_at: str
    recipient_ids: tuple[str, ...]
    content_id: str | None = None
    notification_sent: bool = False
    unlocked_at: str | None = None
    viewed_at: str | None = None
    creator_told_empty: bool = False
    unlocking_at: str | None = None

    @property
    def key(self) -> Key:
        return keys.capsule(self.id)

    def to_item(self, shards: int) -> Item:
        pk, sk = self.key
        gsi1pk, gsi1sk = keys.capsule_gsi1(self.creator_id, self.created_at, self.id)
        item: Item = {
            "PK": pk,
            "SK": sk,
            "type": "Capsule",
            "id": self.id,
            "familyId": self.family_id,
            "creatorId": self.creator_id,
            "title": self.title,
            "unlockDate": self.unlock_date,
            "status": self.status,
            "createdAt": self.created_at,
            "recipientIds": list(self.recipient_ids),
            "contentId": self.content_id,
            "notificationSent": self.notification_sent,
            "unlockedAt": self.unlocked_at,
            "viewedAt": self.viewed_at,
            "creatorToldEmpty": self.creator_told_empty,
            "unlockingAt": self.unlocking_at,
            "GSI1PK": gsi1pk,
            "GSI1SK": gsi1sk,
        }
        if self.status in (CapsuleStatus.SCHEDULED, CapsuleStatus.LOCKED, CapsuleStatus.UNLOCKING):
            item["GSI2PK"], item["GSI2SK"] = keys.capsule_gsi2(self.unlock_date, self.id, shards)
        return item

    @classmethod
    def from_item(cls, item: Item) -> Capsule:
        return cls(
            id=item["id"],
            family_id=item["familyId"],
            creator_id=item["creatorId"],
            title=item["title"],
            unlock_date=item["unlockDate"],
            status=item["status"],
            created_at=item["createdAt"],
            recipient_ids=tuple(item.get("recipientIds") or ()),
            content_id=_opt(item, "contentId"),
            notification_sent=bool(item.get("notificationSent", False)),
            unlocked_at=_opt(item, "unlockedAt"),
            viewed_at=_opt(item, "viewedAt"),
            creator_told_empty=bool(item.get("creatorToldEmpty", False)),
            unlocking_at=_opt(item, "unlockingAt"),
        )


@dataclass(frozen=True)
class Recipient:
    capsule_id: str
    user_id: str
    unlock_date: str
    family_id: str
    notified_at: str | None = None
    viewed_at: str | None = None
    # Recipients learn of a capsule once it is scheduled; a draft is the creator's alone.
    visible: bool = False

    @property
    def key(self) -> Key:
        return keys.recipient(self.capsule_id, self.user_id)

    def to_item(self) -> Item:
        pk, sk = self.key
        item: Item = {
            "PK": pk,
            "SK": sk,
            "type": "Recipient",
            "capsuleId": self.capsule_id,
            "userId": self.user_id,
            "unlockDate": self.unlock_date,
            "familyId": self.family_id,
            "notifiedAt": self.notified_at,
            "viewedAt": self.viewed_at,
        }
        if self.visible:
            item["GSI1PK"], item["GSI1SK"] = keys.recipient_gsi1(
                self.user_id, self.unlock_date, self.capsule_id
            )
        return item

    @classmethod
    def from_item(cls, item: Item) -> Recipient:
        return cls(
            capsule_id=item["capsuleId"],
            user_id=item["userId"],
            unlock_date=item["unlockDate"],
            family_id=item["familyId"],
            notified_at=_opt(item, "notifiedAt"),
            viewed_at=_opt(item, "viewedAt"),
            visible="GSI1PK" in item,
        )


@dataclass(frozen=True)
class Notification:
    user_id: str
    id: str
    type: str
    created_at: str
    read: bool = False
    family_id: str | None = None
    content_id: str | None = None
    capsule_id: str | None = None

    @property
    def key(self) -> Key:
        return keys.notification(self.user_id, self.created_at, self.id)

    def to_item(self) -> Item:
        pk, sk = self.key
        return {
            "PK": pk,
            "SK": sk,
            "type": "Notification",
            "userId": self.user_id,
            "id": self.id,
            "notificationType": self.type,
            "createdAt": self.created_at,
            "read": self.read,
            "familyId": self.family_id,
            "contentId": self.content_id,
            "capsuleId": self.capsule_id,
        }

    @classmethod
    def from_item(cls, item: Item) -> Notification:
        return cls(
            user_id=item["userId"],
            id=item["id"],
            type=item["notificationType"],
            created_at=item["createdAt"],
            read=bool(item.get("read", False)),
            family_id=_opt(item, "familyId"),
            content_id=_opt(item, "contentId"),
            capsule_id=_opt(item, "capsuleId"),
        )


@dataclass(frozen=True)
class Tag:
    author_id: str
    content_id: str
    family_id: str
    value: str
    normalized: str
    created_at: str
    private: bool = False
    set_name: str | None = None
    mime_type: str | None = None

    @property
    def key(self) -> Key:
        return keys.tag(self.author_id, self.content_id, self.normalized)

    def to_item(self) -> Item:
        pk, sk = self.key
        item: Item = {
            "PK": pk,
            "SK": sk,
            "type": "Tag",
            "authorId": self.author_id,
            "contentId": self.content_id,
            "familyId": self.family_id,
            "value": self.value,
            "normalized": self.normalized,
            "createdAt": self.created_at,
            "private": self.private,
            "setName": self.set_name,
            "mimeType": self.mime_type,
        }
        if not self.private:
            item["GSI1PK"], item["GSI1SK"] = keys.tag_gsi1(
                self.family_id, self.normalized, self.content_id, self.author_id
            )
        item["GSI2PK"], item["GSI2SK"] = keys.tag_gsi2(self.author_id, self.normalized, self.content_id)
        return item

    @classmethod
    def from_item(cls, item: Item) -> Tag:
        return cls(
            author_id=item["authorId"],
            content_id=item["contentId"],
            family_id=item["familyId"],
            value=item["value"],
            normalized=item["normalized"],
            created_at=item["createdAt"],
            private=bool(item.get("private", False)),
            set_name=_opt(item, "setName"),
            mime_type=_opt(item, "mimeType"),
        )
