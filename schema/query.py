from __future__ import annotations

from datetime import UTC, datetime

import strawberry

from resolvers.core.pagination import page_size
from resolvers.domain import capsules, exports, families, push, users
from resolvers.domain import content as content_resolvers
from resolvers.domain import tags as tag_resolvers
from schema.account import DataExport
from schema.capsule import Capsule, CapsuleConnection, capsule_connection
from schema.common import Info
from schema.content import Content, ContentConnection, search_connection
from schema.cost import charged
from schema.family import Family, FamilyMember
from schema.notification import NotificationConnection, NotificationPage
from schema.push import PushDevice
from schema.tag import TagConnection, TagStatus, tag_connection
from schema.user import User


@strawberry.type(
    description="a person's cost budget: a bucket of points that operations take from and that refills "
    "at a steady rate (extensions.cost has the same state in Shopify's names)"
)
class RateLimit:
    limit: int = strawberry.field(description="the points the bucket holds when full")
    cost: int = strawberry.field(description="what this operation could cost, taken when it started")
    used: int = strawberry.field(description="points out of the bucket, this operation's included")
    remaining: int
    reset_at: datetime = strawberry.field(description="when the bucket is full again")


@strawberry.type
class Query:
    @strawberry.field
    async def me(self, info: Info) -> User:
        return User(item=await users.me(info.context))

    @strawberry.field
    async def user(self, info: Info, id: strawberry.ID) -> User | None:
        return User(item=await users.user(info.context, str(id)))

    @strawberry.field
    async def my_families(self, info: Info) -> list[FamilyMember]:
        return [FamilyMember(item=m) for m in await families.my_memberships(info.context)]

    @strawberry.field
    async def family(self, info: Info, id: strawberry.ID) -> Family | None:
        family, _ = await families.visible_family(info.context, str(id))
        return Family(item=family)

    @strawberry.field
    async def content(self, info: Info, id: strawberry.ID) -> Content | None:
        found, _ = await content_resolvers.readable_content(info.context, str(id))
        return Content(item=found)

    @strawberry.field
    async def capsule(self, info: Info, id: strawberry.ID) -> Capsule | None:
        return Capsule(item=await capsules.visible_capsule(info.context, str(id)))

    @strawberry.field(description="capsules the viewer created, newest first")
    async def my_capsules(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> CapsuleConnection:
        return capsule_connection(await capsules.my_capsules(info.context, page_size(first, 20), after))

    @strawberry.field(
        description="capsules the viewer is a recipient of and may know about "
        "(SCHEDULED or later, not CANCELLED)"
    )
    async def received_capsules(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> CapsuleConnection:
        return capsule_connection(await capsules.received_capsules(info.context, page_size(first, 20), after))

    @strawberry.field(description="the viewer's devices that receive pushes, oldest first")
    async def my_push_devices(self, info: Info) -> list[PushDevice]:
        return [PushDevice(item=device) for device in await push.my_devices(info.context)]

    @strawberry.field(
        description="the server's VAPID public key (base64url), the applicationServerKey for "
        "pushManager.subscribe; null when Web Push is off"
    )
    async def web_push_public_key(self, info: Info) -> str | None:
        return await push.web_push_public_key(info.context)

    @strawberry.field
    async def notifications(
        self, info: Info, first: int | None = 20, after: str | None = None, unread_only: bool | None = False
    ) -> NotificationConnection:
        return NotificationConnection(
            source=NotificationPage(info.context, page_size(first, 20), after, bool(unread_only))
        )

    @strawberry.field(
        description="tags in one family whose value starts with prefix (case-insensitive); "
        "private tags of others never appear"
    )
    async def search_tags(
        self,
        info: Info,
        family_id: strawberry.ID,
        prefix: str,
        first: int | None = 20,
        after: str | None = None,
    ) -> TagConnection:
        page = await tag_resolvers.search_tags(
            info.context, str(family_id), prefix, page_size(first, 20), after
        )
        return tag_connection(page)

    @strawberry.field(
        description="the family's content whose title or transcription has, for each word of text, "
        "a word that begins with it (case and accents do not matter); sealed capsule content is "
        "found by its author alone"
    )
    async def search_content(
        self,
        info: Info,
        family_id: strawberry.ID,
        text: str,
        first: int | None = 20,
        after: str | None = None,
    ) -> ContentConnection:
        return await search_connection(info, str(family_id), text, first, after)

    @strawberry.field(description="the viewer's own tags whose value starts with prefix")
    async def my_tags(
        self, info: Info, prefix: str = "", first: int | None = 20, after: str | None = None
    ) -> TagConnection:
        return tag_connection(await tag_resolvers.my_tags(info.context, prefix, page_size(first, 20), after))

    @strawberry.field(description="answered with point reads, never by reading every tag of the set")
    async def tag_status(self, info: Info, family_id: strawberry.ID, set_name: str) -> TagStatus:
        anyone, viewer = await tag_resolvers.tag_status(info.context, str(family_id), set_name)
        return TagStatus(tagged_by_anyone=anyone, tagged_by_viewer=viewer)

    @strawberry.field(
        description="one of the viewer's data exports; NOT_FOUND for anyone else's, or once expired"
    )
    async def data_export(self, info: Info, id: strawberry.ID) -> DataExport | None:
        return DataExport(item=await exports.load_export(info.context, str(id)))

    @strawberry.field(description="the viewer's cost budget after this operation; null without a budget")
    def rate_limit(self) -> RateLimit | None:
        state = charged.get()
        if state is None:
            return None
        return RateLimit(
            limit=state.limit,
            cost=state.cost,
            used=state.used,
            remaining=state.remaining,
            reset_at=datetime.fromtimestamp(state.reset_at, UTC),
        )
