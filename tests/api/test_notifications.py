"""Notifications read in one step: `unreadCount` stays exact through
every change of read state, on both engines, and marking costs a fixed number
of store round trips however many notifications there are."""

from __future__ import annotations

from typing import Any

from resolvers.domain import notifications
from store.enums import NotificationType
from store.items import Notification
from tests.api.conftest import Api
from tests.api.test_capsules import SCHEDULE, make_capsule, unlock
from tests.api.test_round_trips import measure
from tests.factories import family_with_members, settle, upload

STATE = """{ notifications(first: 100) { unreadCount edges { node { id type read } } pageInfo { hasNextPage } }
  unread: notifications(first: 100, unreadOnly: true) { unreadCount edges { node { id read } } } }"""
MARK = "mutation($ids: [ID!]) { markNotificationsRead(ids: $ids) }"
MARK_ALL = "mutation { markNotificationsRead }"


async def state(api: Api, person: str) -> tuple[int, list[dict[str, Any]]]:
    """The unread count, after checking it against every way of reading it:
    the unread-only listing, and the `read` flags of the whole listing."""
    data = await api.ok(STATE, as_=person)
    everything = [e["node"] for e in data["notifications"]["edges"]]
    unread = [e["node"] for e in data["unread"]["edges"]]
    count = data["notifications"]["unreadCount"]
    assert data["unread"]["unreadCount"] == count
    assert all(note["read"] is False for note in unread)
    if not data["notifications"]["pageInfo"]["hasNextPage"]:
        assert [n["id"] for n in unread] == [n["id"] for n in everything if not n["read"]]
    assert count == len(unread)
    return count, everything


async def mark(api: Api, person: str, ids: list[str] | None = None) -> int:
    if ids is None:
        return int((await api.ok(MARK_ALL, as_=person))["markNotificationsRead"])
    return int((await api.ok(MARK, {"ids": ids}, as_=person))["markNotificationsRead"])


async def test_unread_count_is_exact_across_every_change(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy", "dee"])
    assert (await state(api, "ana"))[0] == 3  # MEMBER_JOINED, three times
    for n in range(3):
        await upload(api, "ben", family_id, "TEXT", f"hola {n}".encode(), "text/plain")
    await settle(api)
    count, notes = await state(api, "ana")
    assert count == 6 and len(notes) == 6

    first = notes[0]["id"]
    assert await mark(api, "ana", [first]) == 1
    assert (await state(api, "ana"))[0] == 5
    assert await mark(api, "ana", [first, first]) == 0  # read already: counted once
    assert (await state(api, "ana"))[0] == 5

    # Two at once, beside ids that name nothing: those change nothing.
    cys = [n["id"] for n in (await state(api, "cy"))[1]]
    note_id, _, created_at = notes[1]["id"].split(".", 2)
    bogus = ["nope", "", cys[0], f"{note_id}.7.{created_at}", f"{note_id}.x.{created_at}", "a#b.0.c"]
    assert await mark(api, "ana", [notes[1]["id"], notes[2]["id"], *bogus]) == 2
    assert (await state(api, "ana"))[0] == 3

    assert await mark(api, "ana") == 3
    count, after = await state(api, "ana")
    assert count == 0 and all(n["read"] for n in after)
    assert await mark(api, "ana") == 0

    # Written after "mark everything read": unread, and counted.
    await upload(api, "ben", family_id, "TEXT", b"otra", "text/plain")
    await settle(api)
    count, now = await state(api, "ana")
    assert count == 1 and now[0]["read"] is False and len(now) == 7
    assert await mark(api, "ana", [notes[3]["id"]]) == 0  # read by the epoch already
    assert (await state(api, "ana"))[0] == 1
    assert await mark(api, "ana", [now[0]["id"]]) == 1
    assert (await state(api, "ana"))[0] == 0
    # Nobody else's count moved.
    assert (await state(api, "cy"))[0] == 4  # ben's four posts (joinings are told to ADMINs)


async def test_ids_of_nobody_change_nothing_in_the_table(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    bens = [n["id"] for n in (await state(api, "ben"))[1]]
    anas = [n["id"] for n in (await state(api, "ana"))[1]]
    before = await api.snapshot()
    note_id, _, created_at = anas[0].split(".", 2)
    assert await mark(api, "ana", [*bens, f"{note_id}.3.{created_at}", f"{note_id}.0.2001-01-01"]) == 0
    assert await api.snapshot() == before
    assert (await state(api, "ben"))[0] == 1 and (await state(api, "ana"))[0] == 1


async def test_a_replayed_notification_is_counted_once(api: Api) -> None:
    await api.sign_in("ana")
    note = Notification(
        user_id="ana", id="n" * 24, type=NotificationType.MEMBER_JOINED, created_at=api.services.now_iso()
    )
    assert [n.id for n in await notifications.write(api.table, None, [note])] == [note.id]
    assert await notifications.write(api.table, None, [note]) == []
    assert (await state(api, "ana"))[0] == 1


async def test_capsule_notifications_are_counted_in_and_beside_the_unlock(api: Api) -> None:
    # 40 recipients: their notifications and counts do not fit in the unlock's
    # transaction and are written just before it; 2 fit in it.
    many = [f"m{n}" for n in range(40)]
    family_id = await family_with_members(api, "ana", ["ben", "cy", *many])
    small = await make_capsule(api, "ana", family_id, ["ben", "cy"])
    big = await make_capsule(api, "ana", family_id, many)
    for capsule_id in (small, big):
        await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
        await upload(api, "ana", family_id, "TEXT", b"te quiero", "text/plain", capsule_id=capsule_id)
    await settle(api)
    assert (await state(api, "ben"))[0] == 0
    result = await unlock(api)
    assert result.unlocked == 2 and result.failed == 0
    for person, expected in (("ben", 1), ("m0", 1), ("m39", 1), ("ana", 42 + 2)):
        count, notes = await state(api, person)
        assert count == expected, person
        assert [n["type"] for n in notes].count("CAPSULE_UNLOCKED") == (2 if person == "ana" else 1)
    assert (await unlock(api)).unlocked == 0
    assert (await state(api, "m0"))[0] == 1


async def test_leaving_keeps_the_count_and_deleting_the_account_drops_it(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    assert (await state(api, "ben"))[0] == 1
    # What one was told stays, and counts, after leaving the family (its links go).
    await api.ok("mutation($f: ID!) { leaveFamily(familyId: $f) }", {"f": family_id}, as_="ben")
    count, notes = await state(api, "ben")
    assert count == 1 and notes[0]["type"] == "NEW_CONTENT"
    assert (await api.ok(MARK_ALL, as_="ben"))["markNotificationsRead"] == 1

    assert (await api.ok("mutation { deleteMyAccount }", as_="ben"))["deleteMyAccount"] is True
    left = [key for key in await api.snapshot() if key[0] == "USER#ben"]
    assert left == []
    # A fresh start, with a fresh count.
    assert await state(api, "ben") == (0, [])
    assert (await state(api, "ana"))[0] == 1  # ben's joining


async def test_marking_costs_a_fixed_number_of_round_trips(api: Api) -> None:
    await api.sign_in("ana")
    now = api.services.now_iso()
    notes = [
        Notification(user_id="ana", id=f"{n:024d}", type=NotificationType.MEMBER_JOINED, created_at=now)
        for n in range(130)
    ]
    assert len(await notifications.write(api.table, None, notes)) == 130

    _, rounds, calls = await measure(api, "{ notifications { unreadCount } }", {}, "ana")
    assert calls == {"batch_get": 1} and rounds == 1
    query = "{ notifications(first: 100) { unreadCount edges { node { id read } } } }"
    _, rounds, calls = await measure(api, query, {}, "ana")
    assert calls == {"batch_get": 1, "query": 1} and rounds == 1

    data = await api.ok(query, as_="ana")
    assert data["notifications"]["unreadCount"] == 130
    hundred = [e["node"]["id"] for e in data["notifications"]["edges"]]
    assert len(hundred) == 100
    # 100 notes and a counter do not fit one transaction: two, in parallel.
    _, rounds, calls = await measure(api, MARK, {"ids": hundred}, "ana")
    assert calls == {"transact": 2} and rounds == 1
    assert (await state(api, "ana"))[0] == 30

    _, rounds, calls = await measure(api, MARK_ALL, {}, "ana")
    assert calls == {"batch_get": 1, "transact": 1} and rounds == 2
    assert (await state(api, "ana"))[0] == 0
    _, rounds, calls = await measure(api, MARK_ALL, {}, "ana")  # nothing unread: nothing to write
    assert calls == {"batch_get": 1} and rounds == 1
