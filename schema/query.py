from __future__ import annotations

import strawberry

from resolvers import families, users
from resolvers.errors import not_found
from schema.common import Info
from schema.family import Family, FamilyMember
from schema.user import User


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
        if "#" in id:
            raise not_found("family")
        family, _ = await families.visible_family(info.context, str(id))
        return Family(item=family)
