"""The leased-worker primitive (`resolvers.processes.leased`), on both engines.

A queue claims each item under a lease, once however often it is submitted;
a process killed mid-job lets go when its lease runs out and another process
finishes the item; a process that stops hands its leases back at once.

Two windows hung `stop()` (and a CI run) before the primitive: a job has ended
and its `finally` waits for the heartbeat task, and a cancel of the worker
arriving then was swallowed; or the job's own cleanup raises on the cancel (a
zip closed while a thread still writes to it), replacing the CancelledError.
Either way the worker went back to its queue. Two tests make the stop land in
each window every time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from resolvers.core import leases
from resolvers.processes.leased import Claim, FairQueue, LeasedQueue, LeaseSpec
from store.dynamodb import DynamoTable
from store.items import iso
from store.port import ConditionFailed, Key, Table, Update, all_of, eq
from store.sqlite import SqliteTable
from tests.servers import until

PARTITION = "JOBS"
SPEC = LeaseSpec("jobs", recover_from=PARTITION, claimable=eq("state", "TODO"), count_attempts=True)
LEASE = timedelta(seconds=60)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def job_key(n: int) -> Key:
    return (f"JOB#{n}", "JOB")


async def add_job(table: Table, n: int) -> Key:
    key = job_key(n)
    await table.put({"PK": key[0], "SK": key[1], "state": "TODO", "GSI2PK": PARTITION, "GSI2SK": key[0]})
    return key


async def finish_job(table: Table, claim: Claim) -> None:
    """A job's last write: done, out of the recovery partition, lease cleared,
    while the lease is still the claimant's."""
    await table.update(
        Update(
            claim.key,
            set={"state": "DONE", **leases.CLEARED},
            remove=["GSI2PK", "GSI2SK"],
            condition=all_of(SPEC.claimable or eq("state", "TODO"), claim.lease.held()),
        )
    )


def queue_of(table: Table, clock: Clock, handle: Callable[[Claim], Awaitable[None]]) -> LeasedQueue:
    return LeasedQueue(SPEC, table=table, clock=clock, lease=LEASE, handle=handle)


@pytest.fixture
async def started() -> AsyncIterator[list[LeasedQueue]]:
    """Queues a test starts, stopped at its end whatever happened."""
    queues: list[LeasedQueue] = []
    yield queues
    for queue in queues:
        await queue.stop()


async def test_each_item_is_claimed_once_however_often_it_is_submitted(
    table: Table, started: list[LeasedQueue]
) -> None:
    clock = Clock()
    handled: list[Key] = []

    async def handle(claim: Claim) -> None:
        handled.append(claim.key)
        await finish_job(table, claim)

    queue = queue_of(table, clock, handle)
    keys = [await add_job(table, n) for n in range(3)]
    for key in keys + keys:
        queue.submit(key)
    started.append(queue)
    await queue.start()
    await queue.queue.join()
    assert sorted(handled) == sorted(keys)
    for key in keys:
        item = await table.get(key)
        assert item is not None
        assert item["state"] == "DONE"
        assert item.get(leases.OWNER) is None
        assert leases.attempts(item) == 1
    assert await queue.recover() == 0  # nothing left in the partition
    assert await queue.run(keys[0]) is False  # done: not claimable any more


async def test_a_live_lease_keeps_other_processes_off_until_it_runs_out(table: Table) -> None:
    clock = Clock()
    key = await add_job(table, 1)
    first = leases.Lease("first", LEASE)
    assert await first.claim(table, key, clock(), when=SPEC.claimable, count=True) is not None
    handled: list[Claim] = []

    async def handle(claim: Claim) -> None:
        handled.append(claim)
        await finish_job(table, claim)

    other = queue_of(table, clock, handle)
    assert await other.recover() == 0
    assert await other.run(key) is False
    clock.now += LEASE + timedelta(seconds=1)  # the first holder died
    assert await other.run_due() == 1
    assert [claim.attempts for claim in handled] == [2]
    # The first holder, back late, can neither renew nor finish.
    assert await first.renew(table, key, clock()) is False
    assert await first.release(table, key) is False


async def test_a_lease_of_the_previous_format_is_honoured_then_taken_over_once(table: Table) -> None:
    """During a rolling upgrade a process of the previous release may hold an
    item under the previous format's names (the mailer's `mailLeaseUntil` and
    `mailOwner`, its claims counted in `mailAttempts`). While that lease lives
    no queue lists or claims the item; once it has run out, exactly one of two
    queues claims it, the old names go in that same write (so the old holder's
    last write, conditioned on `mailOwner`, cannot land), and its claims count."""
    clock = Clock()
    spec = replace(SPEC, previous_attempts="mailAttempts")
    key = await add_job(table, 1)
    # What the previous release's claim wrote: two claims so far.
    until = iso(clock.now + timedelta(seconds=120))
    await table.update(
        Update(key, set={"mailLeaseUntil": until, "mailOwner": "previous"}, add={"mailAttempts": 2})
    )
    handled: list[Claim] = []

    async def handle(claim: Claim) -> None:
        handled.append(claim)
        await finish_job(table, claim)

    queues = [LeasedQueue(spec, table=table, clock=clock, lease=LEASE, handle=handle) for _ in range(2)]
    assert [await queue.due() for queue in queues] == [[], []]
    assert [await queue.run(key) for queue in queues] == [False, False]
    assert handled == []

    clock.now += timedelta(seconds=121)  # the previous holder died
    assert [await queue.due() for queue in queues] == [[key], [key]]
    assert sorted(await asyncio.gather(*(queue.run(key) for queue in queues))) == [False, True]
    (claim,) = handled
    assert claim.attempts == 3
    assert not {"mailLeaseUntil", "mailOwner"} & set(claim.item)
    with pytest.raises(ConditionFailed):
        await table.update(
            Update(
                key, set={"state": "SENT"}, remove=["mailLeaseUntil"], condition=eq("mailOwner", "previous")
            )
        )
    item = await table.get(key)
    assert item is not None and item["state"] == "DONE"
    assert [await queue.run(key) for queue in queues] == [False, False]


async def test_an_item_handed_back_to_wait_is_not_run_before_its_time(table: Table) -> None:
    """A key listed or submitted before its last holder handed it back to wait
    (a push service's Retry-After, say) is claimed, found not due, and handed
    back untouched: not run early, and the claim not counted."""
    clock = Clock()
    spec = replace(SPEC, due=lambda item, now: str(item.get("retryAt") or "") <= now.isoformat())
    key = await add_job(table, 1)
    later = (clock.now + timedelta(seconds=120)).isoformat()
    await table.update(Update(key, set={"retryAt": later}))
    handled: list[Claim] = []

    async def handle(claim: Claim) -> None:
        handled.append(claim)
        await finish_job(table, claim)

    queue = LeasedQueue(spec, table=table, clock=clock, lease=LEASE, handle=handle)
    assert await queue.run(key) is False
    item = await table.get(key)
    assert item is not None and item.get(leases.OWNER) is None and leases.attempts(item) == 0
    assert handled == []
    clock.now += timedelta(seconds=121)
    assert await queue.run(key) is True
    assert [claim.attempts for claim in handled] == [1]


async def test_stop_hands_the_leases_back_for_another_process_at_once(
    table: Table, started: list[LeasedQueue]
) -> None:
    clock = Clock()
    key = await add_job(table, 1)
    working = asyncio.Event()

    async def stuck(claim: Claim) -> None:
        working.set()
        await asyncio.Event().wait()

    first = queue_of(table, clock, stuck)
    await first.start()
    first.submit(key)
    await working.wait()
    await first.stop()
    item = await table.get(key)
    assert item is not None and item.get(leases.OWNER) is None and item["state"] == "TODO"
    finished = asyncio.Event()

    async def handle(claim: Claim) -> None:
        await finish_job(table, claim)
        finished.set()

    other = queue_of(table, clock, handle)
    started.append(other)
    await other.start()
    assert await other.recover() == 1  # no wait for the lease to run out
    await finished.wait()


# A process SIGKILLed mid-job ---------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from datetime import timedelta
    from resolvers.processes.leased import LeasedQueue
    from tests.resolvers.test_leased_workers import SPEC, LEASE, Clock, open_table

    async def main() -> None:
        table = await open_table(sys.argv[1], sys.argv[2])
        async def hang(claim) -> None:
            await asyncio.Event().wait()
        queue = LeasedQueue(SPEC, table=table, clock=Clock(), lease=LEASE, handle=hang, owner="doomed")
        await queue.run(("JOB#1", "JOB"))

    asyncio.run(main())
    """
)


async def open_table(engine: str, where: str) -> Table:
    if engine == "sqlite":
        return SqliteTable(Path(where))
    endpoint, name = where.split("|")
    return await DynamoTable.connect(name, endpoint, "us-east-1")


def where_of(table: Table) -> tuple[str, str]:
    if isinstance(table, SqliteTable):
        return "sqlite", str(table.path)
    assert isinstance(table, DynamoTable)
    return "dynamodb", f"{table.client.meta.endpoint_url}|{table.table_name}"


async def test_a_job_killed_mid_way_is_finished_by_another_process(table: Table) -> None:
    clock = Clock()
    key = await add_job(table, 1)
    engine, where = where_of(table)
    child = subprocess.Popen(  # noqa: ASYNC220  (started once; the test then polls the table)
        [sys.executable, "-c", CHILD, engine, where], cwd=Path(__file__).parents[2], env=dict(os.environ)
    )
    try:

        async def claimed_by_child() -> bool:
            item = await table.get(key)
            return item is not None and item.get(leases.OWNER) == "doomed"

        await until(claimed_by_child, what="the child's claim")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    handled: list[Claim] = []

    async def handle(claim: Claim) -> None:
        handled.append(claim)
        await finish_job(table, claim)

    other = queue_of(table, clock, handle)
    assert await other.run_due() == 0  # its lease still runs
    clock.now += LEASE + timedelta(seconds=1)
    assert await other.run_due() == 1
    item = await table.get(key)
    assert item is not None and item["state"] == "DONE"
    assert [claim.attempts for claim in handled] == [2]


# Stopping, wherever the cancel lands ---------------------------------------------------


async def stopped(queue: LeasedQueue) -> bool:
    """Whether `stop()` returns. A hang guard, not a speed claim: before the fixes
    it never did. (`wait`, not `wait_for`: the latter's own cancel would end the worker.)"""
    stopping = asyncio.create_task(queue.stop())
    await asyncio.wait({stopping}, timeout=30)
    return stopping.done()


async def test_stop_lands_while_the_heartbeat_winds_down(tmp_path: Path, monkeypatch: Any) -> None:
    table = SqliteTable(tmp_path / "table.sqlite3")
    beating = asyncio.Event()
    winding_down = asyncio.Event()
    never = asyncio.Event()

    async def heartbeat(key: Key) -> None:
        beating.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            winding_down.set()
            await never.wait()  # a second cancel (the worker's own) ends this
            raise

    async def handle(claim: Claim) -> None:
        await beating.wait()

    queue = queue_of(table, Clock(), handle)
    monkeypatch.setattr(queue, "_renew", heartbeat)
    await queue.start()
    queue.submit(await add_job(table, 1))
    try:
        await winding_down.wait()
        assert await stopped(queue)
    finally:
        await table.close()


async def test_stop_lands_while_a_cleanup_replaces_the_cancel(tmp_path: Path) -> None:
    """The worker stops all the same, and the handler's failure path is not taken."""
    table = SqliteTable(tmp_path / "table.sqlite3")
    working = asyncio.Event()
    failed: list[str] = []

    async def handle(claim: Claim) -> None:
        working.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("can't close the ZIP file while there is an open writing handle") from None

    queue = queue_of(table, Clock(), handle)
    await queue.start()
    key = await add_job(table, 1)
    queue.submit(key)
    try:
        await working.wait()
        assert await stopped(queue)
        assert failed == []
        item = await table.get(key)
        assert item is not None and item.get(leases.OWNER) is None  # handed back
    finally:
        await table.close()


async def test_the_queue_takes_turns_between_groups_and_holds_one_key_of_each_at_a_time() -> None:
    queue = FairQueue(maxsize=10)
    for n in range(3):
        queue.put_nowait((f"A{n}", "x"), "ana")
    queue.put_nowait(("B0", "x"), "ben")
    queue.put_nowait(("C0", "x"), "cy")
    # Ana's first, then the others' while hers is in hand.
    assert [(await queue.get())[0][0] for _ in range(3)] == ["A0", "B0", "C0"]
    # Dee comes after Ana's two waiting keys, and goes before them: Ana holds one already.
    queue.put_nowait(("D0", "x"), "dee")
    assert (await queue.get())[0][0] == "D0"
    queue.task_done("ana")
    assert (await queue.get())[0][0] == "A1"
    with pytest.raises(asyncio.QueueFull):
        for n in range(20):
            queue.put_nowait((f"D{n}", "x"), "dee")
    assert queue.qsize() == 10  # bounded as a whole
