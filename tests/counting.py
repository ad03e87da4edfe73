"""A wrapper around any table that counts store calls and sequential round trips.

Calls to a person's cost bucket (the budget every operation is charged to,
`resolvers.core.ratelimit.CostBudget`) are counted apart, in `budget_calls`:
they are the same one charge before every operation and one refund after it,
whatever the operation reads (and, for subscription events, one batch read and
one transaction per pass of deliveries), and `tests/api/test_budget.py` counts them. The
other counts are what the operation itself reads and writes.

Sequential round trips are the longest chain of calls each of which started
after the previous one had answered: a call's depth is one more than the
deepest call already answered when it starts. An optional simulated latency
makes every call take at least that long, so calls issued by one resolver
level overlap as they would over a network, whatever the engine underneath.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from store.port import Condition, Index, Item, Key, Page, SortKey, Table, Update, WriteOp, op_key

T = TypeVar("T")
TRACE_LIMIT = 10_000


class CountingTable:
    def __init__(self, inner: Table, latency: float = 0.0) -> None:
        self.inner = inner
        self.latency = latency
        self.calls: Counter[str] = Counter()
        self.budget_calls: Counter[str] = Counter()
        self.round_trips = 0
        # Items written, as DynamoDB charges them: a write unit per item (of up
        # to 1 KB) written alone, two per item of a transaction.
        self.write_units = 0
        self._answered_depth = 0
        # Bumped by each reset: a call that started before it (background work still
        # in flight, on a slow machine) is not counted and moves no depth after it.
        self._generation = 0
        # (round trip, call, what it touched) of every call since the last reset,
        # so a failing count can say which call came in which round.
        self.trace: list[tuple[int, str, str]] = []

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self._generation += 1
        self.calls.clear()
        self.budget_calls.clear()
        self.round_trips = 0
        self.write_units = 0
        self._answered_depth = 0
        self.trace.clear()

    def rounds(self) -> str:
        """The trace, one line per round trip."""
        lines = []
        for depth in range(1, self.round_trips + 1):
            calls = "; ".join(f"{name} {what}" for d, name, what in self.trace if d == depth)
            lines.append(f"{depth}: {calls}")
        return "\n".join(lines)

    async def _count(self, name: str, call: Callable[[], Awaitable[T]], what: str = "") -> T:
        self.calls[name] += 1
        depth = self._answered_depth + 1
        if len(self.trace) < TRACE_LIMIT:  # the bench runs long without a reset
            self.trace.append((depth, name, what))
        self.round_trips = max(self.round_trips, depth)
        generation = self._generation
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            return await call()
        finally:
            if generation == self._generation:
                self._answered_depth = max(self._answered_depth, depth)

    async def get(self, key: Key) -> Item | None:
        if is_budget(key):
            self.budget_calls["get"] += 1
            return await self.inner.get(key)
        return await self._count("get", lambda: self.inner.get(key), _keys([key]))

    # Each call takes its arguments as a list first: a generator read once for
    # the trace would reach the table empty.

    async def batch_get(self, keys: Sequence[Key]) -> dict[Key, Item]:
        keys = list(keys)
        if keys and all(is_budget(key) for key in keys):  # a pass of deliveries' buckets
            self.budget_calls["batch_get"] += 1
            return await self.inner.batch_get(keys)
        return await self._count("batch_get", lambda: self.inner.batch_get(keys), _keys(keys))

    async def query(
        self,
        pk: str,
        sk: SortKey | None = None,
        *,
        index: Index = "table",
        descending: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page:
        return await self._count(
            "query",
            lambda: self.inner.query(pk, sk, index=index, descending=descending, limit=limit, cursor=cursor),
            f"{index} {pk} {sk.value if sk else ''}",
        )

    async def put(self, item: Item, condition: Condition | None = None) -> None:
        self.write_units += 1
        await self._count("put", lambda: self.inner.put(item, condition), _keys([(item["PK"], item["SK"])]))

    async def update(self, update: Update) -> Item:
        if is_budget(update.key):
            self.budget_calls["update"] += 1
            return await self.inner.update(update)
        self.write_units += 1
        return await self._count("update", lambda: self.inner.update(update), _keys([update.key]))

    async def delete(self, key: Key, condition: Condition | None = None) -> Item | None:
        self.write_units += 1
        return await self._count("delete", lambda: self.inner.delete(key, condition), _keys([key]))

    async def batch_write(self, puts: Sequence[Item] = (), deletes: Sequence[Key] = ()) -> None:
        puts, deletes = list(puts), list(deletes)
        self.write_units += len(puts) + len(deletes)
        await self._count(
            "batch_write",
            lambda: self.inner.batch_write(puts, deletes),
            _keys([(i["PK"], i["SK"]) for i in puts] + list(deletes)),
        )

    async def transact(self, ops: Sequence[WriteOp]) -> None:
        ops = list(ops)
        if ops and all(is_budget(op_key(op)) for op in ops):  # a pass of deliveries' charges
            self.budget_calls["transact"] += 1
            return await self.inner.transact(ops)
        self.write_units += 2 * len(ops)
        await self._count("transact", lambda: self.inner.transact(ops), _keys([op_key(op) for op in ops]))

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


def _keys(keys: Sequence[Key]) -> str:
    return "[" + ", ".join(f"{pk}/{sk}" for pk, sk in keys) + "]"


def is_budget(key: Key) -> bool:
    """A person's cost bucket (`store.keys.rate(subject, "cost")`)."""
    return key[0].startswith("RATE#") and key[1] == "cost"
