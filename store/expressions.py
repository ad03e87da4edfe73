"""Semantics shared by the adapters: conditions evaluated on an item, updates
applied to an item, sort-key tests and cursors (LastEvaluatedKey, made opaque)."""

from __future__ import annotations

import base64
import binascii
import json
import operator
from collections.abc import Callable
from typing import Any

from store.port import (
    INDEX_KEYS,
    And,
    Compare,
    Condition,
    Exists,
    In,
    Index,
    InvalidCursor,
    Item,
    NotExists,
    Or,
    StoreError,
    Update,
)

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def matches(condition: Condition, item: Item | None) -> bool:
    """DynamoDB's rules: a comparison with a missing attribute is false."""
    if isinstance(condition, Exists):
        return item is not None and condition.attr in item
    if isinstance(condition, NotExists):
        return item is None or condition.attr not in item
    if isinstance(condition, Compare):
        if item is None or condition.attr not in item:
            return condition.op == "<>"
        value = item[condition.attr]
        if condition.op in ("=", "<>"):
            # DynamoDB types are distinct: true is not 1.
            same = value == condition.value and (type(value) is bool) == (type(condition.value) is bool)
            return same if condition.op == "=" else not same
        if value is None or type(value) is bool or isinstance(value, (list, dict)):
            return False
        try:
            return _COMPARE[condition.op](value, condition.value)
        except TypeError:
            return False
    if isinstance(condition, In):
        if item is None or condition.attr not in item:
            return False
        value = item[condition.attr]
        return any(value == v and (type(value) is bool) == (type(v) is bool) for v in condition.values)
    if isinstance(condition, And):
        return all(matches(c, item) for c in condition.conditions)
    if isinstance(condition, Or):
        return any(matches(c, item) for c in condition.conditions)
    raise TypeError(f"unknown condition {condition!r}")


def apply_update(item: Item | None, update: Update) -> Item:
    """UpdateItem creates the item when it is missing, as DynamoDB does."""
    result: Item = dict(item) if item is not None else {"PK": update.key[0], "SK": update.key[1]}
    result.update(update.set)
    for name in update.remove:
        result.pop(name, None)
    for name, delta in update.add.items():
        current = result.get(name, 0)
        if isinstance(current, bool) or not isinstance(current, (int, float)):
            raise StoreError(f"ADD needs a number in {name}")
        result[name] = current + delta
    return result


def cursor_for(item: Item, index: Index) -> str:
    """The position just after `item`: its table key plus its index key."""
    names = {"PK", "SK", *INDEX_KEYS[index]}
    position = {name: item[name] for name in sorted(names)}
    raw = json.dumps(position, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, index: Index) -> dict[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError) as error:
        raise InvalidCursor("the cursor is not one this store made") from error
    names = {"PK", "SK", *INDEX_KEYS[index]}
    if (
        not isinstance(position, dict)
        or set(position) != names
        or not all(isinstance(v, str) for v in position.values())
    ):
        raise InvalidCursor("the cursor is not one this store made")
    return position
