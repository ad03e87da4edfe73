"""The embedded engine's writes wait for SQLite's write lock off the event
loop: another process holding it (several servers share one file) must not
stop this one answering. Writes that arrive together share a commit, each
keeping its own condition and outcome, on both engines alike."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from store.port import (
    ConditionFailed,
    Exists,
    NotExists,
    Put,
    StoreUnavailable,
    Table,
    TransactionCancelled,
    Update,
)
from store.sqlite import SqliteTable


@contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """Another connection (as another server process's would) holding the write lock."""
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


async def test_the_loop_answers_while_another_connection_holds_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    table = SqliteTable(path)
    try:
        await table.put({"PK": "A", "SK": "before"})
        ticks = 0

        async def ticking() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(ticking())
        with write_lock_held(path):
            writing = asyncio.create_task(table.put({"PK": "A", "SK": "waited"}))
            # While the write waits for the lock, the loop turns: the ticker
            # runs and reads answer (the WAL's readers do not wait for writers).
            for _ in range(20):
                await asyncio.sleep(0)  # a turn of the loop
                assert await table.get(("A", "before")) is not None
            assert ticks >= 20
            assert not writing.done()
            assert await table.get(("A", "waited")) is None
        await writing
        ticker.cancel()
        assert await table.get(("A", "waited")) is not None
    finally:
        await table.close()


async def test_a_write_whose_caller_was_cancelled_is_made_all_the_same(tmp_path: Path) -> None:
    """As on DynamoDB, where a request sent is not taken back: the caller
    cannot tell, and the item's conditions make a retry safe."""
    path = tmp_path / "t.sqlite3"
    table = SqliteTable(path)
    try:
        with write_lock_held(path):
            writing = asyncio.create_task(table.put({"PK": "A", "SK": "cancelled"}))
            await asyncio.sleep(0)
            writing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await writing
        await table.put({"PK": "A", "SK": "after"})  # writes are made in order
        assert await table.get(("A", "cancelled")) is not None
    finally:
        await table.close()


async def test_closing_stops_the_writer_and_refuses_later_writes(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    table = SqliteTable(tmp_path / "t.sqlite3")
    (writer,) = set(threading.enumerate()) - before
    await table.put({"PK": "A", "SK": "B"})
    await table.close()
    assert not writer.is_alive()
    with pytest.raises(StoreUnavailable):
        await table.put({"PK": "A", "SK": "C"})
    await table.close()  # a second close is harmless


async def test_concurrent_conditional_writes_each_keep_their_own_outcome(table: Table) -> None:
    await table.put({"PK": "C", "SK": "counter", "n": 0})
    outcomes = await asyncio.gather(
        *(table.put({"PK": "C", "SK": "once", "by": n}, NotExists()) for n in range(10)),
        *(table.update(Update(("C", "counter"), add={"n": 1}, condition=Exists())) for _ in range(10)),
        # Cancelled on its missing item: the puts beside it stand.
        table.transact(
            [Put({"PK": "C", "SK": "beside"}), Update(("C", "missing"), set={"x": 1}, condition=Exists())]
        ),
        table.delete(("C", "missing"), Exists()),
        return_exceptions=True,
    )
    puts, updates, (cancelled, missing) = outcomes[:10], outcomes[10:20], outcomes[20:]
    assert sum(outcome is None for outcome in puts) == 1
    assert all(isinstance(outcome, ConditionFailed) for outcome in puts if outcome is not None)
    assert sorted(item["n"] for item in updates if isinstance(item, dict)) == list(range(1, 11))
    assert isinstance(cancelled, TransactionCancelled)
    assert isinstance(missing, ConditionFailed)
    assert (await table.get(("C", "counter")) or {})["n"] == 10
    assert await table.get(("C", "beside")) is None
    once = await table.get(("C", "once"))
    assert once is not None and puts[once["by"]] is None
