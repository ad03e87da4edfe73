"""Typed records of the table: frozen dataclasses mapped to and from items by
the one codec (`store.codec.Record`); each declares only what differs.

Timestamps are stored as fixed-width ISO 8601 UTC strings, so that string order is
time order in sort keys.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from store import keys
from store.codec import Record
from store.enums import (
    DIGESTS,
    CapsuleStatus,
    ContentStatus,
    EmailPreference,
    ExportStatus,
    NotificationType,
    PostingPolicy,
)
from store.port import TTL_ATTRIBUTE, Condition, Item, Key, NotExists, Update, any_of, eq


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class User(Record):
    id: str
    created_at: str
    email: str | None = None
    given_name: str | None = None
    family_name: str | None = None
    profile_image_url: str | None = None
    onboarding_complete: bool = False
    # Email: what the person chose, and for a digest, the end of the
    # last period digested (the digests' index is sorted by it).
    email_preference: str = EmailPreference.NONE
    digest_until: str | None = None
    # The notification types pushed to the person's devices; None until they
    # choose (`enums.DEFAULT_PUSH_TYPES`).
    push_types: tuple[str, ...] | None = None

    @property
    def key(self) -> Key:
        return keys.user(self.id)

    def index_keys(self) -> Item:
        return digest_index(self.id, self.email_preference, self.digest_until or "")


def digest_index(user_id: str, preference: str, digested_until: str) -> dict[str, str]:
    """A user's keys in the digests' index: only while they chose a digest."""
    if preference not in DIGESTS:
        return {}
    gsi2pk, gsi2sk = keys.digest_gsi2(preference, digested_until, user_id)
    return {"GSI2PK": gsi2pk, "GSI2SK": gsi2sk}


@dataclass(frozen=True)
class Family(Record):
    """`admin_user_id` is the family's creator. Who is an ADMIN now, and since
    when, is one top-level attribute per ADMIN (`keys.admin_attribute`), moved
    in the same update as `adminCount`; a family from before holds none of them,
    and reads as run by its creator alone."""

    DERIVED: ClassVar[frozenset[str]] = frozenset({"admins", "departing"})

    id: str
    name: str
    admin_user_id: str
    trust_level: str
    vouch_threshold: int
    invite_code: str
    created_at: str
    posting_policy: str = PostingPolicy.EVERYONE
    # The family's own code admits people while this holds; an ADMIN may turn it off.
    invite_code_enabled: bool = True
    admins: dict[str, str] = field(default_factory=dict)  # user id -> ADMIN since
    # user id -> when their account deletion began (`keys.departing_attribute`).
    departing: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return keys.family(self.id)

    def extra_attributes(self) -> Item:
        return {keys.admin_attribute(user_id): since for user_id, since in self.admins.items()} | {
            keys.departing_attribute(user_id): since for user_id, since in self.departing.items()
        }

    @classmethod
    def derived_from(cls, item: Item) -> dict[str, Any]:
        admin, departing = keys.ADMIN_ATTRIBUTE_PREFIX, keys.DEPARTING_ATTRIBUTE_PREFIX
        return {
            "admins": {name[len(admin) :]: str(v) for name, v in item.items() if name.startswith(admin)},
            "departing": {
                name[len(departing) :]: str(v) for name, v in item.items() if name.startswith(departing)
            },
        }

    @property
    def legacy_admins(self) -> bool:
        """Written before co-admins: no ADMIN attribute yet."""
        return not self.admins

    def admin_since(self) -> dict[str, str]:
        """Every ADMIN now, with the moment they became one."""
        return dict(self.admins) if self.admins else {self.admin_user_id: self.created_at}

    def longest_standing_admin(self) -> str:
        since = self.admin_since()
        return min(since, key=lambda user_id: (since[user_id], user_id))


@dataclass(frozen=True)
class Membership(Record):
    family_id: str
    user_id: str
    role: str  # a store.enums.Role
    joined_at: str
    vouch_score: int = 0
    # Nothing of the family is pushed to the member until then (`muteFamily`).
    push_muted_until: str | None = None

    @property
    def key(self) -> Key:
        return keys.member(self.family_id, self.user_id)


@dataclass(frozen=True)
class UserFamily(Record):
    """The mirror of a membership under the user, written in the same transaction."""

    user_id: str
    family_id: str
    joined_at: str

    @property
    def key(self) -> Key:
        return keys.user_family(self.user_id, self.family_id)


@dataclass(frozen=True)
class Vouch(Record):
    family_id: str
    user_id: str
    voucher_id: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.vouch(self.family_id, self.user_id, self.voucher_id)


@dataclass(frozen=True)
class Invite(Record):
    """A code and the family it admits to: the family's own code (no
    `invite_id`), or an invite an ADMIN made, whose limits and count are on its
    `FamilyInvite`."""

    code: str
    family_id: str
    invite_id: str | None = None

    @property
    def key(self) -> Key:
        return keys.invite(self.code)


@dataclass(frozen=True)
class FamilyInvite(Record):
    """An invite an ADMIN made: at most `max_uses` joins (None: no limit),
    until `expires_at` (None: no end), until revoked. `uses` only moves under a
    condition that checks all three, in the joining transaction. With an
    `email`, it stays in the invitations' mail outbox (GSI2) until the mailer
    settles it (`mail_state`)."""

    family_id: str
    id: str
    code: str
    created_by: str
    created_at: str
    max_uses: int | None = None
    uses: int = 0
    ends_at: str | None = None
    revoked_at: str | None = None
    email: str | None = None
    mail_state: str | None = None

    @property
    def key(self) -> Key:
        return keys.family_invite(self.family_id, self.id)

    def index_keys(self) -> Item:
        if self.email is None or self.mail_state is not None:
            return {}
        gsi2pk, gsi2sk = keys.invite_mail_outbox_gsi2(self.created_at, self.family_id, self.id)
        return {"GSI2PK": gsi2pk, "GSI2SK": gsi2sk}

    def refusal(self, now: str) -> str | None:
        """Why this invite admits nobody now, or None."""
        if self.revoked_at is not None:
            return "that invite was revoked by the family's admin"
        if self.ends_at is not None and self.ends_at <= now:
            return "that invite has expired; ask the family's admin for a new one"
        if self.max_uses is not None and self.uses >= self.max_uses:
            return "that invite has been used up; ask the family's admin for a new one"
        return None


@dataclass(frozen=True)
class FamilyEvent(Record):
    """One entry of the admins' record, written in the transaction of the change it records."""

    RENAMED: ClassVar[Mapping[str, str]] = {"type": "eventType"}

    family_id: str
    id: str
    type: str  # a store.enums.FamilyEventType
    actor_id: str
    created_at: str
    subject_id: str | None = None
    detail: str | None = None

    @property
    def key(self) -> Key:
        return keys.family_event(self.family_id, self.created_at, self.id)


@dataclass(frozen=True)
class InviteGuesses(Record):
    """Wrong invite codes sent by one user in the current window."""

    user_id: str
    window_start: str
    count: int
    blocked_until: str | None = None

    @property
    def key(self) -> Key:
        return keys.invite_guesses(self.user_id)


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
class Content(Record):
    RENAMED: ClassVar[Mapping[str, str]] = {"type": "contentType"}
    DERIVED: ClassVar[frozenset[str]] = frozenset({"reactions", "in_feed"})

    id: str
    family_id: str
    author_id: str
    type: str  # a store.enums.ContentType
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
    # ISO 639-1, as the transcriber detected it (or as the settings forced it).
    transcript_language: str | None = None
    # The WebVTT captions blob, when there is a transcription.
    captions_key: str | None = None
    # Why a transcription failed: the content is READY without one, and may retry it.
    transcription_failure: str | None = None
    failure_reason: str | None = None
    ready_at: str | None = None
    # When the family's notes of its first READY are dated, kept before the
    # first of them is written if they take more than one transaction: a
    # resumed walk writes the rest under the same keys.
    notes_at: str | None = None
    # When a photo was taken, from its EXIF: ISO 8601 with the camera's own UTC offset,
    # or with none when the camera recorded none. Not a key, so not normalised to UTC.
    captured_at: str | None = None
    comment_count: int = 0
    reactions: dict[str, int] = field(default_factory=dict)
    # In the family feed (GSI1); capsule content stays out until its capsule opens.
    in_feed: bool = True
    # An upload in parts: the blob store's multipart upload id and the part size.
    upload_id: str | None = None
    part_size_bytes: int | None = None

    @property
    def key(self) -> Key:
        return keys.content(self.id)

    def blob_keys(self) -> list[str]:
        """Every blob this content owns: deleting the content deletes these."""
        owned = (self.s3_key, self.media_key, self.thumbnail_key, self.captions_key)
        return [key for key in owned if key]

    def feed_keys(self) -> dict[str, str]:
        gsi1pk, gsi1sk = keys.feed_gsi1(self.family_id, self.created_at, self.id)
        return {"GSI1PK": gsi1pk, "GSI1SK": gsi1sk}

    def index_keys(self) -> Item:
        found: Item = dict(self.feed_keys()) if self.in_feed else {}
        found.update(_content_gsi2(self.id, self.status, self.ready_at or self.created_at))
        return found

    def extra_attributes(self) -> Item:
        return {reaction_attr(emoji): n for emoji, n in self.reactions.items()}

    @classmethod
    def derived_from(cls, item: Item) -> dict[str, Any]:
        return {
            "reactions": {
                name[len(REACTION_ATTR) :]: int(n)
                for name, n in item.items()
                if name.startswith(REACTION_ATTR) and int(n) > 0
            },
            "in_feed": "GSI1PK" in item,
        }

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


@dataclass(frozen=True)
class Comment(Record):
    content_id: str
    id: str
    author_id: str
    body: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.comment(self.content_id, self.created_at, self.id)


@dataclass(frozen=True)
class Reaction(Record):
    content_id: str
    emoji: str
    user_id: str
    created_at: str

    @property
    def key(self) -> Key:
        return keys.reaction(self.content_id, self.emoji, self.user_id)


@dataclass(frozen=True)
class Capsule(Record):
    id: str
    family_id: str
    creator_id: str
    title: str
    unlock_date: str
    status: str
    created_at: str
    recipient_ids: tuple[str, ...] = ()
    content_id: str | None = None
    notification_sent: bool = False
    unlocked_at: str | None = None
    viewed_at: str | None = None
    creator_told_empty: bool = False
    unlocking_at: str | None = None

    @property
    def key(self) -> Key:
        return keys.capsule(self.id)

    @functools.cached_property
    def _recipients(self) -> frozenset[str]:
        return frozenset(self.recipient_ids)

    def receives(self, person: str) -> bool:
        """Whether `person` is among the recipients: a set made once per record,
        as one record is asked for each of up to a thousand subscribers."""
        return person in self._recipients

    def index_keys(self, shards: int = 0) -> Item:
        gsi1pk, gsi1sk = keys.capsule_gsi1(self.creator_id, self.created_at, self.id)
        found: Item = {"GSI1PK": gsi1pk, "GSI1SK": gsi1sk}
        if shards and self.status in (CapsuleStatus.SCHEDULED, CapsuleStatus.LOCKED, CapsuleStatus.UNLOCKING):
            found["GSI2PK"], found["GSI2SK"] = keys.capsule_gsi2(self.unlock_date, self.id, shards)
        return found

    def to_item(self, shards: int = 0) -> Item:
        """The unlock index is sharded: its keys need the shard count."""
        item = super().to_item()
        item.update(self.index_keys(shards))
        return item


@dataclass(frozen=True)
class Recipient(Record):
    DERIVED: ClassVar[frozenset[str]] = frozenset({"visible"})

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

    def index_keys(self) -> Item:
        if not self.visible:
            return {}
        gsi1pk, gsi1sk = keys.recipient_gsi1(self.user_id, self.unlock_date, self.capsule_id)
        return {"GSI1PK": gsi1pk, "GSI1SK": gsi1sk}

    @classmethod
    def derived_from(cls, item: Item) -> dict[str, Any]:
        return {"visible": "GSI1PK" in item}


@dataclass(frozen=True)
class Notification(Record):
    RENAMED: ClassVar[Mapping[str, str]] = {"type": "notificationType"}

    user_id: str
    id: str
    type: str  # a store.enums.NotificationType
    created_at: str
    read: bool = False
    family_id: str | None = None
    content_id: str | None = None
    capsule_id: str | None = None
    # The addressee's epoch when it was written (`UnreadCounter.epoch`): once a
    # "mark everything read" moves the epoch past it, it is read whatever `read`
    # says. None on notifications written before unread counts existed.
    epoch: int | None = None
    # Still to be pushed to the addressee's devices: the note is the push
    # outbox item (GSI1) until the push worker settles it.
    push_pending: bool = False
    # The devices it has been pushed to so far (a send interrupted halfway goes
    # on with the others).
    pushed_to: tuple[str, ...] = ()

    DERIVED: ClassVar[frozenset[str]] = frozenset({"push_pending"})

    @property
    def key(self) -> Key:
        return keys.notification(self.user_id, self.created_at, self.id)

    def index_keys(self) -> Item:
        found: Item = {}
        if self.push_pending:
            gsi1pk, gsi1sk = keys.push_outbox_gsi1(self.created_at, self.user_id, self.id)
            found.update({"GSI1PK": gsi1pk, "GSI1SK": gsi1sk})
        # A capsule opening is the mailer's outbox item too. The unlock writes
        # it just before the capsule opens, so the mailer waits for the opening.
        if self.type == NotificationType.CAPSULE_UNLOCKED:
            gsi2pk, gsi2sk = keys.mail_outbox_gsi2(self.created_at, self.user_id, self.id)
            found.update({"GSI2PK": gsi2pk, "GSI2SK": gsi2sk})
        return found

    @classmethod
    def derived_from(cls, item: Item) -> dict[str, Any]:
        return {"push_pending": item.get("GSI1PK") == keys.PUSH_OUTBOX_PK}

    def read_in(self, epoch: int) -> bool:
        """Read by its own flag, or by a "mark everything read" since it was
        written. One written before counts existed was never counted: read."""
        return self.read or self.epoch is None or self.epoch < epoch


@dataclass(frozen=True)
class PushDevice(Record):
    """A browser or an app a person receives pushes on. Its id is derived from
    its endpoint or token, so registering the same one again finds it."""

    user_id: str
    id: str
    platform: str  # a store.enums.PushPlatform
    created_at: str
    updated_at: str
    name: str | None = None
    # WEB: the subscription, as the browser's PushSubscription.toJSON() gives it.
    endpoint: str | None = None
    p256dh: str | None = None
    auth: str | None = None
    # APNS, FCM: the app's device token, and its SNS platform endpoint.
    token: str | None = None
    sns_endpoint_arn: str | None = None
    last_pushed_at: str | None = None
    # The collapse topic of the last push (comments on one content) and when it
    # went: the next one of the same topic within a minute is not sent.
    last_topic: str | None = None
    last_topic_at: str | None = None
    # The last push tried: when, the push service's HTTP status (Web Push; none
    # through SNS or when nothing answered) and why it failed, if it did.
    last_delivery_at: str | None = None
    last_delivery_status: int | None = None
    last_delivery_error: str | None = None
    # When its push service said it is no more (410, a disabled SNS endpoint):
    # nothing is pushed to it until it is registered again.
    gone_at: str | None = None

    @property
    def key(self) -> Key:
        return keys.push_device(self.user_id, self.id)


@dataclass(frozen=True)
class PushDeviceCount(Record):
    """How many devices a person has: every add and removal moves it in the
    device's own transaction, so the limit holds under racing registrations."""

    user_id: str
    count: int = 0

    @property
    def key(self) -> Key:
        return keys.push_device_count(self.user_id)


@dataclass(frozen=True)
class UnreadCounter(Record):
    """One share of a person's unread count (`keys.UNREAD_SLOTS` of them). The
    shares are summed while they are at the same epoch; every change to one is
    conditioned on its epoch, so a count never mixes two epochs."""

    user_id: str
    slot: int
    epoch: int = 0
    unread: int = 0

    @property
    def key(self) -> Key:
        return keys.unread_counter(self.user_id, self.slot)

    def at_epoch(self) -> Condition:
        # A share nobody has written yet is at epoch 0.
        return eq("epoch", self.epoch) if self.epoch else any_of(NotExists(), eq("epoch", 0))

    def add(self, by: int) -> Update:
        """The count moved by `by`, while the share is still at this epoch; the
        item is made whole if this is its first write."""
        fields = {name: value for name, value in self.to_item().items() if name not in ("PK", "SK", "unread")}
        return Update(self.key, set=fields, add={"unread": by}, condition=self.at_epoch())


@dataclass(frozen=True)
class Tag(Record):
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

    def index_keys(self) -> Item:
        found: Item = {}
        if not self.private:
            found["GSI1PK"], found["GSI1SK"] = keys.tag_gsi1(
                self.family_id, self.normalized, self.content_id, self.author_id
            )
        found["GSI2PK"], found["GSI2SK"] = keys.tag_gsi2(self.author_id, self.normalized, self.content_id)
        return found


@dataclass(frozen=True)
class ContentWord(Record):
    """One word (folded and escaped as tags are) of a READY content's title or
    transcription: what `searchContent` finds it by."""

    content_id: str
    family_id: str
    word: str

    @property
    def key(self) -> Key:
        return keys.content_word(self.content_id, self.word)

    def index_keys(self) -> Item:
        pk, sk = keys.content_word_gsi1(self.family_id, self.word, self.content_id)
        return {"GSI1PK": pk, "GSI1SK": sk}


@dataclass(frozen=True)
class PersistedDocument(Record):
    """A document registered by automatic persisted queries; it lives until
    `expires_at` (Unix seconds, the table's TTL attribute) unless used again."""

    RENAMED: ClassVar[Mapping[str, str]] = {"expires_at": TTL_ATTRIBUTE}

    sha256: str
    body: str
    expires_at: int

    @property
    def key(self) -> Key:
        return keys.persisted_document(self.sha256)


@dataclass(frozen=True)
class AccountDeletion(Record):
    """An account deletion under way (`USER#<id>` / `DELETING`). The families
    are those the person belonged to when it was decided: once the memberships
    are gone, nothing else would lead back to them."""

    user_id: str
    started_at: str
    family_ids: tuple[str, ...] = ()
    # Who is working on it, and until when (the sweep takes it over afterwards).
    lease_until: str | None = None
    lease_owner: str | None = None
    # family id -> the MEMBER who becomes ADMIN there as the person leaves it.
    successors: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return keys.account_deletion(self.user_id)

    def index_keys(self) -> Item:
        gsi2pk, gsi2sk = keys.account_deletion_gsi2(self.started_at, self.user_id)
        return {"GSI2PK": gsi2pk, "GSI2SK": gsi2sk}


@dataclass(frozen=True)
class DataExport(Record):
    """A person's data export. `expires_at` (Unix seconds) is the table's TTL
    attribute, a day after `available_until`, so the expiry sweep deletes the
    file before DynamoDB deletes the item."""

    RENAMED: ClassVar[Mapping[str, str]] = {"expires_at": TTL_ATTRIBUTE}

    user_id: str
    id: str
    status: str  # a store.enums.ExportStatus
    requested_at: str
    expires_at: int
    # When the export goes (READY or FAILED): the download's end.
    available_until: str | None = None
    blob_key: str | None = None
    ready_at: str | None = None
    failure_reason: str | None = None

    @property
    def key(self) -> Key:
        return keys.data_export(self.user_id, self.id)

    def index_keys(self) -> Item:
        if self.status == ExportStatus.PENDING:
            gsi2pk, gsi2sk = keys.export_pending_gsi2(self.requested_at, self.id)
        else:
            gsi2pk, gsi2sk = keys.export_expiry_gsi2(self.available_until or self.requested_at, self.id)
        return {"GSI2PK": gsi2pk, "GSI2SK": gsi2sk}


@dataclass(frozen=True)
class DigestMarker(Record):
    """One person's digest for the period ending at `period_end`: written with
    a condition before the digest is sent, so it goes out once whatever the
    number of processes. `expires_at` (Unix seconds) is the table's TTL."""

    RENAMED: ClassVar[Mapping[str, str]] = {"expires_at": TTL_ATTRIBUTE}

    user_id: str
    period_end: str
    kind: str  # a store.enums.EmailPreference among DIGESTS
    since: str
    state: str  # a store.enums.MailState
    expires_at: int
    lease_until: str | None = None
    lease_owner: str | None = None
    attempts: int = 0

    @property
    def key(self) -> Key:
        return keys.digest_marker(self.user_id, self.period_end)


@dataclass(frozen=True)
class IdempotentRequest(Record):
    """A mutation sent with an Idempotency-Key, for 24 hours (`expires_at`,
    the table's TTL attribute). `state`: RUNNING while an attempt runs it;
    COMMITTED once its write landed (written in the write's own transaction
    where there is one); DONE with the `result` to answer retries with."""

    RENAMED: ClassVar[Mapping[str, str]] = {"expires_at": TTL_ATTRIBUTE}

    user_id: str
    idempotency_key: str
    request: str  # SHA-256 of the operation and its variables
    attempt: str  # the attempt running it (a takeover changes it)
    state: str
    started_at: float  # Unix seconds, when the current attempt began
    expires_at: int
    result: str | None = None  # the answer, as JSON

    @property
    def key(self) -> Key:
        return keys.idempotency(self.user_id, self.idempotency_key)
