"""The heap is frozen once a burst of subscriptions has settled, and thawed
and collected once when half the subscriptions frozen have ended."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from resolvers.adapters.broker import InProcessBroker
from resolvers.core import heap as heap_module
from resolvers.core.heap import SubscriptionHeap


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


async def test_a_settled_burst_freezes_the_heap_and_half_of_it_ending_thaws_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(heap_module, "THAW_AFTER", 3)
    clock = Clock()
    heap = SubscriptionHeap(clock=clock)
    for _ in range(8):
        heap.started()
    # Still arriving: not frozen yet.
    clock.now += heap_module.QUIET_SECONDS / 2
    heap._settle()
    assert heap.freezes == 0 and gc.get_freeze_count() == 0
    # Quiet for a second: frozen.
    clock.now += heap_module.QUIET_SECONDS
    heap._settle()
    assert heap.freezes == 1 and gc.get_freeze_count() > 0
    # Three of eight end: not yet half.
    for _ in range(3):
        heap.ended()
    assert heap.thaws == 0
    heap.ended()
    assert heap.thaws == 1 and heap.freezes == 2 and gc.get_freeze_count() > 0
    assert heap.live == 4


async def test_a_steady_trickle_is_frozen_within_the_longest_wait() -> None:
    clock = Clock()
    heap = SubscriptionHeap(clock=clock)
    heap.started()
    while clock.now - 100.0 < heap_module.MOST_SECONDS:
        clock.now += heap_module.QUIET_SECONDS / 2
        heap.started()
        heap._settle()
    assert heap.freezes == 1


async def test_the_broker_counts_its_listeners_and_a_disabled_heap_never_freezes() -> None:
    heap = SubscriptionHeap(enabled=False)
    broker = InProcessBroker(heap=heap)
    async with broker.subscribe("user:ana:capsules"), broker.subscribe("user:ben:capsules"):
        assert heap.live == 2
    assert heap.live == 0
    assert heap.freezes == 0 and gc.get_freeze_count() == 0
