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


async def redis_subscribers(broker: Broker, channel: str) -> int | None:
    """How many connections Redis has subscribed to the channel (PUBSUB NUMSUB),
    or None for the in-process broker."""
    if not isinstance(broker, RedisBroker):
        return None
    counts = await broker._redis.pubsub_numsub(broker._prefix + channel)
    return int(counts[0][1])


async def listening(brokers: tuple[Broker, ...], channel: str, count: int) -> None:
    """Waits, with a deadline, until Redis confirms `count` subscriptions: a
    SUBSCRIBE is acknowledged asynchronously."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        found = await redis_subscribers(brokers[0], channel)
        if found is None or found >= count:
            return
        assert asyncio.get_running_loop().time() < deadline, (
            f"Redis never had {count} subscribers on {channel}"
        )
        await asyncio.sleep(0.01)


async def test_an_event_published_anywhere_reaches_each_subscriber_once(
    brokers: tuple[Broker, Broker],
) -> None:
    here, there = brokers
    channel = f"user:{uuid.uuid4().hex}"
    other_channel = f"{channel}-other"
    async with (
        here.subscribe(channel) as mine,
        there.subscribe(channel) as theirs,
        here.subscribe(other_channel) as other,
    ):
        await listening(brokers, channel, 2 if here is not there else 1)
        await listening(brokers, other_channel, 1)
        await there.publish(channel, {"kind": "capsule", "capsuleId": "c1"})
        await here.publish(channel, {"kind": "capsule", "capsuleId": "c2"})
        got_mine = [await asyncio.wait_for(anext(mine), 5) for _ in range(2)]
        got_theirs = [await asyncio.wait_for(anext(theirs), 5) for _ in range(2)]
        assert sorted(e["capsuleId"] for e in got_mine) == ["c1", "c2"]
        assert sorted(e["capsuleId"] for e in got_theirs) == ["c1", "c2"]
        # What comes next on each stream is the sentinel published last: no
        # duplicate came before it, and the other channel heard nothing else.
        await here.publish(other_channel, {"kind": "sentinel"})
        await here.publish(channel, {"kind": "sentinel"})
        assert (await asyncio.wait_for(anext(other), 5))["kind"] == "sentinel"
        assert (await asyncio.wait_for(anext(mine), 5))["kind"] == "sentinel"


async def test_leaving_a_channel_unsubscribes_it(brokers: tuple[Broker, Broker]) -> None:
    here, there = brokers
    channel = f"content:{uuid.uuid4().hex}"
    async with here.subscribe(channel) as events:
        await listening(brokers, channel, 1)
        await there.publish(channel, {"n": 1})
        assert await asyncio.wait_for(anext(events), 5) == {"n": 1}
    # Nothing is left behind: no local queue, and (on Redis) no subscription.
    assert channel not in here._fanout.queues  # type: ignore[attr-defined]
    assert await redis_subscribers(here, channel) in (None, 0)
    async with here.subscribe(channel) as events:
        await listening(brokers, channel, 1)
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
