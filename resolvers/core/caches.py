"""The process's bounded caches, of one kind: least recently used out first.

Prepared operations, parsed documents, persisted documents and the users a
process has seen are each an LRU (cachetools'); this is where their bounds are
set, so that none grows with what clients send. What may be only a little old
(the families and open capsules the push workers read) is an LRU whose entries
also expire."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cachetools import LRUCache, TTLCache

K = TypeVar("K")
V = TypeVar("V")


def lru(max_entries: int) -> LRUCache[K, V]:
    """At most `max_entries` entries."""
    return LRUCache(maxsize=max_entries)


def weighed_lru(max_entries: int, max_weight: int, weight: Callable[[V], int]) -> LRUCache[K, V]:
    """At most `max_entries` entries whose weights add up to at most
    `max_weight`. One bound serves both: an entry weighs at least an even
    share of `max_weight`, so entries past `max_entries` do not fit."""
    share = max(1, max_weight // max_entries)

    def weighed(value: V) -> int:
        return max(share, weight(value))

    return LRUCache(maxsize=max_weight, getsizeof=weighed)


def lru_for(max_entries: int, seconds: float) -> TTLCache[K, V]:
    """At most `max_entries` entries, each for at most `seconds` after it was
    put (on the monotonic clock): what may be a little old, not much."""
    return TTLCache(maxsize=max_entries, ttl=seconds)
