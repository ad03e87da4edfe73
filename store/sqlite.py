"""The embedded engine: one SQLite file with DynamoDB's item, index and
condition semantics, so a fresh clone runs with nothing else installed.

Reads run on the event loop thread, on a connection of their own: each is a
few local page reads, and a WAL reader never waits for a writer, so that is
cheaper than a hop to a thread. Writes (`store.sqlite_writer`) asked for in
one turn of the loop commit together; they are made on the loop while SQLite's
write lock is free, and by a thread while another process holds it, so the
loop never waits for it. Each takes the write lock up front (BEGIN IMMEDIATE),
so a condition is checked and its write made with no other writer in between,
across processes too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from store import formats
from store.expressions import apply_update, cursor_for, decode_cursor, matches
from store.port import (
    MAX_TRANSACTION_ITEMS,
    TTL_ATTRIBUTE,
    Cancellation,
    Check,
    Condition,
    ConditionFailed,
    Delete,
    Index,
    InvalidCursor,
    Item,
    Key,
    Page,
    Put,
    SortKey,
    StoreError,
    StoreUnavailable,
    TransactionCancelled,
    Update,
    WriteOp,
    op_key,
)
from store.sqlite_writer import Writer

# How long a write waits for another process's write lock before failing.
BUSY_TIMEOUT = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    pk TEXT NOT NULL, sk TEXT NOT NULL,
    gsi1pk TEXT, gsi1sk TEXT, gsi2pk TEXT, gsi2sk TEXT,
    body TEXT NOT NULL,
    PRIMARY KEY (pk, sk)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gsi1 ON items (gsi1pk, gsi1sk, pk, sk) WHERE gsi1pk IS NOT NULL;
CREATE INDEX IF NOT EXISTS gsi2 ON items (gsi2pk, gsi2sk, pk, sk) WHERE gsi2pk IS NOT NULL;
"""


def _above_prefix(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix`, in
    SQLite's byte order (UTF-8's is the code points'), or None where there is
    no such string to write (an empty prefix, or one ending where the next
    code point is not one)."""
    if not prefix:
        return None
    following = ord(prefix[-1]) + 1
    if following > 0x10FFFF or 0xD800 <= following <= 0xDFFF:
        return None
    return prefix[:-1] + chr(following)


_COLUMNS: dict[str, tuple[str, str]] = {
    "table": ("pk", "sk"),
    "GSI1": ("gsi1pk", "gsi1sk"),
    "GSI2": ("gsi2pk", "gsi2sk"),
}
_SQL_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _index_values(item: Item, pk_name: str, sk_name: str) -> tuple[str | None, str | None]:
    # Sparse, as in DynamoDB: in the index only with both key attributes.
    pk, sk = item.get(pk_name), item.get(sk_name)
    if isinstance(pk, str) and isinstance(sk, str):
        return pk, sk
    return None, None


def _validate(item: Item) -> None:
    if not isinstance(item.get("PK"), str) or not isinstance(item.get("SK"), str):
        raise StoreError("an item needs string PK and SK")
    for name in ("GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK"):
        if name in item and not isinstance(item[name], str):
            raise StoreError(f"{name} must be a string")


def _check_keeps_key(update: Update) -> None:
    # (Made for every update a transaction holds: membership tests, no sets built.)
    changed = update.set
    pk, sk = update.key
    if (
        ("PK" in changed and changed["PK"] != pk)
        or ("SK" in changed and changed["SK"] != sk)
        or any(name in update.remove or name in update.add for name in ("PK", "SK"))
    ):
        raise StoreError("an update cannot change an item's key")


def _connect(path: str, timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    # WAL appends without a sync per commit; its checkpoints sync.
    db.execute("PRAGMA synchronous=NORMAL")
    # A statement that writes many rows inside a transaction keeps a journal
    # of its own (to undo itself alone): in memory, not a temporary file.
    db.execute("PRAGMA temp_store=MEMORY")
    # Up to 64 MB of pages: a burst of openings touches tens of MB of items.
    db.execute("PRAGMA cache_size=-65536")
    return db


def _read(db: sqlite3.Connection, key: Key) -> Item | None:
    row = db.execute("SELECT body FROM items WHERE pk = ? AND sk = ?", key).fetchone()
    return None if row is None else orjson.loads(row[0])


def _read_many(db: sqlite3.Connection, keys: Sequence[Key]) -> dict[Key, Item]:
    found: dict[Key, Item] = {}
    unique = list(dict.fromkeys(keys))
    # SQLite caps bound parameters; 400 keys is 800, well under it.
    for start in range(0, len(unique), 400):
        chunk = unique[start : start + 400]
        placeholders = ",".join("(?, ?)" for _ in chunk)
        params = [part for key in chunk for part in key]
        # A join from the wanted keys, so each is a search of the primary
        # key: `(pk, sk) IN (VALUES ...)` scans the whole table instead.
        rows = db.execute(
            f"SELECT items.pk, items.sk, items.body FROM (VALUES {placeholders}) AS wanted"
            " CROSS JOIN items ON items.pk = wanted.column1 AND items.sk = wanted.column2",
            params,
        ).fetchall()
        for pk, sk, body in rows:
            found[(pk, sk)] = orjson.loads(body)
    return found


# Rows per INSERT: 7 parameters each, well under SQLite's cap of 32,766.
_ROWS_PER_INSERT = 500


class _Changes:
    """What one write makes, worked out in full before any of it is written:
    a write that fails (its condition, an update that cannot apply, an item
    that cannot be encoded) has written nothing, so writes sharing a
    transaction need no savepoint each."""

    __slots__ = ("deletes", "rows")

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str | None, str | None, str | None, str | None, str]] = []
        self.deletes: list[Key] = []

    def write(self, item: Item) -> Item:
        """The one place a row is made: what it stores is in the current
        format (`store.formats`), and that is what it answers."""
        _validate(item)
        item = formats.stamped(item)
        g1 = _index_values(item, "GSI1PK", "GSI1SK")
        g2 = _index_values(item, "GSI2PK", "GSI2SK")
        self.rows.append((item["PK"], item["SK"], *g1, *g2, orjson.dumps(item).decode()))
        return item

    def remove(self, key: Key) -> None:
        self.deletes.append(key)


def _apply(db: sqlite3.Connection, changes: _Changes) -> None:
    """A write's rows in one statement (each statement is a hand-off of the
    GIL, and a wait for it while the loop runs), then its deletes."""
    rows = changes.rows
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        db.execute(
            "INSERT OR REPLACE INTO items (pk, sk, gsi1pk, gsi1sk, gsi2pk, gsi2sk, body) VALUES "
            + ",".join("(?, ?, ?, ?, ?, ?, ?)" for _ in chunk),
            [value for row in chunk for value in row],
        )
    if changes.deletes:
        db.executemany("DELETE FROM items WHERE pk = ? AND sk = ?", changes.deletes)


def _check(key: Key, current: Item | None, condition: Condition | None) -> None:
    if condition is not None and not matches(condition, current):
        raise ConditionFailed(key)


class SqliteTable:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path == ":memory:" or self.path.startswith("file:"):
            # Two connections share the table (see the module's docstring):
            # only a file is seen alike by both.
            raise StoreError("the embedded store needs a file's path")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(_connect(self.path)) as setup:
            setup.execute("PRAGMA journal_mode=WAL")
            setup.executescript(_SCHEMA)
        # The loop's connection, for reads and for the writes made on the loop:
        # one page cache, kept warm (another connection's writes would empty
        # it). It never waits for a lock: a WAL reader has none to wait for,
        # and a write that finds the lock held goes to the writer's thread.
        self._db = _connect(self.path, timeout=0)
        self._writer = Writer(self._db, functools.partial(_connect, self.path), _apply)

    # Reads --------------------------------------------------------------------

    async def get(self, key: Key) -> Item | None:
        return _read(self._db, key)

    async def batch_get(self, keys: Sequence[Key]) -> dict[Key, Item]:
        return _read_many(self._db, keys)

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
        if limit is not None and limit < 1:
            raise StoreError("limit must be at least 1")
        if sk is not None and sk.op == "between" and sk.upper is None:
            raise StoreError("between needs an upper bound")
        pk_col, sk_col = _COLUMNS[index]
        where = [f"{pk_col} = ?"]
        params: list[Any] = [pk]
        if sk is not None:
            if sk.op == "begins_with":
                # Bounds the index can seek between, then the prefix itself.
                where.append(f"{sk_col} >= ?")
                params.append(sk.value)
                above = _above_prefix(sk.value)
                if above is not None:
                    where.append(f"{sk_col} < ?")
                    params.append(above)
                where.append(f"substr({sk_col}, 1, ?) = ?")
                params += [len(sk.value), sk.value]
            elif sk.op == "between":
                where.append(f"{sk_col} BETWEEN ? AND ?")
                params += [sk.value, sk.upper]
            else:
                where.append(f"{sk_col} {_SQL_OPS[sk.op]} ?")
                params.append(sk.value)
        order_cols = [sk_col, "pk", "sk"] if index != "table" else ["sk"]
        if cursor is not None:
            position = decode_cursor(cursor, index)
            if position[_index_pk_name(index)] != pk:
                raise InvalidCursor("the cursor belongs to another partition")
            after = [position[_attr_of(col, index)] for col in order_cols]
            cmp = "<" if descending else ">"
            where.append(f"({', '.join(order_cols)}) {cmp} ({', '.join('?' for _ in after)})")
            params += after
        direction = "DESC" if descending else "ASC"
        sql = (
            f"SELECT body FROM items WHERE {' AND '.join(where)} "
            f"ORDER BY {', '.join(f'{c} {direction}' for c in order_cols)}"
        )
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit + 1)
        rows = self._db.execute(sql, params).fetchall()
        items = [orjson.loads(row[0]) for row in rows]
        next_cursor = None
        if limit is not None and len(items) > limit:
            items = items[:limit]
            next_cursor = cursor_for(items[-1], index)
        return Page(items, next_cursor)

    # Writes -------------------------------------------------------------------
    # Each is a job of the writer's (`store.sqlite_writer`): it reads and checks
    # its condition, works out its `_Changes`, and the writer writes them in the
    # same transaction; its caller is answered once that commits.

    async def put(self, item: Item, condition: Condition | None = None) -> None:
        _validate(item)
        key = (item["PK"], item["SK"])

        def work(db: sqlite3.Connection) -> tuple[None, _Changes]:
            _check(key, _read(db, key), condition)
            changes = _Changes()
            changes.write(item)
            return None, changes

        await self._writer.run(work)

    async def update(self, update: Update) -> Item:
        _check_keeps_key(update)

        def work(db: sqlite3.Connection) -> tuple[Item, _Changes]:
            current = _read(db, update.key)
            _check(update.key, current, update.condition)
            changes = _Changes()
            return changes.write(apply_update(current, update)), changes

        return await self._writer.run(work)

    async def delete(self, key: Key, condition: Condition | None = None) -> Item | None:
        def work(db: sqlite3.Connection) -> tuple[Item | None, _Changes]:
            current = _read(db, key)
            _check(key, current, condition)
            changes = _Changes()
            changes.remove(key)
            return current, changes

        return await self._writer.run(work)

    async def batch_write(self, puts: Sequence[Item] = (), deletes: Sequence[Key] = ()) -> None:
        changes = _Changes()
        for item in puts:
            changes.write(item)
        for key in deletes:
            changes.remove(key)
        await self._writer.run(lambda db: (None, changes))

    async def transact(self, ops: Sequence[WriteOp]) -> None:
        if not ops:
            return
        if len(ops) > MAX_TRANSACTION_ITEMS:
            raise StoreError(f"a transaction holds at most {MAX_TRANSACTION_ITEMS} items")
        for op in ops:
            if isinstance(op, Update):
                _check_keeps_key(op)
        op_keys = [op_key(op) for op in ops]
        if len(set(op_keys)) != len(op_keys):
            raise StoreError("a transaction may touch each item only once")

        def work(db: sqlite3.Connection) -> tuple[None, _Changes]:
            found = _read_many(db, op_keys)
            currents = [found.get(key) for key in op_keys]
            failed = [
                Cancellation(i, key, "ConditionalCheckFailed")
                for i, (op, key, current) in enumerate(zip(ops, op_keys, currents, strict=True))
                if op.condition is not None and not matches(op.condition, current)
            ]
            if failed:
                raise TransactionCancelled(failed)
            changes = _Changes()
            for op, key, current in zip(ops, op_keys, currents, strict=True):
                if isinstance(op, Put):
                    changes.write(op.item)
                elif isinstance(op, Update):
                    changes.write(apply_update(current, op))
                elif isinstance(op, Delete):
                    changes.remove(key)
                elif not isinstance(op, Check):
                    raise TypeError(f"unknown write {op!r}")
            return None, changes

        await self._writer.run(work)

    # Expiry -------------------------------------------------------------------

    async def sweep_expired(self, now: float | None = None, batch: int = 500) -> int:
        """What DynamoDB's TTL does there: items whose `expiresAt` (seconds since
        the epoch) has passed are deleted, `batch` at a time; answers how many."""
        moment = time.time() if now is None else now
        total = 0

        def work(db: sqlite3.Connection) -> tuple[int, _Changes]:
            expired = db.execute(
                f"SELECT pk, sk FROM items WHERE json_extract(body, '$.{TTL_ATTRIBUTE}') < ? LIMIT ?",
                (moment, batch),
            ).fetchall()
            changes = _Changes()
            changes.deletes = expired
            return len(expired), changes

        while True:
            deleted = await self._writer.run(work)
            total += deleted
            if deleted < batch:
                return total
            await asyncio.sleep(0)  # a long sweep lets other writes in between batches

    async def sweep_every(self, seconds: float) -> None:
        """`sweep_expired` now and every `seconds`, until cancelled."""
        while True:
            try:
                await self.sweep_expired()
            except (sqlite3.Error, StoreUnavailable):
                logging.getLogger("mifamilias.store").exception("could not sweep expired items")
            await asyncio.sleep(seconds)

    async def ping(self) -> None:
        self._db.execute("SELECT 1").fetchone()

    async def close(self) -> None:
        # The writer closes the loop's connection, then its thread's: the last
        # connection to close checkpoints the WAL into the file, a sync that
        # belongs off the loop.
        await self._writer.close()


def _index_pk_name(index: Index) -> str:
    return {"table": "PK", "GSI1": "GSI1PK", "GSI2": "GSI2PK"}[index]


def _attr_of(column: str, index: Index) -> str:
    return {"pk": "PK", "sk": "SK", "gsi1sk": "GSI1SK", "gsi2sk": "GSI2SK"}[column]
