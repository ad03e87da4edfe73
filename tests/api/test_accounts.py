"""Deleting one's account through the API, on both engines: exactly what goes
and what stays (a snapshot of the table before and after), the counts kept
right, the last-ADMIN refusal, idempotence, resuming after crashes, and a fresh
start at the next sign-in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from resolvers.domain import accounts
from store import keys
from tests.api.conftest import Api, is_cost_bucket
from tests.factories import join, make_family, put_bytes, settle, start_upload, upload

DELETE = "mutation { deleteMyAccount }"
ME = "{ me { id familyName } }"
APPROVE = "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }"
VOUCH = "mutation($f: ID!, $u: ID!) { vouch(familyId: $f, userId: $u) { vouchScore } }"
COMMENT = "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }"
REACT = "mutation($c: ID!, $e: String!) { addReaction(contentId: $c, emoji: $e) { id } }"
TAG = """mutation($c: ID!, $v: [String!]!, $s: String, $p: Boolean) {
  setTags(contentId: $c, values: $v, setName: $s, private: $p) { value } }"""
CREATE_CAPSULE = "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"
SCHEDULE = "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }"
OPEN = "mutation($id: ID!) { openCapsule(capsuleId: $id) { status } }"
REMOVE = "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }"
LEAVE = "mutation($f: ID!) { leaveFamily(familyId: $f) }"

Snapshot = dict[tuple[str, str], dict[str, Any]]


@dataclass
class Scene:
    f1: str = ""  # ben's VOUCHED family: ana, cai, eve (PENDING)
    f2: str = ""  # ana's own family; dan was in it and left
    f2_code: str = ""
    f9: str = ""  # dan's family, nothing of ana's
    ids: dict[str, str] = field(default_factory=dict)


async def capsule(api: Api, creator: str, family: str, recipients: list[str], **due: float) -> str:
    variables = {
        "i": {
            "familyId": family,
            "title": f"cápsula de {creator}",
            "unlockDate": (api.clock.moment + timedelta(**due)).isoformat(),
            "recipientIds": recipients,
        }
    }
    return str((await api.ok(CREATE_CAPSULE, variables, as_=creator))["createCapsule"]["id"])


async def build_scene(api: Api) -> Scene:
    """ana has a bit of everything; the others have things of their own beside hers."""
    await api.sign_in("ana", "ben", "cai", "dan", "eve")
    scene = Scene()
    f1 = await make_family(api, "ben", "Los García", "VOUCHED", 3)
    scene.f1 = f1["id"]
    for person in ("ana", "cai", "eve"):
        await join(api, person, f1["inviteCode"])
    for person in ("ana", "cai"):
        await api.ok(APPROVE, {"f": scene.f1, "u": person}, as_="ben")
    for voucher in ("ana", "cai"):
        await api.ok(VOUCH, {"f": scene.f1, "u": "eve"}, as_=voucher)

    ids = scene.ids
    ids["a_note"] = await upload(api, "ana", scene.f1, "TEXT", b"hola abuela", "text/plain", "de ana")
    ids["b_note"] = await upload(api, "ben", scene.f1, "TEXT", b"hola ana", "text/plain", "de ben")
    await settle(api)
    await api.ok(COMMENT, {"c": ids["a_note"], "b": "qué bonito"}, as_="ben")
    await api.ok(REACT, {"c": ids["a_note"], "e": "👍"}, as_="cai")
    await api.ok(TAG, {"c": ids["a_note"], "v": ["abuela"], "s": "S"}, as_="ana")
    await api.ok(TAG, {"c": ids["a_note"], "v": ["abuela", "playa"], "s": "S"}, as_="ben")
    for body in ("gracias", "otra vez"):
        await api.ok(COMMENT, {"c": ids["b_note"], "b": body}, as_="ana")
    await api.ok(COMMENT, {"c": ids["b_note"], "b": "de cai"}, as_="cai")
    for who, emoji in (("ana", "👍"), ("ana", "❤️"), ("cai", "👍")):
        await api.ok(REACT, {"c": ids["b_note"], "e": emoji}, as_=who)
    await api.ok(TAG, {"c": ids["b_note"], "v": ["playa"], "s": "S"}, as_="ana")
    await api.ok(TAG, {"c": ids["b_note"], "v": ["playa"], "s": "S"}, as_="cai")

    # ana's capsules: a draft, one scheduled with an upload never completed,
    # one LOCKED for a date to come, one already opened; ben's, for ana and cai.
    ids["c_draft"] = await capsule(api, "ana", scene.f1, ["ben"], days=5)
    ids["c_sched"] = await capsule(api, "ana", scene.f1, ["ben", "cai"], days=5)
    await api.ok(SCHEDULE, {"id": ids["c_sched"]}, as_="ana")
    started = await start_upload(api, "ana", scene.f1, "TEXT", "text/plain", 4, "a medias", ids["c_sched"])
    assert await put_bytes(api, started["uploadUrl"], b"nada", "text/plain") == 200
    ids["sched_content"] = started["content"]["id"]
    ids["c_locked"] = await capsule(api, "ana", scene.f1, ["ben"], days=3)
    await api.ok(SCHEDULE, {"id": ids["c_locked"]}, as_="ana")
    ids["locked_content"] = await upload(
        api, "ana", scene.f1, "TEXT", b"para ben", "text/plain", "sellado", ids["c_locked"]
    )
    ids["c_open"] = await capsule(api, "ana", scene.f1, ["ben"], hours=1)
    await api.ok(SCHEDULE, {"id": ids["c_open"]}, as_="ana")
    ids["open_content"] = await upload(
        api, "ana", scene.f1, "TEXT", b"ya abierto", "text/plain", "abierto", ids["c_open"]
    )
    ids["c_ben"] = await capsule(api, "ben", scene.f1, ["ana", "cai"], days=5)
    await api.ok(SCHEDULE, {"id": ids["c_ben"]}, as_="ben")
    await settle(api)
    api.clock.advance(hours=2)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    await api.ok(OPEN, {"id": ids["c_open"]}, as_="ben")

    # ana's own family: dan posted there and left; it dissolves with her.
    f2 = await make_family(api, "ana", "Solo yo")
    scene.f2, scene.f2_code = f2["id"], f2["inviteCode"]
    await join(api, "dan", f2["inviteCode"])
    ids["f2_note"] = await upload(api, "ana", scene.f2, "TEXT", b"sola", "text/plain", "mía")
    ids["dan_f2_note"] = await upload(api, "dan", scene.f2, "TEXT", b"de paso", "text/plain", "de dan")
    await settle(api)
    await api.ok(TAG, {"c": ids["f2_note"], "v": ["casa"], "s": "F2"}, as_="ana")
    await api.ok(LEAVE, {"f": scene.f2}, as_="dan")

    f9 = await make_family(api, "dan", "Otra familia")
    scene.f9 = f9["id"]
    ids["d_note"] = await upload(api, "dan", scene.f9, "TEXT", b"lejos", "text/plain", "de dan")
    await settle(api)

    export = await api.ok("mutation { requestDataExport { id } }", as_="ana")
    ids["export"] = export["requestDataExport"]["id"]
    await api.services.exports.queue.join()
    return scene


def expected_gone(before: Snapshot, scene: Scene) -> set[tuple[str, str]]:
    """What deleting ana's account removes, by the shape of each key."""
    ids = scene.ids
    purged = {
        f"CONTENT#{ids[n]}" for n in ("a_note", "sched_content", "open_content", "f2_note", "dan_f2_note")
    }
    capsules = {f"CAPSULE#{ids[n]}" for n in ("c_draft", "c_sched", "c_open")}
    gone = set()
    for (pk, sk), item in before.items():
        if (
            pk == "USER#ana"
            or pk in purged
            or pk in capsules
            or pk == f"FAMILY#{scene.f2}"
            or pk == f"INVITE#{scene.f2_code}"
            or pk.startswith("TAG#ana#")
            or pk == f"TAG#ben#{ids['a_note']}"
            or pk.startswith(f"TAGSET#{scene.f2}#")
            or (pk.startswith("TAGSET#") and sk == "USER#ana")
            # ben's only tags in the set were on ana's note.
            or (pk == f"TAGSET#{scene.f1}#S" and sk == "USER#ben")
            or (pk, sk) in {(f"FAMILY#{scene.f1}", "MEMBER#ana"), (f"FAMILY#{scene.f1}", "VOUCH#eve#ana")}
            or (pk, sk) == (f"CAPSULE#{ids['c_ben']}", "RECIPIENT#ana")
            or (
                pk == f"CONTENT#{ids['b_note']}"
                and (
                    (sk.startswith("COMMENT#") and item["authorId"] == "ana")
                    or (sk.startswith("REACTION#") and sk.endswith("#ana"))
                    or sk == "REACTOR#ana"
                )
            )
        ):
            gone.add((pk, sk))
    return gone


def check_end_state(before: Snapshot, after: Snapshot, scene: Scene) -> None:
    ids = scene.ids
    # One thing is new: the admins' record of the family ana left says so.
    (added,) = set(after) - set(before)
    assert added[0] == keys.family_pk(scene.f1) and added[1].startswith(keys.FAMILY_EVENT_PREFIX)
    assert after[added]["eventType"] == "MEMBER_LEFT" and after[added]["actorId"] == "ana"
    after = {key: item for key, item in after.items() if key != added}
    assert set(before) - set(after) == expected_gone(before, scene)
    changed = {key for key in after if after[key] != before[key]}
    b_note, summary = keys.content(ids["b_note"]), keys.content_tags(ids["b_note"])
    eve, any_s = keys.member(scene.f1, "eve"), keys.tagset_any(scene.f1, "S")
    c_ben = keys.capsule(ids["c_ben"])
    # The family ana left counts one member fewer.
    family = keys.family(scene.f1)
    assert changed == {b_note, summary, eve, any_s, c_ben, family}
    assert after[family]["memberCount"] == before[family]["memberCount"] - 1

    def differs(key: tuple[str, str]) -> dict[str, tuple[Any, Any]]:
        names = set(before[key]) | set(after[key])
        return {
            n: (before[key].get(n), after[key].get(n))
            for n in names
            if before[key].get(n) != after[key].get(n)
        }

    assert differs(b_note) == {"commentCount": (3, 1), "R#👍": (2, 1), "R#❤️": (1, 0)}
    assert differs(eve) == {"vouchScore": (2, 1)}
    # Five public tags in the set: ana's two, ben's two on ana's note, cai's one.
    assert differs(any_s) == {"count": (5, 1)}
    assert differs(c_ben) == {"recipientIds": (["ana", "cai"], ["cai"])}
    assert [(t["authorId"], t["value"]) for t in after[summary]["tags"]] == [("cai", "playa")]


async def check_blobs(api: Api, scene: Scene, export_file: str) -> None:
    blobs = api.services.blobs
    ids = scene.ids
    for name in ("a_note", "sched_content", "open_content", "f2_note", "dan_f2_note"):
        assert await blobs.head(f"content/{ids[name]}/original") is None, name
    for name in ("b_note", "locked_content", "d_note"):
        assert await blobs.head(f"content/{ids[name]}/original") is not None, name
    assert await blobs.head(export_file) is None


async def export_file(api: Api) -> str:
    """The file of ana's one export, built."""
    page = await api.table.query("USER#ana")
    found = [i for i in page.items if i["SK"].startswith(keys.EXPORT_PREFIX)]
    assert len(found) == 1 and found[0]["status"] == "READY"
    return str(found[0]["blobKey"])


async def test_deleting_an_account_removes_exactly_what_was_theirs(api: Api) -> None:
    scene = await build_scene(api)
    file = await export_file(api)
    assert await api.services.blobs.head(file) is not None
    before = await api.snapshot()

    assert (await api.ok(DELETE, as_="ana"))["deleteMyAccount"] is True
    await api.services.accounts.idle()  # what did not fit in the request's time
    after = await api.snapshot()
    check_end_state(before, after, scene)
    await check_blobs(api, scene, file)

    # Idempotent: once more, and nothing changes.
    assert (await api.ok(DELETE, as_="ana"))["deleteMyAccount"] is True
    assert await api.snapshot() == after

    # ben's feed and note read as they should, counts included.
    note = await api.ok(
        """query($id: ID!) { content(id: $id) { commentCount reactions { emoji count }
        comments { edges { node { body author { id } } } } tags { value author { id } } } }""",
        {"id": scene.ids["b_note"]},
        as_="ben",
    )
    assert note["content"] == {
        "commentCount": 1,
        "reactions": [{"emoji": "👍", "count": 1}],
        "comments": {"edges": [{"node": {"body": "de cai", "author": {"id": "cai"}}}]},
        "tags": [{"value": "playa", "author": {"id": "cai"}}],
    }
    status = await api.ok(
        'query($f: ID!) { tagStatus(familyId: $f, setName: "S") { taggedByAnyone } }',
        {"f": scene.f1},
        as_="ben",
    )
    assert status["tagStatus"]["taggedByAnyone"] is True

    # The LOCKED capsule still opens for ben, from someone who is no longer here.
    api.clock.advance(days=3)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    opened = await api.ok(
        """query($id: ID!) { capsule(id: $id) { status recipients { user { id } }
        creator { id givenName } content { title author { id givenName email } } } }""",
        {"id": scene.ids["c_locked"]},
        as_="ben",
    )
    assert opened["capsule"] == {
        "status": "AVAILABLE",
        "recipients": [{"user": {"id": "ben"}}],
        "creator": {"id": "ana", "givenName": None},
        "content": {"title": "sellado", "author": {"id": "ana", "givenName": None, "email": None}},
    }


async def test_the_next_sign_in_starts_afresh(api: Api) -> None:
    await api.sign_in("ana", "ben")
    family = await make_family(api, "ben", "Los García")
    await join(api, "ana", family["inviteCode"])
    await api.ok('mutation { updateProfile(input: {familyName: "Pérez"}) { id } }', as_="ana")
    first = (await api.ok("{ me { createdAt } }", as_="ana"))["me"]["createdAt"]
    assert (await api.ok(DELETE, as_="ana"))["deleteMyAccount"] is True
    await api.services.accounts.idle()
    assert await api.table.get(keys.user("ana")) is None

    me = await api.ok(
        """{ me { id givenName familyName createdAt onboardingComplete }
        myFamilies { role } notifications { edges { node { id } } } myCapsules { edges { node { id } } } }""",
        as_="ana",
    )
    assert me["me"]["id"] == "ana" and me["me"]["givenName"] == "Ana"
    assert me["me"]["familyName"] is None and me["me"]["createdAt"] > first
    assert me["myFamilies"] == [] and me["notifications"]["edges"] == [] and me["myCapsules"]["edges"] == []


async def test_the_last_admin_hands_over_first(api: Api) -> None:
    await api.sign_in("ana", "ben")
    family = await make_family(api, "ana", "Los García", "CLOSED")
    await join(api, "ben", family["inviteCode"])  # PENDING still counts: someone must admit him
    before = await api.snapshot()
    code, message = await api.error(DELETE, as_="ana")
    assert code == "CONFLICT"
    assert "last ADMIN" in message and "Los García" in message and "hand it over" in message
    assert await api.snapshot() == before

    await api.ok(REMOVE, {"f": family["id"], "u": "ben"}, as_="ana")
    assert (await api.ok(DELETE, as_="ana"))["deleteMyAccount"] is True
    await api.services.accounts.idle()
    left = await api.snapshot()
    assert not [key for key in left if family["id"] in key[0] or key[0].startswith("USER#ana")]
    assert not [key for key in left if key[0] == f"INVITE#{family['inviteCode']}"]
    code, _ = await api.error(
        "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }",
        {"c": family["inviteCode"]},
        as_="ben",
    )
    assert code == "BAD_USER_INPUT"


class Crash(Exception):
    pass


@contextlib.contextmanager
def crash_after(api: Api, writes: int, *, landed: bool) -> Iterator[None]:
    """The process dies at the table's `writes + 1`-th write of the request:
    that write lands or not, and nothing is written after it."""
    table = api.table
    done = 0

    def wrap(name: str) -> Any:
        original = getattr(table, name)

        async def write(*args: Any, **kwargs: Any) -> Any:
            nonlocal done
            if name == "update" and is_cost_bucket(args[0].key):
                return await original(*args, **kwargs)  # the request's charge, not the deletion's
            done += 1
            if done <= writes:
                return await original(*args, **kwargs)
            if landed and done == writes + 1:
                await original(*args, **kwargs)
            raise Crash(f"crashed at write {done}")

        return write

    names = ("put", "update", "delete", "batch_write", "transact")
    for name in names:
        setattr(table, name, wrap(name))
    try:
        yield
    finally:
        for name in names:
            delattr(table, name)


async def test_a_deletion_resumes_after_crashes(api: Api) -> None:
    scene = await build_scene(api)
    file = await export_file(api)
    before = await api.snapshot()
    for attempt in range(6):
        with crash_after(api, 3, landed=attempt % 2 == 1):
            code, _ = await api.error(DELETE, as_="ana")
        assert code == "INTERNAL_SERVER_ERROR"
    assert await api.table.get(keys.account_deletion("ana")) is not None  # halfway

    # Nobody holds it once the lease runs out: the sweep finishes it.
    api.clock.advance(seconds=api.services.settings.pipeline_lease_seconds + 1)
    assert await api.services.accounts.sweep(api.services) == 1
    check_end_state(before, await api.snapshot(), scene)
    await check_blobs(api, scene, file)


async def test_a_sign_in_finishes_a_stopped_deletion(api: Api) -> None:
    scene = await build_scene(api)
    file = await export_file(api)
    before = await api.snapshot()
    # Crash after crash, each call goes further.
    for attempt in range(4):
        with crash_after(api, 5, landed=attempt % 2 == 0):
            code, _ = await api.error(DELETE, as_="ana")
        assert code == "INTERNAL_SERVER_ERROR"
    # The person comes back meanwhile: their request finishes the deletion first,
    # or, when that takes longer than its share of the request's time, says so
    # and leaves it to the background.
    body = await api.post(ME, as_="ana")
    if body.get("errors"):
        assert body["errors"][0]["extensions"]["code"] == "CONFLICT", body
        assert "still being deleted" in body["errors"][0]["message"]
        await api.services.accounts.idle()
        body = await api.post(ME, as_="ana")
    assert body["data"]["me"] == {"id": "ana", "familyName": None}, body
    after = await api.snapshot()
    profile = after.pop(keys.user("ana"))
    assert profile["givenName"] == "Ana"
    check_end_state(before, after, scene)
    await check_blobs(api, scene, file)


async def test_a_long_deletion_finishes_in_the_background(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.sign_in("ana", "ben")
    family = await make_family(api, "ben", "Los García")
    await join(api, "ana", family["inviteCode"])
    mine = await upload(api, "ana", family["id"], "TEXT", b"hola", "text/plain", "de ana")
    theirs = await upload(api, "ben", family["id"], "TEXT", b"adios", "text/plain", "de ben")
    await settle(api)
    await api.ok(COMMENT, {"c": theirs, "b": "de ana"}, as_="ana")
    # No time at all within a request: each stops at its first wait (deleting
    # the blobs of ana's note) and hands over; the hand-over is held back here.
    handed_over: list[str] = []
    monkeypatch.setattr(accounts, "REQUEST_SHARE", 1e-9)
    monkeypatch.setattr(api.services.accounts, "resume", lambda services, user: handed_over.append(user))
    assert (await api.ok(DELETE, as_="ana"))["deleteMyAccount"] is True
    assert handed_over == ["ana"]
    marker = await api.table.get(keys.account_deletion("ana"))
    assert marker is not None and marker["leaseOwner"] is None  # handed back for the sweep
    code, message = await api.error(ME, as_="ana")  # the person's next request
    assert code == "CONFLICT" and "still being deleted" in message
    assert handed_over == ["ana", "ana"]
    monkeypatch.undo()

    api.services.accounts.resume(api.services, "ana")
    await api.services.accounts.idle()
    left = await api.snapshot()
    assert not [key for key in left if key[0] in ("USER#ana", f"CONTENT#{mine}")]
    assert left[keys.content(theirs)]["commentCount"] == 0
    assert await api.services.blobs.head(f"content/{mine}/original") is None
    assert (await api.ok(ME, as_="ana"))["me"] == {"id": "ana", "familyName": None}


# A deletion hides the person's things at once ---------------------------------------------

SEEN = """query($f: ID!, $c: ID!) {
  family(id: $f) { feed(first: 20) { edges { node { id author { id } } } } }
  content(id: $c) {
    comments(first: 20) { edges { node { body author { id } } } }
    tags { value author { id } }
  }
  searchTags(familyId: $f, prefix: "pla") { edges { node { value author { id } content { id } } } }
}"""
BY_ID = "query($c: ID!) { content(id: $c) { id title } }"


@dataclass
class Departure:
    family: str
    mine: str  # ana's note
    theirs: str  # ben's note, with ana's comment and tag beside ben's


async def departure_scene(api: Api) -> Departure:
    await api.sign_in("ana", "ben")
    family = await make_family(api, "ben", "Los García")
    await join(api, "ana", family["inviteCode"])
    mine = await upload(api, "ana", family["id"], "TEXT", b"hola", "text/plain", "de ana")
    theirs = await upload(api, "ben", family["id"], "TEXT", b"adios", "text/plain", "de ben")
    await settle(api)
    await api.ok(COMMENT, {"c": theirs, "b": "de ana"}, as_="ana")
    await api.ok(COMMENT, {"c": theirs, "b": "de ben"}, as_="ben")
    await api.ok(TAG, {"c": theirs, "v": ["playa"], "s": "S"}, as_="ana")
    await api.ok(TAG, {"c": theirs, "v": ["playa"], "s": "S"}, as_="ben")
    return Departure(family["id"], mine, theirs)


async def seen_by_ben(api: Api, scene: Departure) -> tuple[set[str], set[str]]:
    """(the content ids ben is shown, the people whose things ben is shown)."""
    data = await api.ok(SEEN, {"f": scene.family, "c": scene.theirs}, as_="ben")
    feed = [edge["node"] for edge in data["family"]["feed"]["edges"]]
    comments = [edge["node"] for edge in data["content"]["comments"]["edges"]]
    found = [edge["node"] for edge in data["searchTags"]["edges"]]
    people = {node["author"]["id"] for node in feed + comments + data["content"]["tags"] + found}
    return {node["id"] for node in feed} | {node["content"]["id"] for node in found}, people


async def check_hidden(api: Api, scene: Departure) -> None:
    contents, people = await seen_by_ben(api, scene)
    assert contents == {scene.theirs} and people == {"ben"}
    code, _ = await api.error(BY_ID, {"c": scene.mine}, as_="ben")
    assert code == "NOT_FOUND"


async def test_a_deletion_cut_short_hides_the_persons_things_at_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene = await departure_scene(api)
    assert await seen_by_ben(api, scene) == ({scene.mine, scene.theirs}, {"ana", "ben"})
    # No time at all within the request: it stops at its first wait and hands
    # over to the background, held back here.
    monkeypatch.setattr(accounts, "REQUEST_SHARE", 1e-9)
    monkeypatch.setattr(api.services.accounts, "resume", lambda services, user: None)
    assert (await api.ok(DELETE, as_="ana"))["deleteMyAccount"] is True
    monkeypatch.undo()
    assert await api.table.get(keys.account_deletion("ana")) is not None
    # Nothing of ana's is deleted yet, and nothing of it is shown.
    assert await api.table.get(keys.content(scene.mine)) is not None
    await check_hidden(api, scene)

    api.services.accounts.resume(api.services, "ana")
    await api.services.accounts.idle()
    await check_hidden(api, scene)
    assert await api.table.get(keys.content(scene.mine)) is None
    family = await api.table.get(keys.family(scene.family))
    assert family is not None and keys.departing_attribute("ana") not in family


async def test_a_deletion_that_crashes_never_shows_the_persons_things_again(api: Api) -> None:
    scene = await departure_scene(api)
    for attempt in range(6):
        with crash_after(api, 3, landed=attempt % 2 == 1):
            code, _ = await api.error(DELETE, as_="ana")
        assert code == "INTERNAL_SERVER_ERROR"
        await check_hidden(api, scene)
    # Whatever is left, the sweep finishes once the lease has run out.
    api.clock.advance(seconds=api.services.settings.pipeline_lease_seconds + 1)
    await api.services.accounts.sweep(api.services)
    await check_hidden(api, scene)
    assert await api.table.get(keys.account_deletion("ana")) is None
    assert await api.table.get(keys.content(scene.mine)) is None
    family = await api.table.get(keys.family(scene.family))
    assert family is not None and keys.departing_attribute("ana") not in family
