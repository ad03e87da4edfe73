from __future__ import annotations

from datetime import datetime

import strawberry

from resolvers.core.errors import BadInput
from resolvers.domain import accounts, capsules, exports, families, notifications, push, users
from resolvers.domain import content as content_resolvers
from resolvers.domain import tags as tag_resolvers
from schema.account import DataExport
from schema.capsule import Capsule
from schema.common import Info
from schema.content import Comment, Content, Upload
from schema.enums import ContentType, EmailPreference, FamilyRole, NotificationType, PostingPolicy, TrustLevel
from schema.family import Family, FamilyMember, Invite
from schema.push import PushDevice, RegisterPushDeviceInput
from schema.tag import Tag
from schema.user import User


@strawberry.input
class UpdateProfileInput:
    given_name: str | None = None
    family_name: str | None = None
    profile_image_url: str | None = None
    email_preference: EmailPreference | None = strawberry.field(
        default=None, description="what to receive by email, at the user's own email address"
    )
    push_types: list[NotificationType] | None = strawberry.field(
        default=None, description="which kinds of notification are pushed to the user's devices"
    )


@strawberry.input
class CreateFamilyInput:
    name: str
    trust_level: TrustLevel = TrustLevel.OPEN
    vouch_threshold: int = 2


@strawberry.input
class CreateUploadInput:
    family_id: strawberry.ID
    type: ContentType
    mime_type: str = strawberry.field(description="the MIME type of the bytes, e.g. video/mp4")
    size_bytes: int
    title: str | None = None
    capsule_id: strawberry.ID | None = strawberry.field(
        default=None,
        description="set when the content is what a capsule wraps; it then stays out of the feed until "
        "the capsule unlocks",
    )


@strawberry.input
class CreateCapsuleInput:
    family_id: strawberry.ID
    title: str
    unlock_date: datetime
    recipient_ids: list[strawberry.ID] = strawberry.field(
        description="members of the family; the creator may be among them"
    )


@strawberry.input
class CreateInviteInput:
    family_id: strawberry.ID
    max_uses: int | None = strawberry.field(default=None, description="null: no limit (at most 1000)")
    expires_at: datetime | None = strawberry.field(default=None, description="null: never (at most a year)")
    email: str | None = strawberry.field(
        default=None, description="emailed the code and a link when MIFAMILIAS_SMTP_URL is set"
    )


@strawberry.input
class UpdateFamilySettingsInput:
    family_id: strawberry.ID
    posting_policy: PostingPolicy | None = strawberry.field(default=None, description="null: unchanged")
    invite_code_enabled: bool | None = strawberry.field(
        default=None,
        description="false: the family's own code admits nobody (invites still do); null: unchanged",
    )


@strawberry.input
class SuccessorInput:
    family_id: strawberry.ID
    user_id: strawberry.ID = strawberry.field(description="a current MEMBER, who becomes ADMIN")


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def update_profile(self, info: Info, input: UpdateProfileInput) -> User:
        return User(
            item=await users.update_profile(
                info.context,
                given_name=input.given_name,
                family_name=input.family_name,
                profile_image_url=input.profile_image_url,
                email_preference=input.email_preference.name if input.email_preference else None,
                push_types=[t.value for t in input.push_types] if input.push_types is not None else None,
            )
        )

    @strawberry.mutation
    async def complete_onboarding(self, info: Info) -> User:
        return User(item=await users.complete_onboarding(info.context))

    @strawberry.mutation
    async def create_family(self, info: Info, input: CreateFamilyInput) -> Family:
        family = await families.create_family(
            info.context, input.name, input.trust_level.name, input.vouch_threshold
        )
        return Family(item=family)

    @strawberry.mutation(description="ADMIN only: a new code; the old one stops working")
    async def rotate_invite_code(self, info: Info, family_id: strawberry.ID) -> Family:
        return Family(item=await families.rotate_invite_code(info.context, str(family_id)))

    @strawberry.mutation
    async def join_family(self, info: Info, invite_code: str) -> FamilyMember:
        return FamilyMember(item=await families.join_family(info.context, invite_code))

    @strawberry.mutation(
        description="a MEMBER or ADMIN adds one vouch point to a PENDING member (once per voucher)"
    )
    async def vouch(self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID) -> FamilyMember:
        return FamilyMember(item=await families.vouch(info.context, str(family_id), str(user_id)))

    @strawberry.mutation(description="ADMIN only: PENDING -> MEMBER")
    async def approve_member(
        self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID
    ) -> FamilyMember:
        return FamilyMember(item=await families.approve_member(info.context, str(family_id), str(user_id)))

    @strawberry.mutation(description="ADMIN only; the last ADMIN cannot be removed")
    async def remove_member(self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID) -> bool:
        return await families.remove_member(info.context, str(family_id), str(user_id))

    @strawberry.mutation(
        description="the last ADMIN of a family with other members names a successor (a current MEMBER), "
        "who becomes ADMIN in the same write; without one, CONFLICT"
    )
    async def leave_family(
        self, info: Info, family_id: strawberry.ID, successor_id: strawberry.ID | None = None
    ) -> bool:
        return await families.leave_family(
            info.context, str(family_id), str(successor_id) if successor_id is not None else None
        )

    @strawberry.mutation(
        description="ADMIN only: makes a MEMBER an ADMIN, or an ADMIN a MEMBER; the family always keeps "
        "an ADMIN (CONFLICT otherwise)"
    )
    async def set_member_role(
        self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID, role: FamilyRole
    ) -> FamilyMember:
        return FamilyMember(
            item=await families.set_member_role(info.context, str(family_id), str(user_id), role.value)
        )

    @strawberry.mutation(description="ADMIN only: a new code with limits; joinFamily takes it")
    async def create_invite(self, info: Info, input: CreateInviteInput) -> Invite:
        invite = await families.create_invite(
            info.context,
            str(input.family_id),
            max_uses=input.max_uses,
            expires_at=input.expires_at,
            email=input.email,
        )
        return Invite(item=invite)

    @strawberry.mutation(description="ADMIN only: the invite admits nobody from now on; idempotent")
    async def revoke_invite(self, info: Info, id: strawberry.ID) -> bool:
        await families.revoke_invite(info.context, str(id))
        return True

    @strawberry.mutation(description="ADMIN only: who may post, and whether the family's own code works")
    async def update_family_settings(self, info: Info, input: UpdateFamilySettingsInput) -> Family:
        family = await families.update_settings(
            info.context,
            str(input.family_id),
            posting_policy=input.posting_policy.name if input.posting_policy is not None else None,
            invite_code_enabled=input.invite_code_enabled,
        )
        return Family(item=family)

    @strawberry.mutation(description="creates the Content in UPLOADING and returns where to send the bytes")
    async def create_upload(self, info: Info, input: CreateUploadInput) -> Upload:
        target = await content_resolvers.create_upload(
            info.context,
            family_id=str(input.family_id),
            content_type=input.type.value,
            mime_type=input.mime_type,
            size_bytes=input.size_bytes,
            title=input.title,
            capsule_id=str(input.capsule_id) if input.capsule_id is not None else None,
        )
        return Upload.of(target)

    @strawberry.mutation(
        description="the author, while UPLOADING: which parts have arrived and fresh URLs for the "
        "rest (a fresh uploadUrl for one PUT); an upload in parts left for 2 days starts again"
    )
    async def resume_upload(self, info: Info, content_id: strawberry.ID) -> Upload:
        return Upload.of(await content_resolvers.resume_upload(info.context, str(content_id)))

    @strawberry.mutation(
        description="UPLOADING -> PROCESSING once the bytes are there; BAD_USER_INPUT if they are not"
    )
    async def complete_upload(self, info: Info, content_id: strawberry.ID) -> Content:
        return Content(item=await content_resolvers.complete_upload(info.context, str(content_id)))

    @strawberry.mutation(
        description="FAILED -> PROCESSING; READY whose transcription failed -> TRANSCRIBING (that step again)"
    )
    async def retry_content(self, info: Info, content_id: strawberry.ID) -> Content:
        return Content(item=await content_resolvers.retry_content(info.context, str(content_id)))

    @strawberry.mutation(description="ARCHIVED -> READY")
    async def restore_content(self, info: Info, content_id: strawberry.ID) -> Content:
        return Content(item=await content_resolvers.restore_content(info.context, str(content_id)))

    @strawberry.mutation(
        description="READY -> DELIVERED when someone other than the author views it; otherwise unchanged"
    )
    async def mark_content_viewed(self, info: Info, content_id: strawberry.ID) -> Content:
        return Content(item=await content_resolvers.mark_viewed(info.context, str(content_id)))

    @strawberry.mutation
    async def delete_content(self, info: Info, content_id: strawberry.ID) -> bool:
        return await content_resolvers.delete_content(info.context, str(content_id))

    @strawberry.mutation
    async def add_comment(self, info: Info, content_id: strawberry.ID, body: str) -> Comment:
        return Comment(item=await content_resolvers.add_comment(info.context, str(content_id), body))

    @strawberry.mutation
    async def delete_comment(self, info: Info, content_id: strawberry.ID, comment_id: strawberry.ID) -> bool:
        return await content_resolvers.delete_comment(info.context, str(content_id), str(comment_id))

    @strawberry.mutation(description="idempotent: reacting twice with the same emoji counts once")
    async def add_reaction(self, info: Info, content_id: strawberry.ID, emoji: str) -> Content:
        return Content(item=await content_resolvers.add_reaction(info.context, str(content_id), emoji))

    @strawberry.mutation
    async def remove_reaction(self, info: Info, content_id: strawberry.ID, emoji: str) -> Content:
        return Content(item=await content_resolvers.remove_reaction(info.context, str(content_id), emoji))

    @strawberry.mutation
    async def create_capsule(self, info: Info, input: CreateCapsuleInput) -> Capsule:
        capsule = await capsules.create_capsule(
            info.context,
            str(input.family_id),
            input.title,
            input.unlock_date,
            [str(r) for r in input.recipient_ids],
        )
        return Capsule(item=capsule)

    @strawberry.mutation(description="DRAFT -> SCHEDULED")
    async def schedule_capsule(self, info: Info, capsule_id: strawberry.ID) -> Capsule:
        return Capsule(item=await capsules.schedule_capsule(info.context, str(capsule_id)))

    @strawberry.mutation(description="DRAFT or SCHEDULED -> CANCELLED; CONFLICT once LOCKED")
    async def cancel_capsule(self, info: Info, capsule_id: strawberry.ID) -> Capsule:
        return Capsule(item=await capsules.cancel_capsule(info.context, str(capsule_id)))

    @strawberry.mutation(
        description="a recipient opens an AVAILABLE capsule: AVAILABLE -> VIEWED (first open)"
    )
    async def open_capsule(self, info: Info, capsule_id: strawberry.ID) -> Capsule:
        return Capsule(item=await capsules.open_capsule(info.context, str(capsule_id)))

    @strawberry.mutation(
        description="marks the given notifications read, or all of the viewer's when ids is null; "
        "returns how many changed (were unread just before); ids that name nothing of the viewer's "
        "change nothing"
    )
    async def mark_notifications_read(self, info: Info, ids: list[strawberry.ID] | None = None) -> int:
        return await notifications.mark_read(info.context, None if ids is None else [str(i) for i in ids])

    @strawberry.mutation(
        description="a browser's Web Push subscription (WEB: endpoint, p256dh, auth) or an app's "
        "device token (APNS, FCM: token); the same endpoint or token again updates its device. At "
        "most 20 devices a person: a 21st takes the place of the one registered or refreshed "
        "longest ago"
    )
    async def register_push_device(self, info: Info, input: RegisterPushDeviceInput) -> PushDevice:
        given = push.DeviceInput(
            platform=str(input.platform.value),
            endpoint=input.endpoint,
            p256dh=input.p256dh,
            auth=input.auth,
            token=input.token,
            name=input.name,
        )
        return PushDevice(item=await push.register(info.context, given))

    @strawberry.mutation(description="false when the id names no device of the viewer's")
    async def unregister_push_device(self, info: Info, id: strawberry.ID) -> bool:
        return await push.unregister(info.context, str(id))

    @strawberry.mutation(
        description="nothing of the family is pushed to the viewer until `until`; null (or a past "
        "moment) unmutes. Notifications are still written and listed"
    )
    async def mute_family(self, info: Info, family_id: strawberry.ID, until: datetime | None = None) -> bool:
        return await push.mute_family(info.context, str(family_id), until)

    @strawberry.mutation(
        description="replaces the viewer's tags on one content (at most 10 values); "
        "private tags are visible to their author alone"
    )
    async def set_tags(
        self,
        info: Info,
        content_id: strawberry.ID,
        values: list[str],
        set_name: str | None = None,
        private: bool | None = False,
    ) -> list[Tag]:
        content, written = await tag_resolvers.set_tags(
            info.context, str(content_id), values, set_name, bool(private)
        )
        return [Tag(item=tag, content_item=content) for tag in written]

    @strawberry.mutation(
        description="starts building a zip of the viewer's data (DataExport.status PENDING); at most 3 a day"
    )
    async def request_data_export(self, info: Info) -> DataExport:
        return DataExport(item=await exports.request_export(info.context))

    @strawberry.mutation(
        description="deletes the viewer's account and what they put in (see the README); "
        "CONFLICT while they are the last ADMIN of a family with other members, unless `successors` "
        "names a MEMBER of that family to become its ADMIN. Idempotent"
    )
    async def delete_my_account(self, info: Info, successors: list[SuccessorInput] | None = None) -> bool:
        named: dict[str, str] = {}
        for successor in successors or []:
            if str(successor.family_id) in named:
                raise BadInput("successors name one person per family")
            named[str(successor.family_id)] = str(successor.user_id)
        return await accounts.delete_my_account(info.context, named)
