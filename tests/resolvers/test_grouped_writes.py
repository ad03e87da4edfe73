"""Many conditional updates in few calls (`store.port.update_each`), and the
group commit the push workers write through (`resolvers.core.grouped`), on both
engines: each update stands or falls on its own condition."""

from __future__ import annotations

import asyncio

from resolvers.core.grouped import GroupedWrites
from store.port import MAX_TRANSACTION_ITEMS, ConditionFailed, Key, Table, Update, eq, update_each
from tests.counting import CountingTable


def key(n: int) -> Key:
    return (f"ITEM#{n}", "META")


async def seeded(table: Table, count: int) -> None:
    await table.batch_write(
        [{"PK": k[0], "SK": k[1], "n": n, "state": "open"} for n, k in enumerate(map(key, range(count)))]
    )


def close(n: int) -> Update:
    return Update(key(n), set={"state": "closed"}, condition=eq("state", "open"))


async def states(table: Table, count: int) -> list[str]:
    found = await table.batch_get([key(n) for n in range(count)])
    return [found[key(n)]["state"] for n in range(count)]


async def test_a_failed_condition_leaves_out_its_update_alone(table: Table) -> None:
    count = MAX_TRANSACTION_ITEMS + 20  # two transactions
    await seeded(table, count)
    await table.update(Update(key(3), set={"state": "taken"}))
    await table.update(Update(key(110), set={"state": "taken"}))
    counting = CountingTable(table)
    refused = await update_each(counting, [close(n) for n in range(count)])
    assert refused == {key(3), key(110)}
    expected = ["taken" if n in (3, 110) else "closed" for n in range(count)]
    assert await states(table, count) == expected
    # One transaction a chunk, and one more for each chunk that had a refusal.
    assert counting.calls == {"transact": 4}


async def test_grouped_writes_commit_together_and_fail_alone(table: Table) -> None:
    await seeded(table, 30)
    await table.update(Update(key(7), set={"state": "taken"}))
    counting = CountingTable(table)
    writes = GroupedWrites(counting)
    outcomes = await asyncio.gather(*(writes.update(close(n)) for n in range(30)), return_exceptions=True)
    assert [n for n, outcome in enumerate(outcomes) if isinstance(outcome, ConditionFailed)] == [7]
    assert all(outcome is None for n, outcome in enumerate(outcomes) if n != 7)
    assert await states(table, 30) == ["taken" if n == 7 else "closed" for n in range(30)]
    assert counting.calls == {"transact": 2}  # the 30 together; again without the refused one
    # Two writes of one item go in two commits, in their order.
    first = writes.update(Update(key(0), set={"state": "a"}))
    second = writes.update(Update(key(0), set={"state": "b"}, condition=eq("state", "a")))
    await asyncio.gather(first, second)
    assert (await table.get(key(0)) or {})["state"] == "b"
    await writes.stop()


async def test_a_lone_update_is_a_plain_update(table: Table) -> None:
    await seeded(table, 1)
    counting = CountingTable(table)
    assert await update_each(counting, [close(0)]) == set()
    assert counting.calls == {"update": 1}
