"""Publish/subscribe by channel. Events carry ids only; every subscriber re-reads
what it is told about with its own loaders and authorization.

In-process by default; Redis pub/sub when MIFAMILIAS_REDIS_URL is set, so every
server process hears what any of them publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from resolvers.core.metrics import Metrics
from resolvers.core.ports import Event, EventBus

log = logging.getLogger(__name__)

QUEUE_LIMIT = 1000
DELIVERY_SLICE = 64  # subscribers woken per turn of the event loop


def user_channel(user_id: str, topic: str) -> str:
    """One channel per person and kind of event ("capsules", "notifications"), so
    a subscriber wakes only for the events it streams."""
    return f"user:{user_id}:{topic}"


def content_channel(content_id: str) -> str:
    return f"content:{content_id}"


class Broker(EventBus, Protocol):
    """The event bus, and what the composition asks of it besides."""

    def subscriber_count(self, channel: str) -> int:
        """How many subscribers in this process listen on `channel` now."""
        ...

    async def ping(self) -> None:
        """Raises when the broker cannot carry events now (readiness)."""

    async def close(self) -> None: ...


class _Fanout:
    """Local delivery to the queues of this process's subscribers."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics or Metrics.disabled()
        self.queues: defaultdict[str, set[asyncio.Queue[Event]]] = defaultdict(set)
        # The delivery still running on each channel: the next waits for it, so
        # every subscriber sees a channel's events in the order they came.
        self._tails: dict[str, asyncio.Task[None]] = {}

    def deliver_soon(self, channel: str, event: Event) -> None:
        """Hands the event to the channel's subscribers without making the
        publisher wait for all of them."""
        if channel not in self.queues:
            return
        previous = self._tails.get(channel)
        task = asyncio.create_task(self._deliver_after(previous, channel, event))
        self._tails[channel] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._tails.get(channel) is done:
                del self._tails[channel]

        task.add_done_callback(forget)

    async def _deliver_after(self, previous: asyncio.Task[None] | None, channel: str, event: Event) -> None:
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        await self.deliver(channel, event)

    async def deliver(self, channel: str, event: Event) -> None:
        """Wakes the channel's subscribers a slice at a time: between slices the
        loop serves everything else (health checks, other sockets), so ten
        thousand subscribers of one content never hold it for long."""
        delivered = dropped = 0
        try:
            for n, queue in enumerate(tuple(self.queues.get(channel, ()))):
                if n and n % DELIVERY_SLICE == 0:
                    await asyncio.sleep(0)
                try:
                    queue.put_nowait(event)
                    delivered += 1
                except asyncio.QueueFull:
                    # A subscriber this far behind is stuck; dropping beats unbounded memory.
                    dropped += 1
                    log.warning("dropping an event for a slow subscriber on %s", channel)
        finally:
            self.metrics.delivered(channel, delivered, dropped)

    def count(self, channel: str) -> int:
        return len(self.queues.get(channel, ()))

    @contextlib.asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[asyncio.Queue[Event]]:
        queue: asyncio.Queue[Event] = asyncio.Queue(QUEUE_LIMIT)
        self.queues[channel].add(queue)
        try:
            yield queue
        finally:
            subscribers = self.queues.get(channel)
            if subscribers is not None:
                subscribers.discard(queue)
                if not subscribers:
                    del self.queues[channel]


async def _drain(queue: asyncio.Queue[Event]) -> AsyncIterator[Event]:
    while True:
        yield await queue.get()


class InProcessBroker:
    def __init__(self, metrics: Metrics | None = None) -> None:
        self._fanout = _Fanout(metrics)
        self.metrics = self._fanout.metrics

    async def publish(self, channel: str, event: Event) -> None:
        self.metrics.published(channel)
        self._fanout.deliver_soon(channel, event)

    async def publish_many(self, events: Sequence[tuple[str, Event]]) -> None:
        for channel, event in events:
            await self.publish(channel, event)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[AsyncIterator[Event]]:
        async with self._fanout.listen(channel) as queue:
            yield _drain(queue)

    def subscriber_count(self, channel: str) -> int:
        return self._fanout.count(channel)

    async def ping(self) -> None:
        pass  # the process itself: nothing to be down

    async def close(self) -> None:
        pass


class RedisBroker:
    """One Redis connection listens for the whole process; it subscribes to a
    channel while this process has at least one local subscriber to it."""

    def __init__(self, url: str, prefix: str = "mifamilias:", *, metrics: Metrics | None = None) -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._prefix = prefix
        self._fanout = _Fanout(metrics)
        self.metrics = self._fanout.metrics
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def publish(self, channel: str, event: Event) -> None:
        self.metrics.published(channel)
        await self._redis.publish(self._prefix + channel, json.dumps(event))

    async def publish_many(self, events: Sequence[tuple[str, Event]]) -> None:
        if not events:
            return
        # A pipeline without MULTI: one round trip, and Redis keeps the order.
        async with self._redis.pipeline(transaction=False) as pipe:
            for channel, event in events:
                self.metrics.published(channel)
                pipe.publish(self._prefix + channel, json.dumps(event))
            await pipe.execute()

    async def _read(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("redis pub/sub read failed; retrying")
                await asyncio.sleep(0.5)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"].decode()[len(self._prefix) :]
            self._fanout.deliver_soon(channel, json.loads(message["data"]))

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[AsyncIterator[Event]]:
        async with self._fanout.listen(channel) as queue:
            async with self._lock:
                if len(self._fanout.queues[channel]) == 1:
                    await self._pubsub.subscribe(self._prefix + channel)
                if self._reader is None:
                    self._reader = asyncio.create_task(self._read())
            try:
                yield _drain(queue)
            finally:
                async with self._lock:
                    if len(self._fanout.queues.get(channel, ())) <= 1:
                        await self._pubsub.unsubscribe(self._prefix + channel)

    def subscriber_count(self, channel: str) -> int:
        return self._fanout.count(channel)

    async def ping(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._redis.aclose()
