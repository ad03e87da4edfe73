"""Per-request loaders. One loader for every point read, keyed by (PK, SK), so
all the items one resolver level needs leave in a single batch get."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiodataloader import DataLoader

from store.port import Item, Key, Table


class ItemLoader(DataLoader[Key, Item | None]):
    def __init__(self, table: Table) -> None:
        super().__init__(max_batch_size=100)
        self.table = table

    async def batch_load_fn(self, keys: Sequence[Key]) -> list[Item | None]:
        found = await self.table.batch_get(list(keys))
        return [found.get(key) for key in keys]


class Loaders:
    def __init__(self, table: Table) -> None:
        self.item = ItemLoader(table)

    async def many(self, keys: Sequence[Key]) -> list[Item | None]:
        result: list[Any] = await self.item.load_many(list(keys))
        return result

    def forget(self, *keys: Key) -> None:
        for key in keys:
            self.item.clear(key)

    def remember(self, item: Item) -> None:
        key = (item["PK"], item["SK"])
        self.item.clear(key)
        self.item.prime(key, item)
