from __future__ import annotations

from datetime import datetime

import strawberry

from resolvers.domain import users
from schema.common import Info, when
from schema.enums import EmailPreference, NotificationType
from store import items


@strawberry.type
class User:
    item: strawberry.Private[items.User]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field(description="null unless the viewer is this user")
    async def email(self, info: Info) -> str | None:
        return users.email_for_viewer(info.context, self.item)

    @strawberry.field
    def given_name(self) -> str | None:
        return self.item.given_name

    @strawberry.field
    def family_name(self) -> str | None:
        return self.item.family_name

    @strawberry.field
    def profile_image_url(self) -> str | None:
        return self.item.profile_image_url

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)

    @strawberry.field
    def onboarding_complete(self) -> bool:
        return self.item.onboarding_complete

    @strawberry.field(description="null unless the viewer is this user; NONE until they choose")
    def email_preference(self, info: Info) -> EmailPreference | None:
        chosen = users.email_preference_for_viewer(info.context, self.item)
        return EmailPreference(chosen) if chosen is not None else None

    @strawberry.field(
        description="null unless the viewer is this user; which kinds of notification are pushed "
        "to their devices"
    )
    def push_types(self, info: Info) -> list[NotificationType] | None:
        chosen = users.push_types_for_viewer(info.context, self.item)
        return [NotificationType(kind) for kind in chosen] if chosen is not None else None
