from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import strawberry

from resolvers.core.errors import not_found
from resolvers.core.pagination import page_size
from resolvers.domain import families, users
from schema.common import Info, PageInfo, when
from schema.enums import FamilyRole, TrustLevel
from schema.user import User
from store import items

if TYPE_CHECKING:
    from schema.content import ContentConnection


@strawberry.type
class Family:
    item: strawberry.Private[items.Family]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    def name(self) -> str:
        return self.item.name

    @strawberry.field
    async def admin(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.admin_user_id))

    @strawberry.field
    def trust_level(self) -> TrustLevel:
        return TrustLevel(self.item.trust_level)

    @strawberry.field(description="how many vouch points a PENDING member needs under VOUCHED")
    def vouch_threshold(self) -> int:
        return self.item.vouch_threshold

    @strawberry.field(description="null unless the viewer is an ADMIN of this family")
    async def invite_code(self, info: Info) -> str | None:
        return await families.invite_code_for_viewer(info.context, self.item)

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)

    @strawberry.field
    async def viewer_role(self, info: Info) -> FamilyRole | None:
        membership = await families.viewer_membership(info.context, self.item.id)
        return FamilyRole(membership.role) if membership else None

    @strawberry.field
    async def members(
        self, info: Info, first: int | None = 50, after: str | None = None
    ) -> FamilyMemberConnection:
        _, viewer = await families.visible_family(info.context, self.item.id)
        page = await families.members_page(info.context, self.item, viewer, page_size(first, 50), after)
        members = [items.Membership.from_item(item) for item in page.items]
        cursors = page.cursors or [""] * len(members)
        return FamilyMemberConnection(
            edges=[
                FamilyMemberEdge(cursor=cursor, node=FamilyMember(item=m, family_item=self.item))
                for m, cursor in zip(members, cursors, strict=True)
            ],
            page_info=PageInfo(has_next_page=page.has_next, end_cursor=page.end_cursor),
        )

    @strawberry.field(description="newest first; PENDING members cannot read it")
    async def feed(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> Annotated[ContentConnection, strawberry.lazy("schema.content")]:
        from schema.content import feed_connection

        return await feed_connection(info, self.item.id, first, after)


@strawberry.type
class FamilyMember:
    item: strawberry.Private[items.Membership]
    family_item: strawberry.Private[items.Family | None] = None

    @strawberry.field
    async def family(self, info: Info) -> Family:
        if self.family_item is not None:
            return Family(item=self.family_item)
        family = await families.load_family(info.context, self.item.family_id)
        if family is None:
            raise not_found("family")
        return Family(item=family)

    @strawberry.field
    async def user(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.user_id))

    @strawberry.field
    def role(self) -> FamilyRole:
        return FamilyRole(self.item.role)

    @strawberry.field
    def joined_at(self) -> datetime:
        return when(self.item.joined_at)

    @strawberry.field
    def vouch_score(self) -> int:
        return self.item.vouch_score


@strawberry.type
class FamilyMemberEdge:
    cursor: str
    node: FamilyMember


@strawberry.type
class FamilyMemberConnection:
    edges: list[FamilyMemberEdge]
    page_info: PageInfo


async def family_of(info: Info, family_id: str) -> Family:
    """The Family a content or capsule belongs to; the caller has authorized it."""
    family = await families.load_family(info.context, family_id)
    if family is None:
        raise not_found("family")
    return Family(item=family)
