"""Leased work queues: every background job that works on table items one at a
time (the media pipeline, data exports, account deletions, emails) runs on one.

A job names its items by key. `submit` puts a key on a bounded, deduplicated
queue and never blocks: when the queue is full the item waits in its recovery
partition (GSI2) for the next `recover` pass, which any process runs. A worker
claims the item with a conditional write (`resolvers.core.leases`), renews the
lease every third of its length while the handler works, and the handler's last
write clears it. A process that dies lets go when the lease runs out; a process
that stops on purpose hands back what it held (`stop`), so another process's
next recovery pass resumes it at once.

A job that shares its reads between items (the pusher: an opening's notes all
name one family and one capsule) gives `handle_many`: each worker then takes up
to `batch` keys at once, claims them in one batched claim (`Lease.claim_many`),
renews them together, and hands the claimed items over together; each is still
settled on its own. Every other job takes one key at a time.

Workers take keys in fair order between the people they are for (`FairQueue`):
one person's 50 uploads or 30 pushes to slow devices hold at most one worker
at a time, and another person's item goes next, not after theirs. A key's
person is what its submitter says, or the item's `LeaseSpec.group` when a
recovery pass finds it, or else its partition (a person's notes share theirs).

`stop` returns however the cancel lands: while the heartbeat winds down, or
while a handler's cleanup raises an error of its own in place of the cancel (a
zip closed while its writing thread still runs, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from resolvers.core import leases
from resolvers.core.leases import Lease
from store.port import Condition, ConditionFailed, Index, Item, Key, Table, Update, every_item

log = logging.getLogger("mifamilias.leased")

QUEUE_SIZE = 100


@dataclass(frozen=True)
class LeaseSpec:
    """What a job leases: `claimable` is what an item must still be for the job
    to claim, renew or hand it back (a status, say); `recover_from` is the
    partition of `recover_index` that lists its items not yet done, and `due`
    (if given) which of those are due now (not waiting for a retry, say);
    `count_attempts` counts every claim on the item (`leases.attempts`), with
    the count the previous format kept under `previous_attempts`, if it had
    one; `on_claim` is what a claim also writes."""

    name: str
    recover_from: str | None = None
    claimable: Condition | None = None
    count_attempts: bool = False
    recover_index: Index = "GSI2"
    due: Callable[[Item, datetime], bool] | None = None
    # Whose work an item is, for fair order (its partition when not given).
    group: Callable[[Item], str | None] | None = None
    previous_attempts: str | None = None
    on_claim: Mapping[str, Any] = field(default_factory=dict)


def fair_order(keys: list[tuple[Key, str | None]]) -> list[Key]:
    """Keys with their groups (None: the key's partition), the groups taking
    turns in the order each first appears, each group's keys in their order:
    one person's fifty items come one at a time between everyone else's."""
    lines: dict[str, deque[Key]] = {}
    for key, group in keys:
        lines.setdefault(group or key[0], deque()).append(key)
    ordered: list[Key] = []
    while lines:
        for group in list(lines):
            line = lines[group]
            ordered.append(line.popleft())
            if not line:
                del lines[group]
    return ordered


class FairQueue:
    """Keys waiting for a worker, in fair order between groups (people).

    Each group waits in its own line, and the groups take turns: a worker gets
    the first key of the group that has waited longest since it was last
    served, among those with fewer than `per_group` keys in the workers' hands.
    So a group with many keys, or slow ones, holds at most `per_group` workers,
    and any other group's key is next but for one of theirs. Bounded as a whole
    (`maxsize`) and joinable, as an `asyncio.Queue`."""

    def __init__(self, maxsize: int, per_group: int = 1) -> None:
        self.maxsize = maxsize
        self.per_group = per_group
        self._lines: dict[str, deque[Key]] = {}
        self._turns: deque[str] = deque()  # groups with keys waiting, in turn order
        self._busy: dict[str, int] = {}
        self._size = 0
        self._unfinished = 0
        self._waiting: list[asyncio.Future[None]] = []
        self._finished = asyncio.Event()
        self._finished.set()

    def qsize(self) -> int:
        return self._size

    def empty(self) -> bool:
        return self._size == 0

    def full(self) -> bool:
        return self._size >= self.maxsize

    def put_nowait(self, key: Key, group: str) -> None:
        if self.full():
            raise asyncio.QueueFull
        line = self._lines.get(group)
        if line is None:
            line = self._lines[group] = deque()
            self._turns.append(group)
        line.append(key)
        self._size += 1
        self._unfinished += 1
        self._finished.clear()
        self._wake()

    def _wake(self) -> None:
        # Every idle worker looks again: there are a few, and which one the key
        # suits is for `_take` to say.
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)

    def _take(self) -> tuple[Key, str] | None:
        for _ in range(len(self._turns)):
            group = self._turns[0]
            self._turns.rotate(-1)
            if self._busy.get(group, 0) >= self.per_group:
                continue
            line = self._lines[group]
            key = line.popleft()
            if not line:
                del self._lines[group]
                self._turns.remove(group)
            self._size -= 1
            self._busy[group] = self._busy.get(group, 0) + 1
            return key, group
        return None

    async def get(self) -> tuple[Key, str]:
        while True:
            taken = self._take()
            if taken is not None:
                return taken
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            await waiter

    async def get_many(self, limit: int) -> list[tuple[Key, str]]:
        """Waits for one key, then takes up to `limit` in all without waiting,
        in the same fair order and under the same bound per group as `get`:
        a batch holds at most `per_group` keys of one person."""
        taken = [await self.get()]
        while len(taken) < limit:
            more = self._take()
            if more is None:
                break
            taken.append(more)
        return taken

    def task_done(self, group: str) -> None:
        busy = self._busy.get(group, 0) - 1
        if busy > 0:
            self._busy[group] = busy
        else:
            self._busy.pop(group, None)
        self._unfinished -= 1
        if self._unfinished <= 0:
            self._finished.set()
        self._wake()  # the group may have another key a worker can take now

    async def join(self) -> None:
        await self._finished.wait()


@dataclass(frozen=True)
class Claim:
    """One claimed item, handed to the job's handler."""

    key: Key
    item: Item
    lease: Lease
    previous_attempts: str | None = None  # the spec's

    @property
    def attempts(self) -> int:
        return leases.attempts(self.item, self.previous_attempts)


Handler = Callable[[Claim], Awaitable[None]]
# A job that works on several claimed items at once (what they share read once,
# their writes committed together): each item still settles on its own.
BatchHandler = Callable[[list[Claim]], Awaitable[None]]


def cancelling() -> bool:
    """Whether this task has been asked to stop.

    A cancel can arrive while a step is cleaning up after itself, and an
    exception raised by that cleanup replaces the CancelledError. The worker
    must still stop, or `stop()` waits for it for ever."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class LeasedQueue:
    def __init__(
        self,
        spec: LeaseSpec,
        *,
        table: Table,
        clock: Callable[[], datetime],
        lease: timedelta,
        handle: Handler | None = None,
        workers: int = 1,
        queue_size: int = QUEUE_SIZE,
        owner: str | None = None,
        handle_many: BatchHandler | None = None,
        batch: int = 1,
    ) -> None:
        """`handle` takes one claimed item; or `handle_many` takes up to `batch`
        of them, claimed together (`Lease.claim_many`), of as many people."""
        if (handle is None) == (handle_many is None):
            raise ValueError("a leased queue takes `handle` or `handle_many`, one of them")
        self.spec = spec
        self.table = table
        self.clock = clock
        self.handle_many: BatchHandler = handle_many if handle_many is not None else _one_at_a_time(handle)
        self.batch = batch if handle_many is not None else 1
        self.workers = workers
        # Whose lease it is: renewals and releases touch only this process's own.
        self.lease = Lease(owner or uuid.uuid4().hex, lease)
        self.queue = FairQueue(queue_size)
        self._queued: set[Key] = set()
        self._tasks: list[asyncio.Task[None]] = []
        # Items whose lease this process may hold: noted before the claim (a
        # claim cancelled on its way may still have landed), left noted when
        # the work is cancelled, so that `stop` hands the lease back.
        self._holding: set[Key] = set()

    @property
    def owner(self) -> str:
        return self.lease.owner

    def held(self) -> Condition:
        """The condition of a handler's last write: the lease is still ours."""
        return self.lease.held()

    # Running --------------------------------------------------------------------

    def submit(self, key: Key, group: str | None = None) -> None:
        """Never blocks: when the queue is full the item waits for recovery.
        `group` is whose work it is (its partition when not given)."""
        if key in self._queued:
            return
        try:
            self.queue.put_nowait(key, group or key[0])
        except asyncio.QueueFull:
            log.warning("%s queue full; %s waits for the next recovery pass", self.spec.name, key[0])
            return
        self._queued.add(key)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"{self.spec.name}-{n}") for n in range(self.workers)
        ]

    async def stop(self) -> None:
        """Stops the workers, then hands back the leases their work held. Safe to
        call twice."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for key in sorted(self._holding):
            try:
                if await self.lease.release(self.table, key, when=self.spec.claimable):
                    log.info("%s: handed back %s for another process to resume", self.spec.name, key[0])
            except Exception:
                log.exception("%s: could not hand back the lease of %s", self.spec.name, key[0])
            self._holding.discard(key)

    async def _work(self) -> None:
        while True:
            taken = await self.queue.get_many(self.batch)
            keys = [key for key, _ in taken]
            self._queued.difference_update(keys)
            try:
                await self.run_many(keys)
            except asyncio.CancelledError:
                raise
            except Exception:
                if cancelling():
                    raise asyncio.CancelledError from None
                log.exception("%s: unexpected failure on %s", self.spec.name, ", ".join(k[0] for k in keys))
            finally:
                for _, group in taken:
                    self.queue.task_done(group)

    async def due(self) -> list[Key]:
        """The keys in the recovery partition that no live lease holds, in
        fair order between the people they are for (`fair_order`)."""
        return fair_order(await self._due())

    async def _due(self) -> list[tuple[Key, str | None]]:
        if self.spec.recover_from is None:
            return []
        now, due, group = self.clock(), self.spec.due, self.spec.group
        return [
            ((item["PK"], item["SK"]), group(item) if group is not None else None)
            async for item in every_item(self.table, self.spec.recover_from, index=self.spec.recover_index)
            if not leases.is_live(item, now) and (due is None or due(item, now))
        ]

    async def recover(self) -> int:
        """Queues what a crash, a shutdown or a full queue left undone."""
        found = 0
        for key, group in await self._due():
            if self.queue.full():
                break
            self.submit(key, group)
            found += 1
        return found

    async def run_due(self) -> int:
        """Runs what the recovery partition holds here and now, one at a time;
        how many this process claimed."""
        return sum([await self.run(key) for key in await self.due()])

    # One item -------------------------------------------------------------------

    async def run(self, key: Key) -> bool:
        """Claims the item and hands it to the job; False when it was not ours
        to take (done, gone, or held by another)."""
        return await self.run_many([key]) > 0

    async def run_many(self, keys: Sequence[Key]) -> int:
        """Claims the items in one batched claim and hands those taken to the
        job together; how many were ours to take."""
        self._holding.update(keys)
        cancelled = False
        try:
            now = self.clock()
            claimed = await self.lease.claim_many(
                self.table,
                keys,
                now,
                when=self.spec.claimable,
                count=self.spec.count_attempts,
                changes=self.spec.on_claim,
            )
            claims: list[Claim] = []
            for key in keys:
                item = claimed.get(key)
                if item is None:
                    continue
                if self.spec.due is not None and not self.spec.due(item, now):
                    # Listed (or submitted) before its last holder handed it back to
                    # wait, for a push service's Retry-After say: not before its time.
                    await self._not_yet(key)
                    continue
                claims.append(Claim(key, item, self.lease, self.spec.previous_attempts))
            if not claims:
                return 0
            heartbeat = asyncio.create_task(
                self._renew([claim.key for claim in claims]), name=f"{self.spec.name}-lease"
            )
            try:
                await self.handle_many(claims)
            except asyncio.CancelledError:
                cancelled = True  # stays noted: `stop` hands the leases back
                raise
            except Exception:
                if cancelling():  # stopped mid-step: the items are not at fault
                    cancelled = True
                    raise asyncio.CancelledError from None
                raise
            finally:
                heartbeat.cancel()
                # Waits for the heartbeat without swallowing a cancel of this
                # task: suppressing CancelledError here would keep the worker
                # alive and `stop` waiting for ever.
                await asyncio.gather(heartbeat, return_exceptions=True)
            return len(claims)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if not cancelled:
                self._holding.difference_update(keys)

    async def _not_yet(self, key: Key) -> None:
        """Hands back an item claimed before it was due, the claim uncounted."""
        add = {leases.ATTEMPTS: -1} if self.spec.count_attempts else {}
        with contextlib.suppress(ConditionFailed):
            await self.table.update(
                Update(key, set=dict(leases.CLEARED), add=add, condition=self.lease.held())
            )

    async def _renew(self, keys: Sequence[Key]) -> None:
        """Keeps the leases while the work goes on: a third of their length at
        a time, for the items not done yet (in few calls, `Lease.renew_many`)."""
        left = list(keys)
        while left:
            await asyncio.sleep(self.lease.length.total_seconds() / 3)
            try:
                # What is done, gone, or no longer ours drops out.
                left = await self.lease.renew_many(self.table, left, self.clock(), when=self.spec.claimable)
            except Exception:
                log.exception("%s: could not renew the leases of %s", self.spec.name, left[0][0])


def _one_at_a_time(handle: Handler | None) -> BatchHandler:
    assert handle is not None

    async def handle_one(claims: list[Claim]) -> None:
        for claim in claims:  # batches of one: `batch` is 1 for such a queue
            await handle(claim)

    return handle_one


class LeasedJob:
    """A background job on its own leased queue: a subclass names its `SPEC`
    and handles one claimed item in `process`; submitting, the workers, stopping
    and recovery are the queue's."""

    SPEC: ClassVar[LeaseSpec]

    def __init__(
        self, *, table: Table, clock: Callable[[], datetime], lease: timedelta, workers: int = 1
    ) -> None:
        self.table = table
        self.clock = clock
        self.jobs = LeasedQueue(
            self.SPEC, table=table, clock=clock, lease=lease, handle=self.process, workers=workers
        )
        self.queue = self.jobs.queue

    @property
    def owner(self) -> str:
        return self.jobs.owner

    async def process(self, claim: Claim) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        await self.jobs.start()

    async def stop(self) -> None:
        """Stops the workers and hands back the leases of work cut short. Safe to
        call twice."""
        await self.jobs.stop()

    async def recover(self) -> int:
        """Queues what a crash, a shutdown or a full queue left undone."""
        return await self.jobs.recover()
