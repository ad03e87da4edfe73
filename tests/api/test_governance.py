"""A family run by several people: co-admins, succession, limited invites, who
may post, and the admins' record; on both engines, every refusal changing nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from store import items, keys
from store.enums import FamilyEventType
from store.port import Update, op_key
from tests.api.conftest import Api
from tests.factories import JOIN, family_rows, family_with_members, join, make_family

ROLE = """mutation($f: ID!, $u: ID!, $r: FamilyRole!) {
  setMemberRole(familyId: $f, userId: $u, role: $r) { role user { id } } }"""
ADMINS = "query($f: ID!) { family(id: $f) { admin { id } admins { id } viewerRole } }"
MEMBERS = "query($f: ID!) { family(id: $f) { members { edges { node { role user { id } } } } } }"
LEAVE = "mutation($f: ID!, $s: ID) { leaveFamily(familyId: $f, successorId: $s) }"
DELETE_ME = "mutation($s: [SuccessorInput!]) { deleteMyAccount(successors: $s) }"
CREATE_INVITE = """mutation($i: CreateInviteInput!) { createInvite(input: $i) {
  id code maxUses uses expiresAt createdBy { id } createdAt revokedAt email } }"""
REVOKE = "mutation($id: ID!) { revokeInvite(id: $id) }"
INVITES = "query($f: ID!) { family(id: $f) { invites { id code uses revokedAt } } }"
SETTINGS = """mutation($i: UpdateFamilySettingsInput!) {
  updateFamilySettings(input: $i) { postingPolicy inviteCodeEnabled } }"""
ACTIVITY = """query($f: ID!, $first: Int, $after: String) { family(id: $f) {
  activity(first: $first, after: $after) {
    edges { cursor node { type actor { id } subject { id } detail createdAt } }
    pageInfo { hasNextPage endCursor } } } }"""
UPLOAD = """mutation($f: ID!) { createUpload(input: {familyId: $f, type: TEXT, mimeType: "text/plain",
  sizeBytes: 4}) { content { id } } }"""


def roles(data: dict[str, Any]) -> dict[str, str]:
    return {e["node"]["user"]["id"]: e["node"]["role"] for e in data["family"]["members"]["edges"]}


async def set_role(api: Api, family_id: str, user: str, role: str, *, as_: str) -> dict[str, Any]:
    data = await api.ok(ROLE, {"f": family_id, "u": user, "r": role}, as_=as_)
    result: dict[str, Any] = data["setMemberRole"]
    return result


async def activity(api: Api, family_id: str, as_: str) -> list[dict[str, Any]]:
    data = await api.ok(ACTIVITY, {"f": family_id, "first": 100}, as_=as_)
    return [edge["node"] for edge in data["family"]["activity"]["edges"]]


@contextlib.asynccontextmanager
async def writes_meet(api: Api, n: int) -> AsyncIterator[None]:
    """The next `n` transactions wait for each other before going to the store:
    each request has made every read and check of its own by then, so only the
    writes' conditions can tell them apart."""
    barrier = asyncio.Barrier(n)
    table: Any = api.table
    original = table.transact
    held = 0

    async def meeting(ops: Any) -> None:
        nonlocal held
        held += 1
        if held <= n:
            await asyncio.wait_for(barrier.wait(), 30)
        await original(ops)

    table.transact = meeting
    try:
        yield
    finally:
        table.transact = original


# Co-admins ------------------------------------------------------------------------------


async def test_admins_make_and_unmake_admins(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    assert await set_role(api, family_id, "ben", "ADMIN", as_="ana") == {
        "role": "ADMIN",
        "user": {"id": "ben"},
    }
    data = await api.ok(ADMINS, {"f": family_id}, as_="cy")
    assert data["family"]["admin"] == {"id": "ana"}
    assert data["family"]["admins"] == [{"id": "ana"}, {"id": "ben"}]
    # A co-admin is an ADMIN in full: they promote, and the creator may step down.
    api.clock.advance(seconds=1)
    await set_role(api, family_id, "cy", "ADMIN", as_="ben")
    await set_role(api, family_id, "ana", "MEMBER", as_="ana")
    data = await api.ok(ADMINS, {"f": family_id}, as_="ana")
    assert data["family"]["admin"] == {"id": "ben"}, "the longest-standing ADMIN now"
    assert data["family"]["admins"] == [{"id": "ben"}, {"id": "cy"}]
    assert data["family"]["viewerRole"] == "MEMBER"
    # Asking for the role someone has already changes nothing.
    assert (await set_role(api, family_id, "cy", "ADMIN", as_="ben"))["role"] == "ADMIN"
    assert roles(await api.ok(MEMBERS, {"f": family_id}, as_="ben")) == {
        "ana": "MEMBER",
        "ben": "ADMIN",
        "cy": "ADMIN",
    }


async def test_role_changes_refused_change_nothing(api: Api) -> None:
    family = await make_family(api, "ana", trust="CLOSED")
    await join(api, "ben", family["inviteCode"])
    await api.ok(
        "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
        {"f": family["id"], "u": "ben"},
        as_="ana",
    )
    await join(api, "pat", family["inviteCode"])  # stays PENDING
    await api.sign_in("zoe")
    before = await api.snapshot()
    cases = [
        ({"u": "ben", "r": "PENDING"}, "ana", "BAD_USER_INPUT"),
        ({"u": "ben", "r": "ADMIN"}, "ben", "FORBIDDEN"),
        ({"u": "ben", "r": "ADMIN"}, "pat", "FORBIDDEN"),
        ({"u": "ben", "r": "ADMIN"}, "zoe", "NOT_FOUND"),
        ({"u": "nobody", "r": "ADMIN"}, "ana", "NOT_FOUND"),
        ({"u": "pat", "r": "ADMIN"}, "ana", "CONFLICT"),
        ({"u": "ana", "r": "MEMBER"}, "ana", "CONFLICT"),  # the last ADMIN
    ]
    for variables, viewer, expected in cases:
        code, message = await api.error(ROLE, {"f": family["id"], **variables}, as_=viewer)
        assert code == expected, (variables, viewer, message)
    code, message = await api.error(ROLE, {"f": family["id"], "u": "ana", "r": "MEMBER"}, as_="ana")
    assert "at least one ADMIN" in message
    assert await api.snapshot() == before


async def test_two_admins_demoting_each_other_leave_one(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    await set_role(api, family_id, "ben", "ADMIN", as_="ana")
    async with writes_meet(api, 2):
        answers = await asyncio.gather(
            api.post(ROLE, {"f": family_id, "u": "ben", "r": "MEMBER"}, as_="ana"),
            api.post(ROLE, {"f": family_id, "u": "ana", "r": "MEMBER"}, as_="ben"),
        )
    won = [a for a in answers if "errors" not in a]
    lost = [a for a in answers if "errors" in a]
    assert len(won) == 1 and len(lost) == 1, answers
    assert lost[0]["errors"][0]["extensions"]["code"] == "CONFLICT"
    members = roles(await api.ok(MEMBERS, {"f": family_id}, as_="cy"))
    assert sorted(members.values()) == ["ADMIN", "MEMBER", "MEMBER"]
    family_item = await api.table.get(keys.family(family_id))
    assert family_item is not None and family_item["adminCount"] == 1
    admin = (await api.ok(ADMINS, {"f": family_id}, as_="cy"))["family"]["admins"]
    assert [a["id"] for a in admin] == [u for u, r in members.items() if r == "ADMIN"]


# Succession -------------------------------------------------------------------------------


async def test_the_last_admin_leaves_with_a_successor(api: Api) -> None:
    family = await make_family(api, "ana", trust="CLOSED")
    for user in ("ben", "cy"):
        await join(api, user, family["inviteCode"])
        await api.ok(
            "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
            {"f": family["id"], "u": user},
            as_="ana",
        )
    await join(api, "pat", family["inviteCode"])  # PENDING
    await api.sign_in("zoe")
    before = await api.snapshot()
    code, message = await api.error(LEAVE, {"f": family["id"]}, as_="ana")
    assert code == "CONFLICT" and "successor" in message
    for successor in ("zoe", "pat", "ana", "nobody"):
        code, _ = await api.error(LEAVE, {"f": family["id"], "s": successor}, as_="ana")
        assert code == "BAD_USER_INPUT", successor
    assert await api.snapshot() == before
    assert (await api.ok(LEAVE, {"f": family["id"], "s": "ben"}, as_="ana"))["leaveFamily"] is True
    data = await api.ok(ADMINS, {"f": family["id"]}, as_="ben")
    assert data["family"]["admin"] == {"id": "ben"} and data["family"]["admins"] == [{"id": "ben"}]
    assert "ana" not in roles(await api.ok(MEMBERS, {"f": family["id"]}, as_="ben"))
    record = await activity(api, family["id"], "ben")
    assert [(e["type"], e["actor"]["id"], e["subject"]["id"]) for e in record[:2]] == [
        ("MEMBER_LEFT", "ana", "ana"),
        ("ROLE_CHANGED", "ana", "ben"),
    ] or [(e["type"], e["actor"]["id"], e["subject"]["id"]) for e in record[:2]] == [
        ("ROLE_CHANGED", "ana", "ben"),
        ("MEMBER_LEFT", "ana", "ana"),
    ]
    # A MEMBER leaving may name nobody in particular: the name changes nothing.
    assert (await api.ok(LEAVE, {"f": family["id"], "s": "ben"}, as_="cy"))["leaveFamily"] is True


async def test_deleting_the_last_admins_account_names_successors(api: Api) -> None:
    first = await family_with_members(api, "ana", ["ben"], "Primera")
    second = await family_with_members(api, "ana", ["cy", "dee"], "Segunda")
    alone = (await make_family(api, "ana", "Sola"))["id"]
    await api.sign_in("zoe")
    before = await api.snapshot()
    code, message = await api.error(DELETE_ME, {}, as_="ana")
    assert code == "CONFLICT" and "successor" in message
    code, message = await api.error(DELETE_ME, {"s": [{"familyId": first, "userId": "ben"}]}, as_="ana")
    assert code == "CONFLICT" and "Segunda" in message
    for wrong in (
        [{"familyId": first, "userId": "ben"}, {"familyId": second, "userId": "zoe"}],
        [{"familyId": first, "userId": "ben"}, {"familyId": second, "userId": "ben"}],
        [{"familyId": first, "userId": "ben"}, {"familyId": first, "userId": "ben"}],
        [{"familyId": "not-mine", "userId": "ben"}],
    ):
        assert (await api.error(DELETE_ME, {"s": wrong}, as_="ana"))[0] == "BAD_USER_INPUT", wrong
    assert await api.snapshot() == before
    named = [{"familyId": first, "userId": "ben"}, {"familyId": second, "userId": "dee"}]
    assert (await api.ok(DELETE_ME, {"s": named}, as_="ana"))["deleteMyAccount"] is True
    for family_id, heir in ((first, "ben"), (second, "dee")):
        data = await api.ok(ADMINS, {"f": family_id}, as_=heir)
        assert data["family"]["admins"] == [{"id": heir}] and data["family"]["viewerRole"] == "ADMIN"
        record = await activity(api, family_id, heir)
        left = [e for e in record if e["type"] == "MEMBER_LEFT"]
        assert left and left[0]["subject"]["id"] == "ana" and left[0]["detail"] == "account deleted"
        assert any(e["type"] == "ROLE_CHANGED" and e["subject"]["id"] == heir for e in record)
    # The family where ana was alone is gone, as before.
    assert await api.table.get(keys.family(alone)) is None


# Invites ----------------------------------------------------------------------------------


async def create_invite(api: Api, family_id: str, as_: str = "ana", **fields: Any) -> dict[str, Any]:
    data = await api.ok(CREATE_INVITE, {"i": {"familyId": family_id, **fields}}, as_=as_)
    invite: dict[str, Any] = data["createInvite"]
    return invite


async def test_invites_limit_uses_and_time(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    until = (api.clock.moment + timedelta(days=2)).isoformat()
    invite = await create_invite(api, family_id, maxUses=2, expiresAt=until, email="tia@example.org")
    assert invite["maxUses"] == 2 and invite["uses"] == 0 and invite["revokedAt"] is None
    assert invite["createdBy"] == {"id": "ana"} and invite["email"] == "tia@example.org"
    assert invite["code"] != invite["id"]
    assert (await join(api, "cy", invite["code"].lower()))["role"] == "MEMBER"
    assert (await join(api, "dee", invite["code"]))["role"] == "MEMBER"
    await api.sign_in("eve")
    before = await api.snapshot()
    code, message = await api.error(JOIN, {"code": invite["code"]}, as_="eve")
    assert code == "BAD_USER_INPUT" and "used up" in message
    assert await api.snapshot() == before
    listed = (await api.ok(INVITES, {"f": family_id}, as_="ana"))["family"]["invites"]
    assert [(i["id"], i["uses"]) for i in listed] == [(invite["id"], 2)]

    timed = await create_invite(api, family_id, expiresAt=until)
    api.clock.advance(days=2, seconds=1)
    code, message = await api.error(JOIN, {"code": timed["code"]}, as_="eve")
    assert code == "BAD_USER_INPUT" and "expired" in message

    revoked = await create_invite(api, family_id)
    assert (await api.ok(REVOKE, {"id": revoked["id"]}, as_="ana"))["revokeInvite"] is True
    assert (await api.ok(REVOKE, {"id": revoked["id"]}, as_="ana"))["revokeInvite"] is True
    code, message = await api.error(JOIN, {"code": revoked["code"]}, as_="eve")
    assert code == "BAD_USER_INPUT" and "revoked" in message
    # Newest first, the revoked one with its time.
    listed = (await api.ok(INVITES, {"f": family_id}, as_="ana"))["family"]["invites"]
    assert [i["id"] for i in listed] == [revoked["id"], timed["id"], invite["id"]]
    assert listed[0]["revokedAt"] is not None
    # The family's own code still works.
    assert (await join(api, "eve", (await make_code(api, family_id))))["role"] == "MEMBER"


async def make_code(api: Api, family_id: str) -> str:
    data = await api.ok("query($f: ID!) { family(id: $f) { inviteCode } }", {"f": family_id}, as_="ana")
    return str(data["family"]["inviteCode"])


async def test_invites_are_for_admins_only(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    invite = await create_invite(api, family_id, maxUses=1)
    other = await family_with_members(api, "oto", [])
    await api.sign_in("zoe")
    before = await api.snapshot()
    later = (api.clock.moment + timedelta(days=1)).isoformat()
    for fields, viewer, expected in (
        ({}, "ben", "FORBIDDEN"),
        ({}, "zoe", "NOT_FOUND"),
        ({"maxUses": 0}, "ana", "BAD_USER_INPUT"),
        ({"maxUses": 1001}, "ana", "BAD_USER_INPUT"),
        ({"expiresAt": api.clock.moment.isoformat()}, "ana", "BAD_USER_INPUT"),
        ({"expiresAt": (api.clock.moment + timedelta(days=400)).isoformat()}, "ana", "BAD_USER_INPUT"),
        ({"expiresAt": later, "email": "not an address"}, "ana", "BAD_USER_INPUT"),
    ):
        code, _ = await api.error(CREATE_INVITE, {"i": {"familyId": family_id, **fields}}, as_=viewer)
        assert code == expected, (fields, viewer)
    for invite_id, viewer, expected in (
        (invite["id"], "ben", "FORBIDDEN"),
        (invite["id"], "zoe", "NOT_FOUND"),
        (invite["id"], "oto", "NOT_FOUND"),
        (f"{other}:{invite['id'].split(':')[1]}", "oto", "NOT_FOUND"),
        ("nonsense", "ana", "NOT_FOUND"),
    ):
        code, _ = await api.error(REVOKE, {"id": invite_id}, as_=viewer)
        assert code == expected, (invite_id, viewer)
    assert await api.snapshot() == before
    # A MEMBER reads the family, and no invite of it.
    assert (await api.ok(INVITES, {"f": family_id}, as_="ben"))["family"]["invites"] == []


async def test_two_people_racing_for_the_last_use_one_gets_in(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    invite = await create_invite(api, family_id, maxUses=1)
    await api.sign_in("ben", "cy")
    async with writes_meet(api, 2):
        answers = await asyncio.gather(
            api.post(JOIN, {"code": invite["code"]}, as_="ben"),
            api.post(JOIN, {"code": invite["code"]}, as_="cy"),
        )
    won = [a for a in answers if "errors" not in a]
    lost = [a for a in answers if "errors" in a]
    assert len(won) == 1 and len(lost) == 1, answers
    assert lost[0]["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert "used up" in lost[0]["errors"][0]["message"]
    assert len(roles(await api.ok(MEMBERS, {"f": family_id}, as_="ana"))) == 2
    listed = (await api.ok(INVITES, {"f": family_id}, as_="ana"))["family"]["invites"]
    assert listed[0]["uses"] == 1


async def test_an_admin_turns_the_family_code_off(api: Api) -> None:
    family = await make_family(api, "ana")
    await join(api, "ben", family["inviteCode"])
    await api.sign_in("cy")
    before = await api.snapshot()
    code, _ = await api.error(
        SETTINGS, {"i": {"familyId": family["id"], "inviteCodeEnabled": False}}, as_="ben"
    )
    assert code == "FORBIDDEN"
    assert await api.snapshot() == before
    data = await api.ok(SETTINGS, {"i": {"familyId": family["id"], "inviteCodeEnabled": False}}, as_="ana")
    assert data["updateFamilySettings"] == {"postingPolicy": "EVERYONE", "inviteCodeEnabled": False}
    code, message = await api.error(JOIN, {"code": family["inviteCode"]}, as_="cy")
    assert code == "BAD_USER_INPUT" and "turned off" in message
    invite = await create_invite(api, family["id"])
    assert (await join(api, "cy", invite["code"]))["role"] == "MEMBER"
    await api.ok(SETTINGS, {"i": {"familyId": family["id"], "inviteCodeEnabled": True}}, as_="ana")
    assert (await join(api, "dee", family["inviteCode"]))["role"] == "MEMBER"


# Who may post -------------------------------------------------------------------------------


async def test_admins_only_posting(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    code, _ = await api.error(SETTINGS, {"i": {"familyId": family_id, "postingPolicy": "ADMINS"}}, as_="ben")
    assert code == "FORBIDDEN"
    await api.ok(SETTINGS, {"i": {"familyId": family_id, "postingPolicy": "ADMINS"}}, as_="ana")
    before = await api.snapshot()
    code, message = await api.error(UPLOAD, {"f": family_id}, as_="ben")
    assert code == "FORBIDDEN" and "only ADMINs may post" in message
    assert await api.snapshot() == before
    assert (await api.ok(UPLOAD, {"f": family_id}, as_="ana"))["createUpload"]["content"]["id"]
    # An ADMIN made so may post at once; back to everyone, everyone may.
    await set_role(api, family_id, "ben", "ADMIN", as_="ana")
    assert (await api.ok(UPLOAD, {"f": family_id}, as_="ben"))["createUpload"]["content"]["id"]
    await set_role(api, family_id, "ben", "MEMBER", as_="ana")
    await api.ok(SETTINGS, {"i": {"familyId": family_id, "postingPolicy": "EVERYONE"}}, as_="ana")
    assert (await api.ok(UPLOAD, {"f": family_id}, as_="ben"))["createUpload"]["content"]["id"]
    data = await api.ok("query($f: ID!) { family(id: $f) { postingPolicy } }", {"f": family_id}, as_="ben")
    assert data["family"]["postingPolicy"] == "EVERYONE"


async def test_the_setting_is_read_at_the_write(api: Api) -> None:
    """An upload that read EVERYONE, while the change to ADMINS commits before
    its write, is refused at its write."""
    family_id = await family_with_members(api, "ana", ["ben"])
    table: Any = api.table
    original = table.transact
    upload_at_write, changed = asyncio.Event(), asyncio.Event()

    async def ordered(ops: Any) -> None:
        if any(op_key(op)[0].startswith("CONTENT#") for op in ops):
            upload_at_write.set()  # it read the setting, and found EVERYONE
            await asyncio.wait_for(changed.wait(), 30)
            await original(ops)
            return
        await asyncio.wait_for(upload_at_write.wait(), 30)
        await original(ops)
        changed.set()

    table.transact = ordered
    upload: dict[str, Any]
    try:
        upload, _ = await asyncio.gather(
            api.post(UPLOAD, {"f": family_id}, as_="ben"),
            api.post(SETTINGS, {"i": {"familyId": family_id, "postingPolicy": "ADMINS"}}, as_="ana"),
        )
    finally:
        table.transact = original
    assert upload["errors"][0]["extensions"]["code"] == "FORBIDDEN", upload
    assert "only ADMINs may post" in upload["errors"][0]["message"]
    assert (await api.table.query(keys.family_pk(family_id), index="GSI1")).items == []


# The admins' record -------------------------------------------------------------------------


async def test_every_kind_of_change_is_recorded_for_admins_only(api: Api) -> None:
    family = await make_family(api, "ana", trust="CLOSED")
    fid = family["id"]
    await join(api, "ben", family["inviteCode"])  # MEMBER_JOINED
    await api.ok(
        "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
        {"f": fid, "u": "ben"},
        as_="ana",
    )  # MEMBER_APPROVED
    await join(api, "cy", family["inviteCode"])
    await api.ok(
        "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
        {"f": fid, "u": "cy"},
        as_="ana",
    )
    await set_role(api, fid, "ben", "ADMIN", as_="ana")  # ROLE_CHANGED
    invite = await create_invite(api, fid, maxUses=3)  # INVITE_CREATED
    await api.ok(REVOKE, {"id": invite["id"]}, as_="ben")  # INVITE_REVOKED
    await api.ok("mutation($f: ID!) { rotateInviteCode(familyId: $f) { inviteCode } }", {"f": fid}, as_="ana")
    await api.ok(SETTINGS, {"i": {"familyId": fid, "postingPolicy": "ADMINS"}}, as_="ben")  # SETTINGS_CHANGED
    await api.ok(
        "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }",
        {"f": fid, "u": "cy"},
        as_="ben",
    )  # MEMBER_REMOVED
    await join(
        api,
        "dee",
        (await api.ok("query($f: ID!) { family(id: $f) { inviteCode } }", {"f": fid}, as_="ana"))["family"][
            "inviteCode"
        ],
    )
    await api.ok(
        "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
        {"f": fid, "u": "dee"},
        as_="ana",
    )
    await api.ok(LEAVE, {"f": fid}, as_="dee")  # MEMBER_LEFT

    record = await activity(api, fid, "ana")
    assert {e["type"] for e in record} == {t.value for t in FamilyEventType}
    times = [e["createdAt"] for e in record]
    assert times == sorted(times, reverse=True), "newest first"
    found = {(e["type"], e["actor"]["id"], (e["subject"] or {}).get("id")) for e in record}
    for expected in (
        ("MEMBER_JOINED", "ben", "ben"),
        ("MEMBER_APPROVED", "ana", "ben"),
        ("ROLE_CHANGED", "ana", "ben"),
        ("INVITE_CREATED", "ana", None),
        ("INVITE_REVOKED", "ben", None),
        ("INVITE_CODE_ROTATED", "ana", None),
        ("SETTINGS_CHANGED", "ben", None),
        ("MEMBER_REMOVED", "ben", "cy"),
        ("MEMBER_LEFT", "dee", "dee"),
    ):
        assert expected in found, expected
    details = {e["type"]: e["detail"] for e in record}
    assert details["ROLE_CHANGED"] == "ADMIN"
    assert details["INVITE_CREATED"] == f"invite {invite['id']}"
    assert details["SETTINGS_CHANGED"] == "postingPolicy ADMINS"
    # Pages, by cursor.
    first = await api.ok(ACTIVITY, {"f": fid, "first": 4}, as_="ben")
    page = first["family"]["activity"]
    assert len(page["edges"]) == 4 and page["pageInfo"]["hasNextPage"] is True
    rest = await api.ok(ACTIVITY, {"f": fid, "first": 100, "after": page["pageInfo"]["endCursor"]}, as_="ben")
    assert [e["node"] for e in page["edges"]] + [
        e["node"] for e in rest["family"]["activity"]["edges"]
    ] == record
    # A MEMBER reads the family and nothing of its record.
    await api.sign_in("eve")
    await join(api, "eve", (await create_invite(api, fid))["code"])
    await api.ok(
        "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
        {"f": fid, "u": "eve"},
        as_="ana",
    )
    member = await api.ok(ACTIVITY, {"f": fid, "first": 100}, as_="eve")
    assert member["family"]["activity"] == {
        "edges": [],
        "pageInfo": {"hasNextPage": False, "endCursor": None},
    }


async def test_a_refused_change_records_nothing(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    before = len(await activity(api, family_id, "ana"))
    await api.error(ROLE, {"f": family_id, "u": "ana", "r": "MEMBER"}, as_="ana")
    await api.error(LEAVE, {"f": family_id}, as_="ana")
    await api.error(REVOKE, {"id": f"{family_id}:nothing"}, as_="ana")
    await api.error(SETTINGS, {"i": {"familyId": family_id, "postingPolicy": "ADMINS"}}, as_="ben")
    assert len(await activity(api, family_id, "ana")) == before


async def test_admins_are_peers_and_a_demoted_admin_acts_no_more(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy", "dee"])
    await set_role(api, family_id, "ben", "ADMIN", as_="ana")
    await set_role(api, family_id, "cy", "ADMIN", as_="ana")
    # One ADMIN removes another.
    remove = "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }"
    assert (await api.ok(remove, {"f": family_id, "u": "cy"}, as_="ben"))["removeMember"] is True
    family_item = await api.table.get(keys.family(family_id))
    assert family_item is not None and family_item["adminCount"] == 2
    assert keys.admin_attribute("cy") not in family_item
    # ben starts removing dee; ana demotes ben, and that commits first: ben's
    # removal, checked at its write, is refused.
    table: Any = api.table
    original = table.transact
    removal_at_write, demoted = asyncio.Event(), asyncio.Event()

    async def ordered(ops: Any) -> None:
        if any(op_key(op) == keys.member(family_id, "dee") for op in ops):
            removal_at_write.set()
            await asyncio.wait_for(demoted.wait(), 30)
            await original(ops)
            return
        await asyncio.wait_for(removal_at_write.wait(), 30)
        await original(ops)
        demoted.set()

    table.transact = ordered
    removal: dict[str, Any]
    try:
        removal, _ = await asyncio.gather(
            api.post(remove, {"f": family_id, "u": "dee"}, as_="ben"),
            api.post(ROLE, {"f": family_id, "u": "ben", "r": "MEMBER"}, as_="ana"),
        )
    finally:
        table.transact = original
    assert removal["errors"][0]["extensions"]["code"] == "CONFLICT", removal
    assert roles(await api.ok(MEMBERS, {"f": family_id}, as_="ana")) == {
        "ana": "ADMIN",
        "ben": "MEMBER",
        "dee": "MEMBER",
    }


async def test_a_family_from_before_co_admins_gets_its_second_admin(api: Api) -> None:
    # Written as families were before: no ADMIN attribute on the family item.
    for row in family_rows("oldfamily", "ana", ["ben"]):
        await api.table.put(row)
    long_ago = items.iso(api.clock.moment - timedelta(days=400))
    await api.table.update(
        Update(keys.family("oldfamily"), set={"adminCount": 1, "memberCount": 2, "createdAt": long_ago})
    )
    data = await api.ok(ADMINS, {"f": "oldfamily"}, as_="ben")
    assert data["family"]["admin"] == {"id": "ana"} and data["family"]["admins"] == [{"id": "ana"}]
    await set_role(api, "oldfamily", "ben", "ADMIN", as_="ana")
    data = await api.ok(ADMINS, {"f": "oldfamily"}, as_="ben")
    assert data["family"]["admin"] == {"id": "ana"}
    assert data["family"]["admins"] == [{"id": "ana"}, {"id": "ben"}]
    await set_role(api, "oldfamily", "ana", "MEMBER", as_="ben")
    data = await api.ok(ADMINS, {"f": "oldfamily"}, as_="ana")
    assert data["family"]["admins"] == [{"id": "ben"}] and data["family"]["admin"] == {"id": "ben"}


async def test_an_invite_to_a_closed_family_still_waits_for_approval(api: Api) -> None:
    family = await make_family(api, "ana", trust="CLOSED")
    invite = await create_invite(api, family["id"], maxUses=1)
    assert (await join(api, "ben", invite["code"]))["role"] == "PENDING"
