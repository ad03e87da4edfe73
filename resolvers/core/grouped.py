"""Conditional updates from many concurrent tasks, committed together.

A burst of background work (a capsule's opening pushed to a thousand people)
makes a thousand small writes, each on its own condition (the lease is still
ours, the device is still there). Each task awaits its own write as if it made
it alone; the writes that arrive while one commit is in flight go in the next
(group commit), up to a hundred to a transaction (`store.port.update_each`).
A write whose condition fails raises `ConditionFailed` for its task alone; the
others of its transaction are committed without it.

The writes are no more atomic together than apart, and a task cancelled while
its write waits may still see that write land (as a request already sent
would): what is written must hold either way, which a conditional write does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from store.port import MAX_TRANSACTION_ITEMS, ConditionFailed, Key, Table, Update, update_each

log = logging.getLogger("mifamilias.grouped")

# The most one commit takes: a few transactions at once; the rest wait a turn.
MOST_AT_ONCE = 4 * MAX_TRANSACTION_ITEMS


class GroupedWrites:
    def __init__(self, table: Table) -> None:
        self.table = table
        self._waiting: list[tuple[Update, asyncio.Future[None]]] = []
        self._committer: asyncio.Task[None] | None = None

    async def update(self, update: Update) -> None:
        """The update, committed with the others waiting; ConditionFailed if
        its condition failed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((update, future))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit(), name="grouped-writes")
        await future

    async def _commit(self) -> None:
        # One turn of the loop first: the tasks woken with this one add theirs.
        await asyncio.sleep(0)
        while self._waiting:
            taken: list[tuple[Update, asyncio.Future[None]]] = []
            later: list[tuple[Update, asyncio.Future[None]]] = []
            keys: set[Key] = set()
            for waiting in self._waiting:
                update, future = waiting
                if future.done():
                    continue  # its task was cancelled before the write went
                # A transaction touches each item once: a second write of one
                # item waits for the next commit, in its order.
                if update.key in keys or len(taken) >= MOST_AT_ONCE:
                    later.append(waiting)
                else:
                    keys.add(update.key)
                    taken.append(waiting)
            self._waiting = later
            if not taken:
                continue
            try:
                refused = await update_each(self.table, [update for update, _ in taken])
            except Exception as error:
                for _, future in taken:
                    if not future.done():
                        future.set_exception(error)
                continue
            for update, future in taken:
                if future.done():
                    continue
                if update.key in refused:
                    future.set_exception(ConditionFailed(update.key))
                else:
                    future.set_result(None)

    async def stop(self) -> None:
        """Waits for the commit in flight (its writers may be gone)."""
        committer, self._committer = self._committer, None
        if committer is not None:
            with contextlib.suppress(Exception):
                await committer
