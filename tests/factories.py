"""Plain functions that build what a test needs through the public API."""

from __future__ import annotations

from typing import Any

CREATE_FAMILY = """
mutation($input: CreateFamilyInput!) {
  createFamily(input: $input) { id name inviteCode trustLevel vouchThreshold }
}"""

JOIN = "mutation($code: String!) { joinFamily(inviteCode: $code) { role vouchScore user { id } } }"


async def make_family(
    api: Any, admin: str, name: str = "Los García", trust: str = "OPEN", threshold: int = 2
) -> dict[str, Any]:
    data = await api.ok(
        CREATE_FAMILY, {"input": {"name": name, "trustLevel": trust, "vouchThreshold": threshold}}, as_=admin
    )
    family: dict[str, Any] = data["createFamily"]
    return family


async def join(api: Any, user: str, code: str) -> dict[str, Any]:
    data = await api.ok(JOIN, {"code": code}, as_=user)
    member: dict[str, Any] = data["joinFamily"]
    return member


async def family_with_members(api: Any, admin: str, members: list[str], name: str = "Los García") -> str:
    family = await make_family(api, admin, name)
    for user in members:
        await join(api, user, family["inviteCode"])
    return str(family["id"])
