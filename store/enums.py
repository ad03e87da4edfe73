"""The closed sets of values records hold: roles, trust levels, kinds and
states. `schema/enums.py` builds the GraphQL enums from these, so a value is
written once."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    ADMIN = "ADMIN"
    MEMBER = "MEMBER"
    PENDING = "PENDING"


class TrustLevel(StrEnum):
    OPEN = "OPEN"
    VOUCHED = "VOUCHED"
    CLOSED = "CLOSED"


class PostingPolicy(StrEnum):
    """Who may post (create uploads) in a family: a setting its ADMINs change."""

    EVERYONE = "EVERYONE"
    ADMINS = "ADMINS"


class FamilyEventType(StrEnum):
    """What the admins' record of a family lists, one entry per change."""

    ROLE_CHANGED = "ROLE_CHANGED"
    MEMBER_JOINED = "MEMBER_JOINED"
    MEMBER_APPROVED = "MEMBER_APPROVED"
    MEMBER_REMOVED = "MEMBER_REMOVED"
    MEMBER_LEFT = "MEMBER_LEFT"
    INVITE_CREATED = "INVITE_CREATED"
    INVITE_REVOKED = "INVITE_REVOKED"
    INVITE_CODE_ROTATED = "INVITE_CODE_ROTATED"
    SETTINGS_CHANGED = "SETTINGS_CHANGED"


class ContentType(StrEnum):
    VIDEO = "VIDEO"
    AUDIO = "AUDIO"
    PHOTO = "PHOTO"
    TEXT = "TEXT"


class ContentStatus(StrEnum):
    UPLOADING = "UPLOADING"
    PROCESSING = "PROCESSING"
    TRANSCODING = "TRANSCODING"
    TRANSCRIBING = "TRANSCRIBING"
    READY = "READY"
    DELIVERED = "DELIVERED"
    ARCHIVED = "ARCHIVED"
    FAILED = "FAILED"


class CapsuleStatus(StrEnum):
    DRAFT = "DRAFT"
    SCHEDULED = "SCHEDULED"
    LOCKED = "LOCKED"
    UNLOCKING = "UNLOCKING"
    AVAILABLE = "AVAILABLE"
    VIEWED = "VIEWED"
    ARCHIVED = "ARCHIVED"
    CANCELLED = "CANCELLED"


class NotificationType(StrEnum):
    CAPSULE_UNLOCKED = "CAPSULE_UNLOCKED"
    NEW_CONTENT = "NEW_CONTENT"
    NEW_COMMENT = "NEW_COMMENT"
    MEMBER_JOINED = "MEMBER_JOINED"
    MEMBER_PENDING = "MEMBER_PENDING"
    CAPSULE_EMPTY = "CAPSULE_EMPTY"


# What is pushed to a person's devices until they choose otherwise.
DEFAULT_PUSH_TYPES = (
    NotificationType.CAPSULE_UNLOCKED,
    NotificationType.NEW_COMMENT,
    NotificationType.NEW_CONTENT,
    NotificationType.MEMBER_PENDING,
)


class PushPlatform(StrEnum):
    """Where a device receives pushes: a browser (Web Push), or an app through
    Amazon SNS mobile push (APNs, FCM)."""

    WEB = "WEB"
    APNS = "APNS"
    FCM = "FCM"


class ExportStatus(StrEnum):
    PENDING = "PENDING"
    READY = "READY"
    FAILED = "FAILED"


class EmailPreference(StrEnum):
    """What a person receives by email: nothing, a mail per capsule
    opened for them, or a digest of their families' activity per period."""

    NONE = "NONE"
    CAPSULES = "CAPSULES"
    DAILY = "DAILY"
    WEEKLY = "WEEKLY"


DIGESTS = (EmailPreference.DAILY, EmailPreference.WEEKLY)


class MailState(StrEnum):
    """One email's progress (a capsule opening's, on its notification; a
    digest's, on its marker)."""

    SENDING = "SENDING"  # claimed under a lease; sent or not, nobody knows yet
    SENT = "SENT"
    SKIPPED = "SKIPPED"  # nothing to send: the person chose otherwise, or has no address
    FAILED = "FAILED"
