"""The one kind of bounded cache: recency decides what goes, and a weighed
cache holds both of its bounds."""

from __future__ import annotations

from cachetools import LRUCache

from resolvers.core.caches import lru, weighed_lru


def test_the_least_recently_used_goes_first() -> None:
    cache: LRUCache[str, int] = lru(3)
    for n, key in enumerate("abc"):
        cache[key] = n
    assert cache.get("a") == 0  # now the most recent
    cache["d"] = 3
    assert sorted(cache) == ["a", "c", "d"]


def test_a_weighed_cache_bounds_its_entries_and_their_weight() -> None:
    cache: LRUCache[int, str] = weighed_lru(4, 100, len)
    for n in range(10):  # light entries: the entry bound holds
        cache[n] = "x"
    assert len(cache) == 4 and sorted(cache) == [6, 7, 8, 9]
    cache[10] = "y" * 60  # heavy ones (each light one weighs a share, 25): the weight bound holds
    assert sorted(cache) == [9, 10] and cache.currsize == 85
    cache[11] = "z" * 30
    assert sorted(cache) == [10, 11] and cache.currsize == 90
