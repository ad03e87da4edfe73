from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import strawberry

from resolvers.core.context import Context
from resolvers.core.errors import NotFound
from resolvers.core.pagination import ItemPage
from resolvers.domain import capsules, families, notifications
from resolvers.domain import content as content_resolvers
from schema.capsule import Capsule
from schema.common import Edge, Info, PageInfo, when
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
        # It names the note's key and epoch: marking it read reads nothing first.
        return strawberry.ID(notifications.public_id(self.item))

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
class NotificationEdge(Edge):
    node: Notification


class NotificationPage:
    """The page, read once and only if `edges` or `pageInfo` is asked for: a
    client that asks for `unreadCount` alone costs one batch get."""

    def __init__(self, ctx: Context, first: int, after: str | None, unread_only: bool) -> None:
        self.ctx = ctx
        self.first = first
        self.after = after
        self.unread_only = unread_only
        self._page: asyncio.Task[ItemPage] | None = None

    async def get(self) -> ItemPage:
        if self._page is None:
            self._page = asyncio.ensure_future(
                notifications.notifications_page(self.ctx, self.first, self.after, self.unread_only)
            )
        return await asyncio.shield(self._page)


@strawberry.type
class NotificationConnection:
    source: strawberry.Private[NotificationPage]

    @strawberry.field
    async def edges(self) -> list[NotificationEdge]:
        page = await self.source.get()
        return [
            NotificationEdge(position=cursor, node=Notification(item=items.Notification.from_item(item)))
            for item, cursor in zip(page.items, page.cursors, strict=True)
        ]

    @strawberry.field
    async def page_info(self) -> PageInfo:
        page = await self.source.get()
        return PageInfo(has_next_page=page.has_next, end=page.end_cursor)

    @strawberry.field(
        description="how many of the viewer's notifications are unread, whatever this page holds "
        "(what notifications(unreadOnly: true) lists, to its end)"
    )
    async def unread_count(self, info: Info) -> int:
        return await notifications.unread_count(info.context)
