from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import strawberry

from resolvers.domain import capsules, users
from schema.common import Edge, Info, PageInfo, maybe_when, when
from schema.content import Content
from schema.enums import CapsuleStatus
from schema.user import User
from store import items

if TYPE_CHECKING:
    from schema.family import Family


@strawberry.type
class Recipient:
    item: strawberry.Private[items.Recipient]

    @strawberry.field
    async def user(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.user_id))

    @strawberry.field
    def notified_at(self) -> datetime | None:
        return maybe_when(self.item.notified_at)

    @strawberry.field
    def viewed_at(self) -> datetime | None:
        return maybe_when(self.item.viewed_at)


@strawberry.type
class Capsule:
    item: strawberry.Private[items.Capsule]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    async def family(self, info: Info) -> Annotated[Family, strawberry.lazy("schema.family")]:
        from schema.family import family_of

        return await family_of(info, self.item.family_id)

    @strawberry.field
    async def creator(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.creator_id))

    @strawberry.field
    def title(self) -> str:
        return self.item.title

    @strawberry.field
    def unlock_date(self) -> datetime:
        return when(self.item.unlock_date)

    @strawberry.field
    def status(self) -> CapsuleStatus:
        return CapsuleStatus(self.item.status)

    @strawberry.field
    def notification_sent(self) -> bool:
        return self.item.notification_sent

    @strawberry.field(
        description="the recipients in the order the creator chose them, `first` (at most 100) "
        "at a time after the recipient whose user id is `after`"
    )
    async def recipients(
        self, info: Info, first: int = capsules.RECIPIENT_PAGE, after: strawberry.ID | None = None
    ) -> list[Recipient]:
        found = await capsules.recipients(info.context, self.item, first, str(after) if after else None)
        return [Recipient(item=r) for r in found]

    @strawberry.field(description="null for everyone but the creator until the capsule is AVAILABLE")
    async def content(self, info: Info) -> Content | None:
        found = await capsules.capsule_content(info.context, self.item)
        return Content(item=found) if found else None


@strawberry.type
class CapsuleEdge(Edge):
    node: Capsule


@strawberry.type
class CapsuleConnection:
    edges: list[CapsuleEdge]
    page_info: PageInfo


@strawberry.type
class CapsuleUnlockedEvent:
    id: strawberry.ID = strawberry.field(
        description="stable event id, the same on every process and after a restart: "
        "pass it as `after` to resume the stream"
    )
    capsule: Capsule
    unlocked_at: datetime
    # Whom this event's answer can be shared with (schema.multiplex).
    share: strawberry.Private[tuple[Any, ...] | None] = None


def capsule_connection(page: capsules.CapsulePage) -> CapsuleConnection:
    return CapsuleConnection(
        edges=[
            CapsuleEdge(position=cursor, node=Capsule(item=capsule))
            for capsule, cursor in zip(page.capsules, page.cursors, strict=True)
        ],
        page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
    )
