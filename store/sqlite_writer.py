"""The embedded engine's one writer: a thread with a connection of its own
that makes every write, so that waiting for SQLite's write lock (another
process holding it, up to the busy timeout) and the WAL's writes and
checkpoints' syncs happen off the event loop.

Writes that arrive together commit together: the thread takes every job
waiting, opens one BEGIN IMMEDIATE transaction, and for each job in turn runs
its `work` (its reads and its condition, answering what to write, having
written nothing) and then `apply` (the writing alone); then it commits once. A
job whose work raises wrote nothing, so the others keep theirs with no
savepoint each; SQLite failing fails the group, rolled back whole. Each job
still reads, checks and writes with no other writer in between (the jobs
before it in the group included), as a transaction of its own would; its
caller hears back only once the commit is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from store.port import StoreUnavailable

T = TypeVar("T")
C = TypeVar("C")  # what a job's work answers to write

# Jobs in one transaction at most: a burst of writes shares commits, and no
# single transaction holds the lock (and other processes' writers) for long.
GROUP_LIMIT = 64


@dataclass(slots=True)
class _Job:
    work: Callable[[sqlite3.Connection], tuple[Any, Any]] | None  # None: stop
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


def _unavailable(error: sqlite3.Error) -> StoreUnavailable:
    # Rolled back: nothing of the job was applied.
    return StoreUnavailable(f"SQLite: {error}", outcome_known=True)


def _settle(outcomes: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    """On the loop: every job of a group answered in one callback."""
    for future, ok, value in outcomes:
        if future.done():  # its caller was cancelled; the write stands
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class Writer(Generic[C]):
    def __init__(self, db: sqlite3.Connection, apply: Callable[[sqlite3.Connection, C], None]) -> None:
        self._db = db
        self._apply = apply
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="sqlite-writer", daemon=True)
        self._thread.start()

    async def run(self, work: Callable[[sqlite3.Connection], tuple[T, C]]) -> T:
        """`work` run in a write transaction on the writer's connection, reading
        only, and what it answers to write applied; its answer, or what it
        raised. A caller cancelled while it waits does not undo it."""
        if self._closing:
            raise StoreUnavailable("the table is closed", outcome_known=True)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put(_Job(work, future, loop))
        return await future

    async def close(self) -> None:
        """Runs what was asked before, then stops the thread and closes its connection."""
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()
        self._jobs.put(_Job(None, stopped, loop))
        await stopped
        # The thread answered last: it is ending, its connection closed.
        self._thread.join()

    # The thread ---------------------------------------------------------------

    def _run(self) -> None:
        stop: _Job | None = None
        try:
            while stop is None:
                group = [self._jobs.get()]
                while len(group) < GROUP_LIMIT:
                    try:
                        group.append(self._jobs.get_nowait())
                    except queue.Empty:
                        break
                if group[-1].work is None:
                    stop = group.pop()  # nothing is asked after close
                if group:
                    self._answer(group, self._commit(group))
        finally:
            self._db.close()
            if stop is not None:
                self._answer([stop], [(True, None)])

    def _commit(self, group: list[_Job]) -> list[tuple[bool, Any]]:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            return [(False, _unavailable(error)) for _ in group]
        outcomes: list[tuple[bool, Any]] = []
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

    def _answer(self, group: list[_Job], outcomes: list[tuple[bool, Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for job, (ok, value) in zip(group, outcomes, strict=True):
            by_loop.setdefault(job.loop, []).append((job.future, ok, value))
        for loop, answers in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: no one waits
                loop.call_soon_threadsafe(_settle, answers)
