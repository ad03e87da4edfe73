"""The embedded engine's writes: group-committed, and never waiting for
SQLite's write lock on the event loop.

Writes asked for in one turn of the loop commit together at the end of it, in
one BEGIN IMMEDIATE transaction: for each job in turn its `work` (its reads
and its condition, answering what to write, having written nothing) and then
`apply` (the writing alone); then one commit. A job whose work raises wrote
nothing, so the others keep theirs with no savepoint each; SQLite failing
fails the group, rolled back whole. Each job still reads, checks and writes
with no other writer in between (the jobs before it in the group included),
as a transaction of its own would; its caller hears back once the commit is
made.

Where the lock is free, which is nearly always, the group runs on the loop:
a few statements and appends to the WAL, no sync (synchronous=NORMAL), and no
hand-off to a thread, whose cost (waking it, and waiting for the GIL back
while the loop runs) was more than the write's own. Where another process
holds the lock, the loop does not wait: its connection's busy timeout is
zero, and the group goes to a thread with a connection of its own that waits
up to its busy timeout. Later groups queue behind it there, in order, until
it has caught up. The WAL's checkpoints (a sync of the database file) are the
thread's too: the loop's connection makes none.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from store.port import StoreUnavailable

T = TypeVar("T")
C = TypeVar("C")  # what a job's work answers to write

# Jobs in one transaction at most: a burst of writes shares commits, and no
# single transaction holds the lock (and other processes' writers) for long.
GROUP_LIMIT = 64
# The loop's commits between checkpoints asked of the thread: with a few to a
# few dozen pages each, about SQLite's own default of 1,000 pages.
CHECKPOINT_EVERY = 100

Kind = Literal["write", "checkpoint", "stop"]


@dataclass(slots=True)
class _Job:
    kind: Kind
    work: Callable[[sqlite3.Connection], tuple[Any, Any]] | None
    future: asyncio.Future[Any] | None
    loop: asyncio.AbstractEventLoop


def _unavailable(error: sqlite3.Error) -> StoreUnavailable:
    # Rolled back: nothing of the job was applied.
    return StoreUnavailable(f"SQLite: {error}", outcome_known=True)


Outcome = tuple[bool, Any]


class Writer(Generic[C]):
    def __init__(
        self,
        here: sqlite3.Connection,
        connect: Callable[[], sqlite3.Connection],
        apply: Callable[[sqlite3.Connection, C], None],
    ) -> None:
        """`here` is the loop's connection (its busy timeout zero), closed with
        the writer; `connect` makes the thread's."""
        self._apply = apply
        self._here = here
        self._here.execute("PRAGMA wal_autocheckpoint=0")
        self._pending: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        # Write jobs handed to the thread and not answered yet: while there are
        # any, later groups follow them there, so writes are made in order.
        self._away = 0
        self._commits_here = 0
        self._closing = False
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(connect(),), name="sqlite-writer", daemon=True
        )
        self._thread.start()

    async def run(self, work: Callable[[sqlite3.Connection], tuple[T, C]]) -> T:
        """`work` run in a write transaction, reading only, and what it answers
        to write applied; its answer, or what it raised. A caller cancelled
        while it waits does not undo it (as a request sent to DynamoDB)."""
        if self._closing:
            raise StoreUnavailable("the table is closed", outcome_known=True)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        pending = self._pending.setdefault(loop, [])
        pending.append(_Job("write", work, future, loop))
        if len(pending) == 1:
            loop.call_soon(self._flush, loop)
        return await future

    async def close(self) -> None:
        """Makes what was asked before, then stops the thread and closes the connections."""
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        if self._pending.get(loop):
            self._flush(loop)
        self._here.close()
        stopped: asyncio.Future[None] = loop.create_future()
        self._jobs.put(_Job("stop", None, stopped, loop))
        await stopped
        # The thread answered last: it is ending, its connection closed last,
        # so the checkpoint that closing makes is its.
        self._thread.join()

    # On the loop --------------------------------------------------------------

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        group = self._pending.pop(loop, [])
        while group:
            some, group = group[:GROUP_LIMIT], group[GROUP_LIMIT:]
            if self._away or not self._begin_here():
                self._send(some)
                continue
            outcomes = self._commit(self._here, some)
            _settle([(job.future, outcome) for job, outcome in zip(some, outcomes, strict=True)])
            self._commits_here += 1
            if self._commits_here % CHECKPOINT_EVERY == 0:
                self._jobs.put(_Job("checkpoint", None, None, loop))

    def _begin_here(self) -> bool:
        """Whether the loop's connection took the write lock, with no wait."""
        try:
            self._here.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False  # held by another process (or failing: the thread finds out)
        return True

    def _send(self, group: list[_Job]) -> None:
        self._away += len(group)
        for job in group:
            self._jobs.put(job)

    def _returned(self, answers: list[tuple[asyncio.Future[Any] | None, Outcome]], writes: int) -> None:
        """On the loop: a group the thread made, answered in one callback."""
        self._away -= writes
        _settle(answers)

    # Either side ---------------------------------------------------------------

    def _commit(self, db: sqlite3.Connection, group: list[_Job]) -> list[Outcome]:
        """The group's jobs in the transaction begun on `db`, and its commit."""
        outcomes: list[Outcome] = []
        try:
            for job in group:
                assert job.work is not None
                try:
                    value, changes = job.work(db)
                except sqlite3.Error:
                    raise
                except Exception as error:
                    outcomes.append((False, error))  # it wrote nothing
                    continue
                self._apply(db, changes)
                outcomes.append((True, value))
            db.execute("COMMIT")
        except Exception as error:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            # Nothing of the group was applied; each caller hears why.
            if isinstance(error, sqlite3.Error):
                return [(False, _unavailable(error)) for _ in group]
            return [(False, error) for _ in group]
        return outcomes

    # The thread ----------------------------------------------------------------

    def _run(self, db: sqlite3.Connection) -> None:
        stop: _Job | None = None
        try:
            while stop is None:
                group = [self._jobs.get()]
                while len(group) < GROUP_LIMIT and group[-1].kind == "write":
                    try:
                        group.append(self._jobs.get_nowait())
                    except queue.Empty:
                        break
                last = group[-1]
                if last.kind != "write":
                    group.pop()
                if group:
                    self._answer(group, self._commit_there(db, group))
                if last.kind == "stop":
                    stop = last
                elif last.kind == "checkpoint":
                    with contextlib.suppress(sqlite3.Error):  # the next one tries again
                        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            db.close()
            if stop is not None:
                self._answer([stop], [(True, None)])

    def _commit_there(self, db: sqlite3.Connection, group: list[_Job]) -> list[Outcome]:
        try:
            db.execute("BEGIN IMMEDIATE")  # waits up to the busy timeout
        except sqlite3.Error as error:
            return [(False, _unavailable(error)) for _ in group]
        return self._commit(db, group)

    def _answer(self, group: list[_Job], outcomes: list[Outcome]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any] | None, Outcome]]] = {}
        for job, outcome in zip(group, outcomes, strict=True):
            by_loop.setdefault(job.loop, []).append((job.future, outcome))
        for loop, answers in by_loop.items():
            writes = sum(1 for job in group if job.loop is loop and job.kind == "write")
            with contextlib.suppress(RuntimeError):  # that loop is closed: no one waits
                loop.call_soon_threadsafe(self._returned, answers, writes)


def _settle(answers: list[tuple[asyncio.Future[Any] | None, Outcome]]) -> None:
    for future, (ok, value) in answers:
        if future is None or future.done():  # its caller was cancelled; the write stands
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
