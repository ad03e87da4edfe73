"""Per-request loaders. One loader for every point read, keyed by (PK, SK), so
all the items one resolver level needs leave in a single batch get."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

from aiodataloader import DataLoader, Loader, dispatch_queue

from resolvers.core.turns import TURNS
from store.expressions import apply_update
from store.port import Index, Item, Key, Page, SortKey, Table, Update

_dispatching: set[asyncio.Future[None]] = set()
K = TypeVar("K")
V = TypeVar("V")


class Decodable(Protocol):
    @classmethod
    def from_item(cls, item: Item) -> Self: ...


D = TypeVar("D", bound=Decodable)


class LevelLoader(DataLoader[K, V]):
    """A DataLoader that dispatches once a loop iteration passes with no new
    key, and none of its operation's work waits for a turn on the loop
    (`resolvers.core.turns`). Sibling resolvers resume over several
    iterations (each finishing its own sub-tree first, or waiting its turn
    behind other operations); waiting for them makes one batch of one level."""

    def __init__(self, *args: Any, owner: object = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner

    def do_resolve_reject(self, key: K, future: asyncio.Future[V]) -> None:
        self._queue.append(Loader(key=key, future=future))
        if len(self._queue) == 1:
            task = asyncio.ensure_future(self._dispatch_when_settled())
            _dispatching.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(_dispatching.discard)

    async def _dispatch_when_settled(self) -> None:
        size = -1
        while size != len(self._queue) or (self.owner is not None and TURNS.waiting_for(self.owner)):
            size = len(self._queue)
            await asyncio.sleep(0)
        dispatch_queue(self)


class ItemLoader(LevelLoader[Key, Item | None]):
    def __init__(self, table: Table, owner: object = None) -> None:
        # The loader's cache, ours to look into: asked for, or loaded, in this operation.
        self.cached: dict[Key, asyncio.Future[Item | None]] = {}
        super().__init__(max_batch_size=100, cache_map=self.cached, owner=owner)
        self.table = table

    async def batch_load_fn(self, keys: Sequence[Key]) -> list[Item | None]:
        found = await self.table.batch_get(list(keys))
        return [found.get(key) for key in keys]


@dataclass(frozen=True)
class QuerySpec:
    pk: str
    sk: SortKey | None = None
    index: Index = "table"
    descending: bool = False
    limit: int | None = None
    cursor: str | None = None


class QueryLoader(LevelLoader[QuerySpec, Page]):
    """Queries cannot be batched into one call, but the queries of one resolver
    level (say, the members of each of my families) can run together and answer
    together, so the next level's point reads still leave in one batch get."""

    def __init__(self, table: Table, owner: object = None) -> None:
        super().__init__(cache=False, owner=owner)
        self.table = table

    async def batch_load_fn(self, specs: Sequence[QuerySpec]) -> list[Page]:
        return list(
            await asyncio.gather(
                *(
                    self.table.query(
                        s.pk, s.sk, index=s.index, descending=s.descending, limit=s.limit, cursor=s.cursor
                    )
                    for s in specs
                )
            )
        )


class Loaders:
    def __init__(self, table: Table, owner: object = None) -> None:
        # `owner`: whose turns on the loop the batches wait for (the operation's context).
        self.item = ItemLoader(table, owner)
        self._table, self._owner = table, owner
        self._query: QueryLoader | None = None
        # Read verdicts of this operation (resolvers.domain.access); whatever changes
        # what was loaded forgets them all, so none outlives what it read.
        self.verdicts: dict[tuple[object, ...], bool] = {}
        # Records decoded from loaded items, by the item object: the read rule
        # decodes a comment's content once per comment otherwise. An item the
        # operation changes is a new object, so it is decoded anew.
        self._decoded: dict[tuple[type, int], tuple[Item, Any]] = {}
        # Reads made before execution for its sake, taken once by the resolver
        # that would make them (the viewer's families, read to size an estimate).
        self.prefetched: dict[str, Any] = {}

    @property
    def query(self) -> QueryLoader:
        # Made when first asked for: a subscriber's loaders are made afresh for
        # every event, and most events query nothing.
        if self._query is None:
            self._query = QueryLoader(self._table, self._owner)
        return self._query

    def decoded(self, record_type: type[D], item: Item) -> D:
        """`record_type.from_item(item)`, once per loaded item."""
        key = (record_type, id(item))
        found = self._decoded.get(key)
        if found is not None and found[0] is item:
            record: D = found[1]
            return record
        record = record_type.from_item(item)
        self._decoded[key] = (item, record)  # the item kept alive: its id stays its own
        return record

    async def many(self, keys: Sequence[Key]) -> list[Item | None]:
        result: list[Any] = await self.item.load_many(list(keys))
        return result

    def ask(self, *keys: Key) -> None:
        """Starts loading `keys` with the batch forming now, without waiting.
        An operation asks, beside what the read rule needs, for what it will
        need once the rule has answered: those items then cost no round trip
        of their own, and the rule itself stays where it is. A failure reaches
        whoever loads the key later."""
        for key in keys:
            if key not in self.item.cached:
                self.item.load(key).add_done_callback(_retrieved)

    def load_with(self, key: Key, *also: Key) -> asyncio.Future[Item | None]:
        """Loads `key`; when it is not asked for yet, `also` joins its batch
        (asked, not awaited). Once `key` is cached nothing more is asked, so no
        batch of its own is left running after the operation."""
        if key not in self.item.cached:
            self.ask(*also)
        return self.item.load(key)

    def written(self, before: Sequence[Item | None], updates: Sequence[Update]) -> list[Item]:
        """What committed updates made of the items as this operation read them
        (`before`, in the same order), remembered so the answer shows them
        without reading them again. A change someone else made in between
        shows on the next read, as it would had it landed after this one."""
        after = [apply_update(item, update) for item, update in zip(before, updates, strict=True)]
        for item in after:
            self.remember(item)
        return after

    def forget(self, *keys: Key) -> None:
        self.verdicts.clear()
        for key in keys:
            self.item.clear(key)

    def prime(self, found: Sequence[Item]) -> None:
        """Items read by a query, as they are now; what is cached already stays."""
        for item in found:
            self.item.prime((item["PK"], item["SK"]), item)

    def remember(self, item: Item) -> None:
        key = (item["PK"], item["SK"])
        self.verdicts.clear()
        self.item.clear(key)
        self.item.prime(key, item)


def _retrieved(future: asyncio.Future[Any]) -> None:
    # Asked-for loads nobody awaited must not log "exception never retrieved".
    if not future.cancelled():
        future.exception()
