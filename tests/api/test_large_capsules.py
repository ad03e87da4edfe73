"""Capsules as large as a family, through the API on both engines: 300
recipients created, scheduled, listed in pages and opened with exactly one
notification each, also when the opening is cut short between its steps; and
the family size limit that bounds them."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest

from resolvers.core import slices
from resolvers.domain import families, notifications
from store import keys
from store.items import Recipient
from store.port import StoreError, op_key
from tests.api.conftest import Api, dump
from tests.api.test_capsules import SCHEDULE, make_capsule, unlock
from tests.factories import family_rows, join, make_family, settle, upload

PEOPLE = [f"p{n:03d}" for n in range(300)]
PAGE = """query($id: ID!, $after: ID) { capsule(id: $id) {
  recipients(first: 100, after: $after) { user { id } notifiedAt } } }"""


async def big_family(api: Api) -> str:
    family_id = "bigfamily"
    await api.table.batch_write(family_rows(family_id, "ana", PEOPLE))
    return family_id


async def sealed_for_everyone(api: Api) -> str:
    family_id = await big_family(api)
    capsule_id = await make_capsule(api, "ana", family_id, PEOPLE, days=1)
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    await upload(api, "ana", family_id, "TEXT", b"para todos", "text/plain", capsule_id=capsule_id)
    await settle(api)
    return capsule_id


async def unlocked_notes(api: Api, capsule_id: str) -> Counter[str]:
    items = await dump(api.table)
    return Counter(
        item["userId"]
        for item in items.values()
        if item.get("type") == "Notification" and item.get("capsuleId") == capsule_id
    )


async def pages_of_recipients(api: Api, capsule_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = None
    while True:
        page = (await api.ok(PAGE, {"id": capsule_id, "after": after}, as_="ana"))["capsule"]["recipients"]
        if not page:
            return found
        found += page
        after = page[-1]["user"]["id"]


async def test_a_capsule_for_300_opens_once_for_each(api: Api) -> None:
    capsule_id = await sealed_for_everyone(api)
    received = await api.ok("{ receivedCapsules { edges { node { id status } } } }", as_=PEOPLE[-1])
    assert received["receivedCapsules"]["edges"] == [{"node": {"id": capsule_id, "status": "LOCKED"}}]
    assert (await unlock(api)).unlocked == 1
    assert await unlocked_notes(api, capsule_id) == Counter({person: 1 for person in ["ana", *PEOPLE]})
    listed = await pages_of_recipients(api, capsule_id)
    assert [r["user"]["id"] for r in listed] == PEOPLE
    assert all(r["notifiedAt"] for r in listed)
    # Another pass finds nothing more to do.
    assert (await api.services.scheduler.run_once()).unlocked == 0
    assert set((await unlocked_notes(api, capsule_id)).values()) == {1}


async def test_an_opening_cut_short_between_batches_is_finished_once(api: Api) -> None:
    capsule_id = await sealed_for_everyone(api)
    table = api.table
    transact = table.transact
    calls = 0

    async def dies_on_the_second_batch(ops: Any) -> None:
        nonlocal calls
        if any(op_key(op)[1].startswith(keys.NOTIFICATION_PREFIX) for op in ops):
            calls += 1
            if calls == 2:
                raise StoreError("the process died here")
        await transact(ops)

    table.transact = dies_on_the_second_batch  # type: ignore[method-assign]
    try:
        first = await unlock(api)
    finally:
        del table.transact
    assert first.unlocked == 0 and first.failed == 1
    assert 0 < sum((await unlocked_notes(api, capsule_id)).values()) < 301
    # The next pass (this process still owns the UNLOCKING capsule) finishes it.
    assert (await api.services.scheduler.run_once()).unlocked == 1
    assert await unlocked_notes(api, capsule_id) == Counter({person: 1 for person in ["ana", *PEOPLE]})


async def test_a_family_is_full_at_its_limit(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(families, "MAX_MEMBERS", 3)
    family = await make_family(api, "ana")
    await join(api, "ben", family["inviteCode"])
    await join(api, "cy", family["inviteCode"])
    code, message = await api.error(
        "mutation($code: String!) { joinFamily(inviteCode: $code) { role } }",
        {"code": family["inviteCode"]},
        as_="dee",
    )
    assert code == "CONFLICT" and "at most 3 members" in message
    # Leaving makes room again.
    await api.ok("mutation($id: ID!) { leaveFamily(familyId: $id) }", {"id": family["id"]}, as_="cy")
    await join(api, "dee", family["inviteCode"])


class Turns:
    """Counts turns of the event loop (a task that only yields), and for each
    watched function how many calls it made in one turn at most: a loop over a
    whole family that never yields makes them all in one."""

    def __init__(self) -> None:
        self.turn = 0
        self.calls: dict[str, Counter[int]] = {}

    async def spin(self) -> None:
        while True:
            self.turn += 1
            await asyncio.sleep(0)

    def watch(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        original = getattr(owner, name)
        seen = self.calls.setdefault(name, Counter())

        def counted(*args: Any, **kwargs: Any) -> Any:
            seen[self.turn] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    def most_in_one_turn(self, name: str) -> int:
        return max(self.calls[name].values())

    def total(self, name: str) -> int:
        return sum(self.calls[name].values())


async def test_a_capsule_for_1000_is_built_and_opened_in_slices(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    people = [f"q{n:04d}" for n in range(999)]  # with ana: the family's limit
    family_id = "wholefamily"
    await api.table.batch_write(family_rows(family_id, "ana", people))
    turns = Turns()
    turns.watch(monkeypatch, Recipient, "to_item")  # createCapsule's recipient items
    turns.watch(monkeypatch, keys, "recipient")  # scheduling, and the unlock's stamps
    turns.watch(monkeypatch, notifications, "unlocked_id")  # the unlock's notes and events
    spinner = asyncio.create_task(turns.spin())
    try:
        capsule_id = await make_capsule(api, "ana", family_id, ["ana", *people], days=1)
        await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
        await upload(api, "ana", family_id, "TEXT", b"para todos", "text/plain", capsule_id=capsule_id)
        await settle(api)
        assert (await unlock(api)).unlocked == 1
    finally:
        spinner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await spinner
    assert turns.total("to_item") >= 1000
    assert turns.total("recipient") >= 2000  # listed when scheduled, stamped when opened
    assert turns.total("unlocked_id") >= 2000  # a note and an event each
    # Other tasks ran between every slice of each of those loops.
    for name in ("to_item", "recipient", "unlocked_id"):
        assert turns.most_in_one_turn(name) <= slices.SLICE <= 100, name
    # And what was written is the same as ever: one note each, every stamp.
    assert await unlocked_notes(api, capsule_id) == Counter({person: 1 for person in ["ana", *people]})
