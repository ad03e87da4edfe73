"""The broker port on both adapters; Redis against a real server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from resolvers.adapters.broker import Broker, InProcessBroker, RedisBroker


@pytest.fixture(params=["memory", "redis"])
async def brokers(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Broker, Broker]]:
    """Two brokers as two server processes would hold them (one shared in memory)."""
    if request.param == "memory":
        broker = InProcessBroker()
        yield broker, broker
        return
    url = request.getfixturevalue("redis_url")
    first, second = RedisBroker(url), RedisBroker(url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_an_event_published_anywhere_reaches_each_subscriber_once(
    brokers: tuple[Broker, Broker],
) -> None:
    here, there = brokers
    channel = f"user:{uuid.uuid4().hex}"
    async with (
        here.subscribe(channel) as mine,
        there.subscribe(channel) as theirs,
        here.subscribe(f"{channel}-other") as other,
    ):
        await asyncio.sleep(0.1)  # Redis SUBSCRIBE is acknowledged asynchronously
        await there.publish(channel, {"kind": "capsule", "capsuleId": "c1"})
        await here.publish(channel, {"kind": "capsule", "capsuleId": "c2"})
        got_mine = [await asyncio.wait_for(anext(mine), 5) for _ in range(2)]
        got_theirs = [await asyncio.wait_for(anext(theirs), 5) for _ in range(2)]
        assert sorted(e["capsuleId"] for e in got_mine) == ["c1", "c2"]
        assert sorted(e["capsuleId"] for e in got_theirs) == ["c1", "c2"]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(other), 0.3)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(mine), 0.3)


async def test_unsubscribed_channels_stop_delivering(brokers: tuple[Broker, Broker]) -> None:
    here, there = brokers
    channel = f"content:{uuid.uuid4().hex}"
    async with here.subscribe(channel) as events:
        await asyncio.sleep(0.1)
        await there.publish(channel, {"n": 1})
        assert await asyncio.wait_for(anext(events), 5) == {"n": 1}
    async with here.subscribe(channel) as events:
        await asyncio.sleep(0.1)
        await there.publish(channel, {"n": 2})
        assert await asyncio.wait_for(anext(events), 5) == {"n": 2}


async def test_delivery_to_many_subscribers_lets_the_loop_serve_others() -> None:
    """Ten thousand subscribers of one channel are woken a slice at a time, so
    whatever else waits on the loop gets a turn long before the last; and the
    publisher does not wait for them all."""
    import contextlib

    broker = InProcessBroker()
    async with contextlib.AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(broker.subscribe("content:c")) for _ in range(10_000)]
        queues = broker._fanout.queues["content:c"]
        await broker.publish("content:c", {"kind": "content", "n": 1})
        await broker.publish("content:c", {"kind": "content", "n": 2})
        assert all(q.empty() for q in queues)  # published, not yet delivered
        for _ in range(1000):  # turns of the loop, until the first slice lands
            await asyncio.sleep(0)
            woken = sum(1 for q in queues if not q.empty())
            if woken:
                break
        assert 0 < woken <= 1000  # others ran after a slice, not after all ten thousand
        for stream in streams:  # every subscriber, both events, in order
            assert [(await anext(stream))["n"], (await anext(stream))["n"]] == [1, 2]
