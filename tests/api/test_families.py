"""Families: creating, inviting, joining under each trust level, vouching,
approving, removing and leaving; every refusal changes nothing."""

from __future__ import annotations

import re

from resolvers.domain.families import INVITE_ALPHABET, WRONG_CODES_ALLOWED
from tests.api.conftest import Api
from tests.factories import JOIN, family_with_members, join, make_family

FAMILY = """query($id: ID!) { family(id: $id) {
  id name trustLevel vouchThreshold inviteCode viewerRole admin { id }
  members { edges { node { role vouchScore user { id } } } pageInfo { hasNextPage endCursor } }
} }"""
VOUCH = "mutation($f: ID!, $u: ID!) { vouch(familyId: $f, userId: $u) { role vouchScore } }"
APPROVE = "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }"
REMOVE = "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }"
LEAVE = "mutation($f: ID!) { leaveFamily(familyId: $f) }"
ROTATE = "mutation($f: ID!) { rotateInviteCode(familyId: $f) { inviteCode } }"


def roles(family: dict) -> dict[str, str]:
    return {e["node"]["user"]["id"]: e["node"]["role"] for e in family["members"]["edges"]}


async def test_create_family_makes_the_creator_admin(api: Api) -> None:
    family = await make_family(api, "ana", "  Los García  ")
    assert family["name"] == "Los García"
    assert re.fullmatch(f"[{INVITE_ALPHABET}]{{5}}-[{INVITE_ALPHABET}]{{5}}", family["inviteCode"])
    data = await api.ok(FAMILY, {"id": family["id"]}, as_="ana")
    assert data["family"]["viewerRole"] == "ADMIN"
    assert data["family"]["admin"]["id"] == "ana"
    assert roles(data["family"]) == {"ana": "ADMIN"}
    mine = await api.ok("{ myFamilies { role family { id name } } }", as_="ana")
    assert mine["myFamilies"] == [{"role": "ADMIN", "family": {"id": family["id"], "name": "Los García"}}]


async def test_create_family_refuses_bad_input(api: Api) -> None:
    await api.ok("{ me { id } }", as_="ana")
    before = await api.snapshot()
    for fields in (
        'name: ""',
        'name: "' + "x" * 101 + '"',
        'name: "a", vouchThreshold: 0',
        'name: "a", trustLevel: SECRETIVE',
    ):
        code, _ = await api.error(f"mutation {{ createFamily(input: {{{fields}}}) {{ id }} }}", as_="ana")
        assert code == "BAD_USER_INPUT", fields
    assert await api.snapshot() == before


async def test_open_family_join_and_invite_code_visibility(api: Api) -> None:
    family = await make_family(api, "ana")
    member = await join(api, "ben", family["inviteCode"].lower().replace("-", " "))
    assert member["role"] == "MEMBER"
    data = await api.ok(FAMILY, {"id": family["id"]}, as_="ben")
    assert data["family"]["inviteCode"] is None
    assert data["family"]["viewerRole"] == "MEMBER"
    assert roles(data["family"]) == {"ana": "ADMIN", "ben": "MEMBER"}
    notes = await api.ok("{ notifications { edges { node { type family { id } } } } }", as_="ana")
    assert [e["node"]["type"] for e in notes["notifications"]["edges"]] == ["MEMBER_JOINED"]


async def test_joining_twice_and_unknown_codes_are_refused(api: Api) -> None:
    family = await make_family(api, "ana")
    await join(api, "ben", family["inviteCode"])
    before = await api.snapshot()
    assert (await api.error(JOIN, {"code": family["inviteCode"]}, as_="ben"))[0] == "CONFLICT"
    assert (await api.error(JOIN, {"code": family["inviteCode"]}, as_="ana"))[0] == "CONFLICT"
    assert await api.snapshot() == before
    code, message = await api.error(JOIN, {"code": "ZZZZZ-ZZZZZ"}, as_="zoe")
    assert code == "BAD_USER_INPUT" and "invite code" in message


async def test_guessing_codes_is_rate_limited(api: Api) -> None:
    family = await make_family(api, "ana")
    for attempt in range(WRONG_CODES_ALLOWED):
        assert (await api.error(JOIN, {"code": f"WRONG-{attempt:05d}"}, as_="eve"))[0] == "BAD_USER_INPUT"
    # Blocked now, even with the right code.
    code, message = await api.error(JOIN, {"code": family["inviteCode"]}, as_="eve")
    assert code == "RATE_LIMITED" and "wait" in message
    api.clock.advance(minutes=16)
    assert (await join(api, "eve", family["inviteCode"]))["role"] == "MEMBER"


async def test_rotating_the_code_retires_the_old_one(api: Api) -> None:
    family = await make_family(api, "ana")
    new = (await api.ok(ROTATE, {"f": family["id"]}, as_="ana"))["rotateInviteCode"]["inviteCode"]
    assert new != family["inviteCode"]
    assert (await api.error(JOIN, {"code": family["inviteCode"]}, as_="ben"))[0] == "BAD_USER_INPUT"
    assert (await join(api, "ben", new))["role"] == "MEMBER"
    await api.ok("{ me { id } }", as_="zoe")
    before = await api.snapshot()
    assert (await api.error(ROTATE, {"f": family["id"]}, as_="ben"))[0] == "FORBIDDEN"
    assert (await api.error(ROTATE, {"f": family["id"]}, as_="zoe"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before


async def test_vouched_family_admits_at_the_threshold(api: Api) -> None:
    family = await make_family(api, "ana", trust="VOUCHED", threshold=2)
    await join(api, "ben", family["inviteCode"])
    await api.ok(APPROVE, {"f": family["id"], "u": "ben"}, as_="ana")
    pending = await join(api, "cy", family["inviteCode"])
    assert pending == {"role": "PENDING", "vouchScore": 0, "user": {"id": "cy"}}
    # PENDING: the family's name and their own membership only; no feed.
    data = await api.ok(FAMILY, {"id": family["id"]}, as_="cy")
    assert data["family"]["name"] == "Los García"
    assert roles(data["family"]) == {"cy": "PENDING"}
    notes = await api.ok("{ notifications { edges { node { type } } } }", as_="ben")
    assert "MEMBER_PENDING" in [e["node"]["type"] for e in notes["notifications"]["edges"]]

    assert (await api.ok(VOUCH, {"f": family["id"], "u": "cy"}, as_="ben"))["vouch"] == {
        "role": "PENDING",
        "vouchScore": 1,
    }
    await api.sign_in("zoe")
    before = await api.snapshot()
    assert (await api.error(VOUCH, {"f": family["id"], "u": "cy"}, as_="ben"))[0] == "CONFLICT"
    assert (await api.error(VOUCH, {"f": family["id"], "u": "cy"}, as_="zoe"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before
    assert (await api.ok(VOUCH, {"f": family["id"], "u": "cy"}, as_="ana"))["vouch"] == {
        "role": "MEMBER",
        "vouchScore": 2,
    }
    assert (await api.error(VOUCH, {"f": family["id"], "u": "cy"}, as_="ben"))[0] == "CONFLICT"


async def test_pending_member_cannot_vouch_and_open_family_has_no_vouching(api: Api) -> None:
    family = await make_family(api, "ana", trust="VOUCHED", threshold=3)
    await join(api, "ben", family["inviteCode"])
    await join(api, "cy", family["inviteCode"])
    assert (await api.error(VOUCH, {"f": family["id"], "u": "cy"}, as_="ben"))[0] == "FORBIDDEN"
    open_family = await make_family(api, "ana", "Open")
    await join(api, "dee", open_family["inviteCode"])
    assert (await api.error(VOUCH, {"f": open_family["id"], "u": "dee"}, as_="ana"))[0] == "CONFLICT"


async def test_closed_family_needs_an_admin(api: Api) -> None:
    family = await make_family(api, "ana", trust="CLOSED")
    await join(api, "ben", family["inviteCode"])
    await join(api, "cy", family["inviteCode"])
    await api.ok(APPROVE, {"f": family["id"], "u": "ben"}, as_="ana")
    before = await api.snapshot()
    assert (await api.error(APPROVE, {"f": family["id"], "u": "cy"}, as_="ben"))[0] == "FORBIDDEN"
    assert (await api.error(APPROVE, {"f": family["id"], "u": "ben"}, as_="ana"))[0] == "CONFLICT"
    assert (await api.error(APPROVE, {"f": family["id"], "u": "nobody"}, as_="ana"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before
    assert (await api.ok(APPROVE, {"f": family["id"], "u": "cy"}, as_="ana"))["approveMember"][
        "role"
    ] == "MEMBER"


async def test_remove_and_leave_never_lose_the_last_admin(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    before = await api.snapshot()
    assert (await api.error(REMOVE, {"f": family_id, "u": "ana"}, as_="ana"))[0] == "CONFLICT"
    assert (await api.error(LEAVE, {"f": family_id}, as_="ana"))[0] == "CONFLICT"
    assert (await api.error(REMOVE, {"f": family_id, "u": "cy"}, as_="ben"))[0] == "FORBIDDEN"
    assert await api.snapshot() == before
    assert (await api.ok(REMOVE, {"f": family_id, "u": "ben"}, as_="ana"))["removeMember"] is True
    assert (await api.error(FAMILY, {"id": family_id}, as_="ben"))[0] == "NOT_FOUND"
    assert (await api.ok("{ myFamilies { role } }", as_="ben"))["myFamilies"] == []
    assert (await api.ok(LEAVE, {"f": family_id}, as_="cy"))["leaveFamily"] is True
    data = await api.ok(FAMILY, {"id": family_id}, as_="ana")
    assert roles(data["family"]) == {"ana": "ADMIN"}


async def test_outsiders_get_not_found(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await api.ok("{ me { id } }", as_="zoe")
    before = await api.snapshot()
    assert (await api.error(FAMILY, {"id": family_id}, as_="zoe"))[0] == "NOT_FOUND"
    assert (await api.error(FAMILY, {"id": "no-such-family"}, as_="zoe"))[0] == "NOT_FOUND"
    assert (await api.error(REMOVE, {"f": family_id, "u": "ben"}, as_="zoe"))[0] == "NOT_FOUND"
    assert (await api.error(LEAVE, {"f": family_id}, as_="zoe"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before


async def test_members_page_with_cursors_and_tampered_cursor(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [f"m{i}" for i in range(5)])
    query = """query($id: ID!, $after: String) { family(id: $id) {
      members(first: 2, after: $after) { edges { node { user { id } } } pageInfo { hasNextPage endCursor } } } }"""
    seen, after = [], None
    while True:
        page = (await api.ok(query, {"id": family_id, "after": after}, as_="ana"))["family"]["members"]
        seen += [e["node"]["user"]["id"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert sorted(seen) == sorted(["ana", *[f"m{i}" for i in range(5)]])
    assert len(seen) == 6
    assert after is not None
    tampered = after[:-2] + ("AA" if not after.endswith("AA") else "BB")
    assert (await api.error(query, {"id": family_id, "after": tampered}, as_="ana"))[0] == "BAD_USER_INPUT"
    code, _ = await api.error(
        "query($id: ID!) { family(id: $id) { members(first: 0) { edges { cursor } } } }",
        {"id": family_id},
        as_="ana",
    )
    assert code == "BAD_USER_INPUT"
