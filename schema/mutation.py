from __future__ import annotations

import strawberry

from resolvers import families, users
from schema.common import Info
from schema.enums import TrustLevel
from schema.family import Family, FamilyMember
from schema.user import User


@strawberry.input
class UpdateProfileInput:
    given_name: str | None = None
    family_name: str | None = None
    profile_image_url: str | None = None


@strawberry.input
class CreateFamilyInput:
    name: str
    trust_level: TrustLevel = TrustLevel.OPEN
    vouch_threshold: int = 2


@strawberry.type
class Mutation:
    @strawberry.mutation
    async def update_profile(self, info: Info, input: UpdateProfileInput) -> User:
        return User(
            item=await users.update_profile(
                info.context,
                given_name=input.given_name,
                family_name=input.family_name,
                profile_image_url=input.profile_image_url,
            )
        )

    @strawberry.mutation
    async def complete_onboarding(self, info: Info) -> User:
        return User(item=await users.complete_onboarding(info.context))

    @strawberry.mutation
    async def create_family(self, info: Info, input: CreateFamilyInput) -> Family:
        family = await families.create_family(
            info.context, input.name, input.trust_level.value, input.vouch_threshold
        )
        return Family(item=family)

    @strawberry.mutation(description="ADMIN only: a new code; the old one stops working")
    async def rotate_invite_code(self, info: Info, family_id: strawberry.ID) -> Family:
        return Family(item=await families.rotate_invite_code(info.context, str(family_id)))

    @strawberry.mutation
    async def join_family(self, info: Info, invite_code: str) -> FamilyMember:
        return FamilyMember(item=await families.join_family(info.context, invite_code))

    @strawberry.mutation(
        description="a MEMBER or ADMIN adds one vouch point to a PENDING member (once per voucher)"
    )
    async def vouch(self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID) -> FamilyMember:
        return FamilyMember(item=await families.vouch(info.context, str(family_id), str(user_id)))

    @strawberry.mutation(description="ADMIN only: PENDING -> MEMBER")
    async def approve_member(
        self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID
    ) -> FamilyMember:
        return FamilyMember(item=await families.approve_member(info.context, str(family_id), str(user_id)))

    @strawberry.mutation(description="ADMIN only; the last ADMIN cannot be removed")
    async def remove_member(self, info: Info, family_id: strawberry.ID, user_id: strawberry.ID) -> bool:
        return await families.remove_member(info.context, str(family_id), str(user_id))

    @strawberry.mutation
    async def leave_family(self, info: Info, family_id: strawberry.ID) -> bool:
        return await families.leave_family(info.context, str(family_id))
