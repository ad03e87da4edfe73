"""The embedded engine reads by its indexes, however large the table or partition:
DynamoDB's cost of a read does not grow with the table, and the embedded
engine's must not either (a fan-out's one batch read of two thousand keys
scanned a table of hundreds of thousands of items, per chunk)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from store.port import SortKey
from store.sqlite import SqliteTable


async def steps(table: SqliteTable, read: Callable[[], Awaitable[Any]]) -> int:
    """How many SQLite virtual-machine steps (in units of 100) a read takes."""
    counted = 0

    def count() -> int:
        nonlocal counted
        counted += 1
        return 0  # go on

    table._db.set_progress_handler(count, 100)
    try:
        await read()
    finally:
        table._db.set_progress_handler(None, 100)
    return counted


async def test_a_batch_read_costs_the_same_in_a_small_table_and_a_large_one(tmp_path: Path) -> None:
    table = SqliteTable(tmp_path / "t.sqlite3")
    try:
        wanted = [("FAMILY#f", f"MEMBER#{n}") for n in range(5)]
        await table.batch_write(puts=[{"PK": pk, "SK": sk, "n": 1} for pk, sk in wanted])
        small = await steps(table, lambda: table.batch_get(wanted))
        for start in range(0, 20_000, 1_000):
            await table.batch_write(
                puts=[{"PK": f"FAMILY#{n % 97}", "SK": f"ITEM#{n}"} for n in range(start, start + 1_000)]
            )
        found = await table.batch_get(wanted)
        assert set(found) == set(wanted)
        large = await steps(table, lambda: table.batch_get(wanted))
        # A scan visits 20,000 rows (thousands of steps of 100); a search of
        # five keys, a handful in either table.
        assert large <= small + 5, (small, large)
    finally:
        await table.close()


async def test_a_prefix_query_costs_the_same_in_a_small_partition_and_a_large_one(tmp_path: Path) -> None:
    table = SqliteTable(tmp_path / "t.sqlite3")
    try:
        members = ["MEMBER#a", "MEMBER#b", "MEMBER#\U0010ffff"]
        neighbours = [
            "MEMBER",
            "MEMBER$",
            "MEMBES#a",
            "ITEM#z",
        ]  # sort beside the prefix, do not start with it
        await table.batch_write(puts=[{"PK": "FAMILY#f", "SK": sk} for sk in members + neighbours])

        async def read() -> list[str]:
            page = await table.query("FAMILY#f", SortKey.begins_with("MEMBER#"))
            return [item["SK"] for item in page.items]

        assert await read() == members
        small = await steps(table, read)
        for start in range(0, 20_000, 1_000):
            await table.batch_write(
                puts=[
                    {"PK": "FAMILY#f", "SK": f"{'ITEM' if n % 2 else 'POST'}#{n}"}
                    for n in range(start, start + 1_000)
                ]
            )
        assert await read() == members
        large = await steps(table, read)
        assert large <= small + 5, (small, large)
    finally:
        await table.close()
