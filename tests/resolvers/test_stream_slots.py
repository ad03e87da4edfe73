"""The live subscriptions' slots (`StreamSlots`) on each engine: renewing a
process's thousands of slots is a few store calls, and a process that stops
renewing (it died) frees its slots once their lease runs out."""

from __future__ import annotations

import math

import pytest

from resolvers.core.errors import RateLimited
from resolvers.core.ratelimit import StreamSlots
from store.port import MAX_TRANSACTION_ITEMS, TTL_ATTRIBUTE, Table
from tests.counting import CountingTable

LEASE = 60.0
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


async def test_renewing_many_slots_is_a_few_store_calls(table: Table) -> None:
    counting = CountingTable(table)
    clock = Clock()
    slots = StreamSlots(counting, per_person=5, lease_seconds=LEASE, clock=clock)
    held = [await slots.hold(f"user:fan{n // 5}") for n in range(250)]
    counting.reset()
    clock.now += LEASE / 3
    await slots.renew()
    assert counting.total_calls <= math.ceil(len(held) / MAX_TRANSACTION_ITEMS), counting.calls
    renewed = await table.batch_get(held)
    assert {int(item[TTL_ATTRIBUTE]) for item in renewed.values()} == {int(clock.now + LEASE) + 1}
    await slots.stop()


async def test_a_dead_processs_slots_are_free_once_their_lease_runs_out(table: Table) -> None:
    clock = Clock()
    dying = StreamSlots(table, per_person=3, lease_seconds=LEASE, clock=clock)
    other = StreamSlots(table, per_person=3, lease_seconds=LEASE, clock=clock)
    held = [await dying.hold("user:ana") for _ in range(3)]
    with pytest.raises(RateLimited):
        await other.hold("user:ana")
    clock.now += LEASE / 3
    await dying.renew()  # its last renewal: then it dies, holding all three
    clock.now += LEASE
    with pytest.raises(RateLimited):
        await other.hold("user:ana")  # the renewal still holds them
    clock.now += LEASE / 3 + 2
    taken = {await other.hold("user:ana") for _ in range(3)}
    assert taken == set(held)
    await other.stop()


async def test_a_slot_lost_to_another_process_is_dropped_and_the_rest_renewed(table: Table) -> None:
    clock = Clock()
    slow = StreamSlots(table, per_person=3, lease_seconds=LEASE, clock=clock)
    other = StreamSlots(table, per_person=3, lease_seconds=LEASE, clock=clock)
    held = [await slow.hold("user:ana") for _ in range(3)] + [await slow.hold("user:ben")]
    clock.now += LEASE + 2  # it missed its renewals: the leases ran out
    lost = await other.hold("user:ana")
    await slow.renew()
    assert set(slow.held) == set(held) - {lost}
    renewed = await table.batch_get(held)
    assert all(int(renewed[key][TTL_ATTRIBUTE]) == int(clock.now + LEASE) + 1 for key in slow.held)
    assert renewed[lost]["owner"] == other.held[lost]
    await slow.release(held[-1])
    await slow.renew()  # a slot released since is not renewed
    assert await table.get(held[-1]) is None
    await slow.stop()
    await other.stop()
