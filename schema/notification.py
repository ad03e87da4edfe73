from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import strawberry

from resolvers.core.errors import NotFound
from resolvers.domain import capsules, families
from resolvers.domain import content as content_resolvers
from schema.capsule import Capsule
from schema.common import Info, PageInfo, when
from schema.content import Content
from schema.enums import NotificationType
from store import items

if TYPE_CHECKING:
    from schema.family import Family


@strawberry.type
class Notification:
    item: strawberry.Private[items.Notification]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    def type(self) -> NotificationType:
        return NotificationType(self.item.type)

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)

    @strawberry.field
    def read(self) -> bool:
        return self.item.read

    # Each link is checked against the viewer's rights now: a notification
    # never opens a door that has since closed (or is not yet open).

    @strawberry.field
    async def family(self, info: Info) -> Annotated[Family, strawberry.lazy("schema.family")] | None:
        from schema.family import Family

        if self.item.family_id is None:
            return None
        try:
            family, _ = await families.visible_family(info.context, self.item.family_id)
        except NotFound:
            return None
        return Family(item=family)

    @strawberry.field
    async def content(self, info: Info) -> Content | None:
        if self.item.content_id is None:
            return None
        try:
            found, _ = await content_resolvers.readable_content(info.context, self.item.content_id)
        except NotFound:
            return None
        return Content(item=found)

    @strawberry.field
    async def capsule(self, info: Info) -> Capsule | None:
        if self.item.capsule_id is None:
            return None
        try:
            return Capsule(item=await capsules.visible_capsule(info.context, self.item.capsule_id))
        except NotFound:
            return None


@strawberry.type
class NotificationEdge:
    cursor: str
    node: Notification


@strawberry.type
class NotificationConnection:
    edges: list[NotificationEdge]
    page_info: PageInfo
