"""The GraphQL enums, their values taken from `store.enums` (one place for each
value; tests/test_schema_contract.py checks the two sets agree)."""

from __future__ import annotations

from enum import Enum

import strawberry

from store import enums as store_enums


@strawberry.enum
class FamilyRole(Enum):
    ADMIN = store_enums.Role.ADMIN.value
    MEMBER = store_enums.Role.MEMBER.value
    PENDING = store_enums.Role.PENDING.value


@strawberry.enum(description="How a person holding the invite code gets in.")
class TrustLevel(Enum):
    OPEN = strawberry.enum_value(store_enums.TrustLevel.OPEN.value, description="joins as MEMBER at once")
    VOUCHED = strawberry.enum_value(
        store_enums.TrustLevel.VOUCHED.value,
        description="joins as PENDING; becomes MEMBER when the vouch score of members reaches "
        "the family's threshold",
    )
    CLOSED = strawberry.enum_value(
        store_enums.TrustLevel.CLOSED.value, description="joins as PENDING; only an ADMIN can approve"
    )


@strawberry.enum(description="Who may post (create uploads) in a family; its ADMINs choose.")
class PostingPolicy(Enum):
    EVERYONE = strawberry.enum_value(
        store_enums.PostingPolicy.EVERYONE.value, description="every MEMBER and ADMIN (the default)"
    )
    ADMINS = strawberry.enum_value(store_enums.PostingPolicy.ADMINS.value, description="ADMINs only")


@strawberry.enum(description="What an entry of a family's admins' record (Family.activity) says happened.")
class FamilyEventType(Enum):
    ROLE_CHANGED = strawberry.enum_value(
        store_enums.FamilyEventType.ROLE_CHANGED.value, description="subject became the role in detail"
    )
    MEMBER_JOINED = strawberry.enum_value(
        store_enums.FamilyEventType.MEMBER_JOINED.value, description="subject joined (detail: with what code)"
    )
    MEMBER_APPROVED = strawberry.enum_value(
        store_enums.FamilyEventType.MEMBER_APPROVED.value,
        description="actor let subject in (PENDING -> MEMBER)",
    )
    MEMBER_REMOVED = strawberry.enum_value(
        store_enums.FamilyEventType.MEMBER_REMOVED.value, description="actor removed subject"
    )
    MEMBER_LEFT = strawberry.enum_value(
        store_enums.FamilyEventType.MEMBER_LEFT.value, description="subject left (or deleted their account)"
    )
    INVITE_CREATED = strawberry.enum_value(
        store_enums.FamilyEventType.INVITE_CREATED.value, description="actor created the invite in detail"
    )
    INVITE_REVOKED = strawberry.enum_value(
        store_enums.FamilyEventType.INVITE_REVOKED.value, description="actor revoked the invite in detail"
    )
    INVITE_CODE_ROTATED = strawberry.enum_value(
        store_enums.FamilyEventType.INVITE_CODE_ROTATED.value, description="actor drew a new family code"
    )
    SETTINGS_CHANGED = strawberry.enum_value(
        store_enums.FamilyEventType.SETTINGS_CHANGED.value, description="actor changed the settings in detail"
    )


@strawberry.enum
class ContentType(Enum):
    VIDEO = store_enums.ContentType.VIDEO.value
    AUDIO = store_enums.ContentType.AUDIO.value
    PHOTO = store_enums.ContentType.PHOTO.value
    TEXT = store_enums.ContentType.TEXT.value


@strawberry.enum
class ContentStatus(Enum):
    UPLOADING = store_enums.ContentStatus.UPLOADING.value
    PROCESSING = store_enums.ContentStatus.PROCESSING.value
    TRANSCODING = store_enums.ContentStatus.TRANSCODING.value
    TRANSCRIBING = store_enums.ContentStatus.TRANSCRIBING.value
    READY = store_enums.ContentStatus.READY.value
    DELIVERED = store_enums.ContentStatus.DELIVERED.value
    ARCHIVED = store_enums.ContentStatus.ARCHIVED.value
    FAILED = store_enums.ContentStatus.FAILED.value


@strawberry.enum
class CapsuleStatus(Enum):
    DRAFT = store_enums.CapsuleStatus.DRAFT.value
    SCHEDULED = store_enums.CapsuleStatus.SCHEDULED.value
    LOCKED = store_enums.CapsuleStatus.LOCKED.value
    UNLOCKING = store_enums.CapsuleStatus.UNLOCKING.value
    AVAILABLE = store_enums.CapsuleStatus.AVAILABLE.value
    VIEWED = store_enums.CapsuleStatus.VIEWED.value
    ARCHIVED = store_enums.CapsuleStatus.ARCHIVED.value
    CANCELLED = store_enums.CapsuleStatus.CANCELLED.value


@strawberry.enum
class NotificationType(Enum):
    CAPSULE_UNLOCKED = store_enums.NotificationType.CAPSULE_UNLOCKED.value
    NEW_CONTENT = store_enums.NotificationType.NEW_CONTENT.value
    NEW_COMMENT = store_enums.NotificationType.NEW_COMMENT.value
    MEMBER_JOINED = store_enums.NotificationType.MEMBER_JOINED.value
    MEMBER_PENDING = store_enums.NotificationType.MEMBER_PENDING.value
    CAPSULE_EMPTY = strawberry.enum_value(
        store_enums.NotificationType.CAPSULE_EMPTY.value,
        description="to a capsule's creator: its date came with no content, so it stays closed",
    )


@strawberry.enum(description="Where a data export is: being built, ready to download, or failed.")
class DataExportStatus(Enum):
    PENDING = store_enums.ExportStatus.PENDING.value
    READY = store_enums.ExportStatus.READY.value
    FAILED = store_enums.ExportStatus.FAILED.value


@strawberry.enum(description="What a person receives by email (MIFAMILIAS_SMTP_URL must be set).")
class EmailPreference(Enum):
    NONE = strawberry.enum_value(store_enums.EmailPreference.NONE.value, description="no email")
    CAPSULES = strawberry.enum_value(
        store_enums.EmailPreference.CAPSULES.value,
        description="one email when a time capsule opens for this person",
    )
    DAILY = strawberry.enum_value(
        store_enums.EmailPreference.DAILY.value,
        description="a digest of the families' new activity each day (UTC), when there is some",
    )
    WEEKLY = strawberry.enum_value(
        store_enums.EmailPreference.WEEKLY.value,
        description="a digest of the families' new activity each week (from Monday, UTC), when there is some",
    )


@strawberry.enum(description="Where a device receives pushes.")
class PushPlatform(Enum):
    WEB = strawberry.enum_value(store_enums.PushPlatform.WEB.value, description="a browser, by Web Push")
    APNS = strawberry.enum_value(
        store_enums.PushPlatform.APNS.value, description="an iOS app, by APNs through Amazon SNS"
    )
    FCM = strawberry.enum_value(
        store_enums.PushPlatform.FCM.value, description="an Android app, by FCM through Amazon SNS"
    )
