"""The table port: the only way code above `store/` reaches storage.

Items are plain dicts of attribute name to value (str, int, float, bool, None,
list, dict). Every item has `PK` and `SK`; it is in GSI1 (or GSI2) only when it
has both `GSI1PK` and `GSI1SK` (or `GSI2PK` and `GSI2SK`), as in DynamoDB.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, TypedDict, Unpack

Item: TypeAlias = dict[str, Any]
Key: TypeAlias = tuple[str, str]
Index: TypeAlias = Literal["table", "GSI1", "GSI2"]

# An item holding this attribute (a number, Unix seconds) may be deleted by
# DynamoDB's TTL after that moment, within days; SQLite keeps it. Either way,
# readers treat it as gone once the moment has passed. Only items that mean
# nothing afterwards carry it: persisted documents and rate counters.
TTL_ATTRIBUTE = "expiresAt"

INDEX_KEYS: dict[str, tuple[str, str]] = {
    "table": ("PK", "SK"),
    "GSI1": ("GSI1PK", "GSI1SK"),
    "GSI2": ("GSI2PK", "GSI2SK"),
}

CompareOp = Literal["=", "<>", "<", "<=", ">", ">="]
SortOp = Literal["=", "<", "<=", ">", ">=", "begins_with", "between"]


# Conditions ---------------------------------------------------------------


@dataclass(frozen=True)
class Exists:
    """The item (or, with `attr`, one attribute of it) is present."""

    attr: str = "PK"


@dataclass(frozen=True)
class NotExists:
    """The item (or, with `attr`, one attribute of it) is absent."""

    attr: str = "PK"


@dataclass(frozen=True)
class Compare:
    attr: str
    op: CompareOp
    value: Any


@dataclass(frozen=True)
class In:
    attr: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class And:
    conditions: tuple[Condition, ...]


@dataclass(frozen=True)
class Or:
    conditions: tuple[Condition, ...]


Condition: TypeAlias = Exists | NotExists | Compare | In | And | Or


def eq(attr: str, value: Any) -> Compare:
    return Compare(attr, "=", value)


def all_of(*conditions: Condition) -> And:
    return And(tuple(conditions))


def any_of(*conditions: Condition) -> Or:
    return Or(tuple(conditions))


# Key conditions for queries ----------------------------------------------------


@dataclass(frozen=True)
class SortKey:
    op: SortOp
    value: str
    upper: str | None = None  # only for "between", inclusive like DynamoDB

    @classmethod
    def begins_with(cls, prefix: str) -> SortKey:
        return cls("begins_with", prefix)

    @classmethod
    def between(cls, low: str, high: str) -> SortKey:
        return cls("between", low, high)


@dataclass(frozen=True)
class Page:
    items: list[Item]
    # Opaque; pass it back as `cursor` to continue. None when nothing is left.
    cursor: str | None


# Writes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """SET, REMOVE and ADD on one item, as a DynamoDB UpdateItem does."""

    key: Key
    set: Mapping[str, Any] = field(default_factory=dict)
    remove: Sequence[str] = ()
    add: Mapping[str, int] = field(default_factory=dict)
    condition: Condition | None = None


@dataclass(frozen=True)
class Put:
    item: Item
    condition: Condition | None = None


@dataclass(frozen=True)
class Delete:
    key: Key
    condition: Condition | None = None


@dataclass(frozen=True)
class Check:
    key: Key
    condition: Condition


WriteOp: TypeAlias = Put | Update | Delete | Check


def op_key(op: WriteOp) -> Key:
    if isinstance(op, Put):
        return (op.item["PK"], op.item["SK"])
    return op.key


# Errors -----------------------------------------------------------------------


class StoreError(Exception):
    pass


class ConditionFailed(StoreError):
    def __init__(self, key: Key) -> None:
        super().__init__(f"condition failed on {key[0]} / {key[1]}")
        self.key = key


@dataclass(frozen=True)
class Cancellation:
    index: int
    key: Key
    reason: str  # "ConditionalCheckFailed", "TransactionConflict", ...


class TransactionCancelled(StoreError):
    def __init__(self, reasons: Sequence[Cancellation]) -> None:
        self.reasons = list(reasons)
        failed = ", ".join(f"#{r.index} {r.key[0]}/{r.key[1]}: {r.reason}" for r in self.reasons)
        super().__init__(f"transaction cancelled ({failed})")

    @property
    def failed_keys(self) -> list[Key]:
        return [r.key for r in self.reasons]

    def failed_on(self, key: Key) -> bool:
        return any(r.key == key for r in self.reasons)


class InvalidCursor(StoreError):
    pass


class StoreUnavailable(StoreError):
    """The store did not answer (a timeout, a lost connection, throttling past
    the retries, a full disk). `outcome_known` is False for a write that was
    sent and not answered: it may or may not have been applied."""

    def __init__(self, message: str, *, outcome_known: bool) -> None:
        super().__init__(message)
        self.outcome_known = outcome_known


MAX_TRANSACTION_ITEMS = 100


class Table(Protocol):
    """What every storage adapter offers. All reads are strongly consistent on
    the table and eventually consistent on the GSIs, as in DynamoDB."""

    async def get(self, key: Key) -> Item | None: ...

    async def batch_get(self, keys: Sequence[Key]) -> dict[Key, Item]: ...

    async def query(
        self,
        pk: str,
        sk: SortKey | None = None,
        *,
        index: Index = "table",
        descending: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page: ...

    async def put(self, item: Item, condition: Condition | None = None) -> None: ...

    async def update(self, update: Update) -> Item: ...

    async def delete(self, key: Key, condition: Condition | None = None) -> Item | None: ...

    async def batch_write(self, puts: Sequence[Item] = (), deletes: Sequence[Key] = ()) -> None: ...

    async def transact(self, ops: Sequence[WriteOp]) -> None: ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


# Walking a query ----------------------------------------------------------------

PAGE_SIZE = 100


class WalkOptions(TypedDict, total=False):
    index: Index
    descending: bool
    page_size: int  # items read at a time (PAGE_SIZE when not given)


async def pages(
    table: Table, pk: str, sk: SortKey | None = None, **options: Unpack[WalkOptions]
) -> AsyncIterator[list[Item]]:
    """Every item a query matches, a page at a time (empty pages skipped). The
    caller may stop early: nothing more is read than it asked for."""
    index, descending = options.get("index", "table"), options.get("descending", False)
    limit = options.get("page_size", PAGE_SIZE)
    cursor: str | None = None
    while True:
        page = await table.query(pk, sk, index=index, descending=descending, limit=limit, cursor=cursor)
        if page.items:
            yield page.items
        if page.cursor is None:
            return
        cursor = page.cursor


async def every_item(
    table: Table, pk: str, sk: SortKey | None = None, **options: Unpack[WalkOptions]
) -> AsyncIterator[Item]:
    """Every item a query matches, one at a time, reading a page ahead."""
    async for found in pages(table, pk, sk, **options):
        for item in found:
            yield item


async def all_items(
    table: Table, pk: str, sk: SortKey | None = None, **options: Unpack[WalkOptions]
) -> list[Item]:
    return [item async for item in every_item(table, pk, sk, **options)]


# Many conditional updates ---------------------------------------------------------


async def update_each(table: Table, updates: Sequence[Update]) -> set[Key]:
    """Each update on its own condition, in as few calls as the table allows:
    up to `MAX_TRANSACTION_ITEMS` in one transaction (a lone update as itself),
    the chunks at once. An update whose condition fails is left out and the rest
    of its chunk committed without it; the keys left out are returned. Each key
    at most once. The updates are no more atomic together than apart: the
    transaction is only how one call carries several conditional writes."""
    refused: set[Key] = set()

    async def commit(part: list[Update]) -> None:
        while part:
            if len(part) == 1:
                try:
                    await table.update(part[0])
                except ConditionFailed:
                    refused.add(part[0].key)
                return
            try:
                await table.transact(part)
                return
            except TransactionCancelled as cancelled:
                failed = {r.key for r in cancelled.reasons if r.reason == "ConditionalCheckFailed"}
                if not failed:
                    raise  # a conflict past the engine's own retries: not the items' doing
                refused.update(failed)
                part = [update for update in part if update.key not in failed]

    size = MAX_TRANSACTION_ITEMS
    await asyncio.gather(*(commit(list(updates[n : n + size])) for n in range(0, len(updates), size)))
    return refused
