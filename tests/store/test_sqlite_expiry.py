"""SQLite sweeps what DynamoDB's TTL deletes: items whose `expiresAt` has passed."""

from __future__ import annotations

from pathlib import Path

from store.port import TTL_ATTRIBUTE
from store.sqlite import SqliteTable


async def test_the_sweep_deletes_expired_items_and_keeps_the_rest(tmp_path: Path) -> None:
    table = SqliteTable(tmp_path / "t.sqlite3")
    try:
        for n in range(7):
            await table.put({"PK": "DOC", "SK": f"old-{n}", TTL_ATTRIBUTE: 1_000 + n})
        await table.put({"PK": "DOC", "SK": "fresh", TTL_ATTRIBUTE: 3_000})
        await table.put({"PK": "DOC", "SK": "forever"})
        assert await table.sweep_expired(now=2_000, batch=3) == 7
        left = await table.query("DOC")
        assert sorted(item["SK"] for item in left.items) == ["forever", "fresh"]
        assert await table.sweep_expired(now=2_000) == 0
    finally:
        await table.close()
