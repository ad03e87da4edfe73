from __future__ import annotations

from enum import Enum

import strawberry


@strawberry.enum
class FamilyRole(Enum):
    ADMIN = "ADMIN"
    MEMBER = "MEMBER"
    PENDING = "PENDING"


@strawberry.enum(description="How a person holding the invite code gets in.")
class TrustLevel(Enum):
    OPEN = strawberry.enum_value("OPEN", description="joins as MEMBER at once")
    VOUCHED = strawberry.enum_value(
        "VOUCHED",
        description="joins as PENDING; becomes MEMBER when the vouch score of members reaches "
        "the family's threshold",
    )
    CLOSED = strawberry.enum_value("CLOSED", description="joins as PENDING; only an ADMIN can approve")


@strawberry.enum
class ContentType(Enum):
    VIDEO = "VIDEO"
    AUDIO = "AUDIO"
    PHOTO = "PHOTO"
    TEXT = "TEXT"


@strawberry.enum
class ContentStatus(Enum):
    UPLOADING = "UPLOADING"
    PROCESSING = "PROCESSING"
    TRANSCODING = "TRANSCODING"
    TRANSCRIBING = "TRANSCRIBING"
    READY = "READY"
    DELIVERED = "DELIVERED"
    ARCHIVED = "ARCHIVED"
    FAILED = "FAILED"


@strawberry.enum
class CapsuleStatus(Enum):
    DRAFT = "DRAFT"
    SCHEDULED = "SCHEDULED"
    LOCKED = "LOCKED"
    UNLOCKING = "UNLOCKING"
    AVAILABLE = "AVAILABLE"
    VIEWED = "VIEWED"
    ARCHIVED = "ARCHIVED"
    CANCELLED = "CANCELLED"


@strawberry.enum
class NotificationType(Enum):
    CAPSULE_UNLOCKED = "CAPSULE_UNLOCKED"
    NEW_CONTENT = "NEW_CONTENT"
    NEW_COMMENT = "NEW_COMMENT"
    MEMBER_JOINED = "MEMBER_JOINED"
    MEMBER_PENDING = "MEMBER_PENDING"
    CAPSULE_EMPTY = strawberry.enum_value(
        "CAPSULE_EMPTY",
        description="to a capsule's creator: its date came with no content, so it stays closed",
    )
