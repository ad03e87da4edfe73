"""Work over many records in slices that give the event loop a turn between them.

A capsule may go to a whole family (1,000 people): building its items, its
notes or its events in one loop holds every other request for as long. Each
slice is short (`SLICE` records), and `asyncio.sleep(0)` between slices lets
the loop run what is waiting. Only the building is sliced: what is written,
and in which transactions, stays as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

SLICE = 100


async def in_slices(records: Iterable[T], size: int = SLICE) -> AsyncIterator[Sequence[T]]:
    """The records `size` at a time, with a turn of the loop before each slice but the first."""
    listed = records if isinstance(records, Sequence) else list(records)
    for start in range(0, len(listed), size):
        if start:
            await asyncio.sleep(0)
        yield listed[start : start + size]


async def built(records: Iterable[T], make: Callable[[T], R], size: int = SLICE) -> list[R]:
    """`[make(record) for record in records]`, a slice at a time."""
    listed = records if isinstance(records, Sequence) else list(records)
    if len(listed) <= size:
        return [make(record) for record in listed]  # one slice: no turn to give
    made: list[R] = []
    async for part in in_slices(listed, size):
        made.extend(make(record) for record in part)
    return made


async def each(records: Iterable[T], do: Callable[[T], object], size: int = SLICE) -> None:
    """`do(record)` for each record, a slice at a time."""
    async for part in in_slices(records, size):
        for record in part:
            do(record)
