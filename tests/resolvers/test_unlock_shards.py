"""The unlock shards divided between scheduler processes (a lease per shard):
each capsule opens once, only a shard's holder reads and races for it, and a
dead or stopped process's shards are taken over. On both engines."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from resolvers.core.config import Settings
from resolvers.processes.scheduler import UnlockScheduler
from store import keys
from store.port import Table
from tests.clock import FakeClock
from tests.counting import CountingTable
from tests.factories import capsule_rows, family_rows

SHARDS = 8
PEOPLE = ["ben", "cy", "dee"]


def scheduler(table: Table, clock: FakeClock) -> tuple[UnlockScheduler, CountingTable]:
    """One process's scheduler, its store calls counted apart."""
    counting = CountingTable(table)
    settings = Settings(unlock_shards=SHARDS, unlock_poll_seconds=1.0, abandoned_unlock_seconds=30.0)
    return UnlockScheduler(table=counting, broker=None, settings=settings, clock=clock), counting


async def seed(table: Table, clock: FakeClock, count: int, due_in: timedelta) -> dict[str, int]:
    """`count` LOCKED capsules due `due_in` from now, by id, with their shard;
    every shard holds at least one."""
    await table.batch_write(family_rows("fam", "ana", PEOPLE))
    capsules: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    n = 0
    while len(capsules) < count or len(set(capsules.values())) < SHARDS:
        capsule_id, more = capsule_rows(
            "fam", "ana", PEOPLE[n % 3 : n % 3 + 1], clock.moment + due_in, SHARDS
        )
        capsules[capsule_id] = keys.unlock_shard_of(capsule_id, SHARDS)
        rows += more
        n += 1
    await table.batch_write(rows)
    return capsules


async def statuses(table: Table, capsules: dict[str, int]) -> dict[str, str]:
    found = await table.batch_get([keys.capsule(capsule_id) for capsule_id in capsules])
    return {item["id"]: item["status"] for item in found.values()}


def due_reads(counting: CountingTable) -> set[int]:
    """The unlock shards a scheduler read since its last reset (`UNLOCK#<day>#<shard>` on GSI2)."""
    return {
        int(what.split()[1].rsplit("#", 1)[1])
        for _, name, what in counting.trace
        if name == "query" and what.startswith("GSI2 UNLOCK#")
    }


async def test_three_schedulers_divide_the_shards_and_open_each_capsule_once(table: Table) -> None:
    clock = FakeClock()
    capsules = await seed(table, clock, 24, timedelta(seconds=5))
    processes = [scheduler(table, clock) for _ in range(3)]
    # Passes before the date: the first takes every shard, the others take their
    # share from the busiest, and the first finds what it has left.
    for each, _ in [*processes, *processes]:
        assert (await each.run_once()).unlocked == 0
    held = [set(each.leases.held) for each, _ in processes]
    assert sorted(len(shards) for shards in held) == [2, 3, 3], held
    assert set().union(*held) == set(range(SHARDS)) and sum(map(len, held)) == SHARDS

    clock.advance(seconds=5)
    for _, counting in processes:
        counting.reset()
    results = await asyncio.gather(*(each.run_once() for each, _ in processes))
    assert sum(result.unlocked for result in results) == len(capsules)
    assert set((await statuses(table, capsules)).values()) == {"AVAILABLE"}
    for (_, counting), shards, result in zip(processes, held, results, strict=True):
        # Each read its own shards only, and opened every capsule in them: no
        # other process read them, so no opening was lost (every transaction,
        # which wins its capsule too, committed; there was no other write to win one).
        assert due_reads(counting) == shards, counting.rounds()
        assert counting.calls["transact"] == result.unlocked, counting.rounds()
        assert counting.calls["update"] == 0, counting.rounds()
        assert result.unlocked == sum(1 for shard in capsules.values() if shard in shards)


async def test_a_dead_schedulers_shards_are_taken_over_when_its_leases_run_out(table: Table) -> None:
    clock = FakeClock()
    capsules = await seed(table, clock, 16, timedelta(seconds=2))
    (a, _), (b, _) = scheduler(table, clock), scheduler(table, clock)
    for each in (a, b, a):
        await each.run_once()
    theirs = set(a.leases.held)
    assert len(theirs) == len(b.leases.held) == SHARDS // 2

    # `a` dies: it never runs again, and hands nothing back.
    clock.advance(seconds=2)
    await b.run_once()
    left = {
        capsule_id
        for capsule_id, status in (await statuses(table, capsules)).items()
        if status != "AVAILABLE"
    }
    assert left == {capsule_id for capsule_id, shard in capsules.items() if shard in theirs}

    clock.advance(seconds=30)  # the lease: as long as an UNLOCKING capsule is left to its process
    result = await b.run_once()
    assert b.leases.held == list(range(SHARDS))
    assert result.unlocked == len(left)
    assert set((await statuses(table, capsules)).values()) == {"AVAILABLE"}


async def test_a_stopped_scheduler_hands_its_shards_back_at_once(table: Table) -> None:
    clock = FakeClock()
    capsules = await seed(table, clock, 8, timedelta(seconds=2))
    (a, _), (b, _) = scheduler(table, clock), scheduler(table, clock)
    for each in (a, b, a):
        await each.run_once()
    await a.release()
    clock.advance(seconds=2)
    result = await b.run_once()
    assert b.leases.held == list(range(SHARDS))
    assert result.unlocked == len(capsules)
