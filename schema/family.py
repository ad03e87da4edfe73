from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import strawberry

from resolvers.core.errors import not_found
from resolvers.core.pagination import page_size
from resolvers.domain import families, users
from schema.common import Edge, Info, PageInfo, maybe_when, when
from schema.enums import FamilyEventType, FamilyRole, PostingPolicy, TrustLevel
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

    @strawberry.field(
        description="the longest-standing ADMIN: of the family's ADMINs now, the one who became ADMIN "
        "first (the creator, until they step down or leave)"
    )
    async def admin(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.longest_standing_admin()))

    @strawberry.field(description="every ADMIN now, longest-standing first")
    async def admins(self, info: Info) -> list[User]:
        ids = families.admins_of(self.item)
        found = await asyncio.gather(*(users.load_user(info.context, user_id) for user_id in ids))
        return [User(item=user) for user in found]

    @strawberry.field(
        description="who may post (create uploads); an ADMIN changes it with updateFamilySettings"
    )
    def posting_policy(self) -> PostingPolicy:
        return PostingPolicy(self.item.posting_policy)

    @strawberry.field(
        description="whether the family's own invite code admits people; an ADMIN turns it off (and on) "
        "with updateFamilySettings, invites keep working"
    )
    def invite_code_enabled(self) -> bool:
        return self.item.invite_code_enabled

    @strawberry.field(description="the newest 100 invites, for ADMINs; empty for everyone else")
    async def invites(self, info: Info) -> list[Invite]:
        return [Invite(item=invite) for invite in await families.invites_of(info.context, self.item)]

    @strawberry.field(
        description="the admins' record, newest first: role changes, joins, approvals, removals, "
        "departures, invites, code rotations and settings changes. For ADMINs; empty for everyone else"
    )
    async def activity(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> FamilyEventConnection:
        page = await families.activity_page(info.context, self.item, page_size(first, 20), after)
        events = [items.FamilyEvent.from_item(item) for item in page.items]
        return FamilyEventConnection(
            edges=[
                FamilyEventEdge(position=cursor, node=FamilyEvent(item=event))
                for event, cursor in zip(events, page.cursors, strict=True)
            ],
            page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
        )

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
        return FamilyMemberConnection(
            edges=[
                FamilyMemberEdge(position=cursor, node=FamilyMember(item=m, family_item=self.item))
                for m, cursor in zip(members, page.cursors, strict=True)
            ],
            page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
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
class FamilyMemberEdge(Edge):
    node: FamilyMember


@strawberry.type
class FamilyMemberConnection:
    edges: list[FamilyMemberEdge]
    page_info: PageInfo


@strawberry.type(description="A code an ADMIN made, limited in uses and time, revocable.")
class Invite:
    item: strawberry.Private[items.FamilyInvite]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(families.invite_public_id(self.item.family_id, self.item.id))

    @strawberry.field(description="what the invited person gives joinFamily")
    def code(self) -> str:
        return self.item.code

    @strawberry.field(description="null: no limit")
    def max_uses(self) -> int | None:
        return self.item.max_uses

    @strawberry.field(description="how many people joined with it")
    def uses(self) -> int:
        return self.item.uses

    @strawberry.field(description="null: it does not expire")
    def expires_at(self) -> datetime | None:
        return maybe_when(self.item.ends_at)

    @strawberry.field
    async def created_by(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.created_by))

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)

    @strawberry.field
    def revoked_at(self) -> datetime | None:
        return maybe_when(self.item.revoked_at)

    @strawberry.field(description="where the invitation was emailed, if anywhere")
    def email(self) -> str | None:
        return self.item.email


@strawberry.type(description="One entry of a family's admins' record.")
class FamilyEvent:
    item: strawberry.Private[items.FamilyEvent]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    def type(self) -> FamilyEventType:
        return FamilyEventType(self.item.type)

    @strawberry.field(description="who made the change")
    async def actor(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.actor_id))

    @strawberry.field(description="whom it was about, if anyone")
    async def subject(self, info: Info) -> User | None:
        if self.item.subject_id is None:
            return None
        return User(item=await users.load_user(info.context, self.item.subject_id))

    @strawberry.field(description="what changed, in words: the new role, the invite, the settings")
    def detail(self) -> str | None:
        return self.item.detail

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)


@strawberry.type
class FamilyEventEdge(Edge):
    node: FamilyEvent


@strawberry.type
class FamilyEventConnection:
    edges: list[FamilyEventEdge]
    page_info: PageInfo


async def family_of(info: Info, family_id: str) -> Family:
    """The Family a content or capsule belongs to; the caller has authorized it."""
    family = await families.load_family(info.context, family_id)
    if family is None:
        raise not_found("family")
    return Family(item=family)
