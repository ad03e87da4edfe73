"""The broker port on both adapters; Redis against a real server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest

from resolvers.adapters import broker as broker_module
from resolvers.adapters.broker import QUEUE_LIMIT, Broker, InProcessBroker, RedisBroker, publish_in_turn
from resolvers.core.errors import Unavailable
from resolvers.core.metrics import Metrics
from tests.servers import until


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

    async def confirmed() -> bool:
        found = await redis_subscribers(brokers[0], channel)
        return found is None or found >= count

    await until(confirmed, f"{count} Redis subscribers on {channel}", 10, interval=0.01)


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


async def test_announcements_in_turn_keep_their_order_and_outlive_a_stopped_caller(
    brokers: tuple[Broker, Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`publish_in_turn`: an announcement whose caller is stopped while it is
    on its way still goes, the next one of its channel goes after it, and
    nothing of either is kept once both have gone."""
    here, there = brokers
    channel = f"content:{uuid.uuid4().hex}"
    publish_many = here.publish_many
    entered, released = asyncio.Event(), asyncio.Event()

    async def first_held(events: Any) -> None:
        if events[0][1]["n"] == 1:
            entered.set()
            await released.wait()
        await publish_many(events)

    monkeypatch.setattr(here, "publish_many", first_held)
    async with there.subscribe(channel) as heard:
        await listening(brokers, channel, 1)
        first = asyncio.create_task(publish_in_turn(here, channel, {"n": 1}))
        await entered.wait()
        first.cancel()  # its operation stopped after the commit
        second = asyncio.create_task(publish_in_turn(here, channel, {"n": 2}))
        released.set()
        await second
        got = [(await asyncio.wait_for(anext(heard), 5))["n"] for _ in range(2)]
    assert got == [1, 2]
    assert first.cancelled()
    assert channel not in broker_module._in_turn


async def test_leaving_a_channel_unsubscribes_it(brokers: tuple[Broker, Broker]) -> None:
    here, there = brokers
    channel = f"content:{uuid.uuid4().hex}"
    async with here.subscribe(channel) as events:
        await listening(brokers, channel, 1)
        await there.publish(channel, {"n": 1})
        assert await asyncio.wait_for(anext(events), 5) == {"n": 1}
    # Nothing is left behind: no local queue, and (on Redis) no subscription.
    assert here.subscriber_count(channel) == 0
    assert await redis_subscribers(here, channel) in (None, 0)
    async with here.subscribe(channel) as events:
        await listening(brokers, channel, 1)
        await there.publish(channel, {"n": 2})
        assert await asyncio.wait_for(anext(events), 5) == {"n": 2}


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_subscriber_too_far_behind_is_ended_with_a_reason(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Its queue full, it is let go (counted) rather than dropping events
    silently: its next read ends the stream with UNAVAILABLE, saying to resume
    with `after`. Another subscriber of the channel that reads goes on."""
    metrics = Metrics()
    broker: Broker = (
        InProcessBroker(metrics=metrics)
        if kind == "memory"
        else RedisBroker(request.getfixturevalue("redis_url"), metrics=metrics)
    )
    channel = f"content:{uuid.uuid4().hex}"

    def let_go() -> float:
        found = metrics.registry.get_sample_value(
            "mifamilias_slow_clients_closed_total", {"transport": "stream", "reason": "queue_full"}
        )
        return found or 0.0

    try:
        async with broker.subscribe(channel) as slow, broker.subscribe(channel) as reading:
            await listening((broker,), channel, 1)
            got: list[Any] = []

            async def read_all() -> None:
                while len(got) < QUEUE_LIMIT + 2:
                    got.append(await anext(reading))

            def caught_up(published: int) -> bool:
                return len(got) >= published

            reader = asyncio.create_task(read_all())
            for n in range(QUEUE_LIMIT + 1):
                await broker.publish(channel, {"n": n})
                if n % 100 == 99:  # the reading subscriber keeps up
                    await until(partial(caught_up, n + 1), "the reader to keep up", 30, interval=0.001)
            await until(
                lambda: let_go() == 1, lambda: f"the slow subscriber let go ({let_go()})", 30, interval=0.01
            )
            with pytest.raises(Unavailable, match="after"):
                await anext(slow)
            await broker.publish(channel, {"n": "last"})
            await asyncio.wait_for(reader, 30)
            assert [e["n"] for e in got] == [*range(QUEUE_LIMIT + 1), "last"]
    finally:
        await broker.close()


async def test_delivery_to_many_subscribers_lets_the_loop_serve_others() -> None:
    """Ten thousand subscribers of one channel are woken a slice at a time, so
    whatever else waits on the loop gets a turn long before the last; and the
    publisher does not wait for them all."""
    import contextlib

    broker = InProcessBroker()
    woken: list[int] = []

    async def read_two(n: int, stream: AsyncIterator[dict[str, Any]]) -> list[int]:
        first = (await anext(stream))["n"]
        woken.append(n)
        return [first, (await anext(stream))["n"]]

    async with contextlib.AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(broker.subscribe("content:c")) for _ in range(10_000)]
        readers = [asyncio.create_task(read_two(n, stream)) for n, stream in enumerate(streams)]
        await asyncio.sleep(0)  # every reader now waits on its stream
        await broker.publish("content:c", {"kind": "content", "n": 1})
        await broker.publish("content:c", {"kind": "content", "n": 2})
        # Watched at every turn of the loop: had the publisher (or one delivery)
        # woken them all at once, all ten thousand would show at the first look.
        await until(lambda: woken, "the first slice", interval=0)
        assert len(woken) <= 1000  # others ran after a slice, not after all ten thousand
        # Every subscriber, both events, in order.
        assert [await reader for reader in readers] == [[1, 2]] * 10_000


class Taking:
    """Takes the events marked `take`, and notes the inbox it then holds."""

    def __init__(self) -> None:
        self.taken: list[dict[str, Any]] = []
        self.held: list[Any] = []

    def offer(self, event: dict[str, Any], inbox: Any) -> bool:
        if not event.get("take"):
            return False
        self.taken.append(event)
        self.held.append(inbox)
        return True


async def test_a_receiver_takes_an_event_only_while_its_stream_waits_and_what_comes_meanwhile_waits_behind(
    brokers: tuple[Broker, Broker],
) -> None:
    here, there = brokers
    channel = f"user:{uuid.uuid4().hex}"
    receiver = Taking()
    async with here.subscribe(channel, receiver) as events:
        await listening(brokers, channel, 1)
        # Offered only while the stream waits: one that does not is queued.
        [inbox] = here._fanout.queues[channel]  # type: ignore[attr-defined]
        await there.publish(channel, {"n": 0, "take": True})
        await until(lambda: inbox._events, "the event queued", 10, interval=0)
        assert receiver.taken == []
        assert await anext(events) == {"n": 0, "take": True}
        waiting = asyncio.ensure_future(anext(events))
        await there.publish(channel, {"n": 1, "take": True})
        await until(lambda: receiver.taken, "the offer", 10, interval=0)
        # While it is held, nothing is offered and nothing reaches the stream.
        await there.publish(channel, {"n": 2, "take": True})
        await there.publish(channel, {"n": 3})
        assert receiver.held == [inbox]
        await until(lambda: len(inbox._events or ()) == 2, "both queued behind", 10, interval=0)
        assert not waiting.done()
        assert receiver.taken == [{"n": 1, "take": True}]
        inbox.release({"n": 1, "given back": True})
        assert await waiting == {"n": 1, "given back": True}
        assert await anext(events) == {"n": 2, "take": True}
        assert await anext(events) == {"n": 3}
