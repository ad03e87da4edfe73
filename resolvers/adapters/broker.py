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
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, Protocol, TypeVar

from resolvers.core.errors import Unavailable
from resolvers.core.heap import SubscriptionHeap
from resolvers.core.metrics import Metrics
from resolvers.core.ports import Event, EventBus, Receiver

T = TypeVar("T")

log = logging.getLogger(__name__)

QUEUE_LIMIT = 1000
# Subscribers woken per turn of the event loop. Each woken stream runs its
# read rule, its budget charge and its frame's write in the turns that follow,
# so a slice is what a request arriving meanwhile waits behind: with 64, a
# /healthz answer took up to 137-172 ms during a 10,000-subscriber fan-out on a
# slow machine; with 16, 31-35 ms, and the last delivery came no later.
DELIVERY_SLICE = 16


def user_channel(user_id: str, topic: str) -> str:
    """One channel per person and kind of event ("capsules", "notifications"), so
    a subscriber wakes only for the events it streams."""
    return f"user:{user_id}:{topic}"


def content_channel(content_id: str) -> str:
    return f"content:{content_id}"


# Told to every local subscriber when events may have been missed (the broker
# lost its connection, or a publish failed): each re-reads from the table.
RESYNC: Event = {"kind": "resync"}


# Work still running after the operation that started it was stopped.
_finishing: set[asyncio.Future[Any]] = set()


async def to_the_end(work: Awaitable[T]) -> T:
    """`work`, run to its end even if the operation awaiting it is stopped
    meanwhile (its deadline passing, its client gone): the caller is
    cancelled, the work is not. For a commit and what announces it, which
    must not part: a write in flight that lands after the operation was
    stopped would otherwise never be announced."""
    task = asyncio.ensure_future(work)
    _finishing.add(task)
    task.add_done_callback(_finished)
    return await asyncio.shield(task)


def _finished(task: asyncio.Future[Any]) -> None:
    _finishing.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its caller, if still there, raised it


async def publish_committed(broker: EventBus | None, events: Sequence[tuple[str, Event]]) -> None:
    """Publishes what a committed write announces, best effort: a failure is
    logged and never raised into the write, which is done. The streams miss
    nothing: this process's re-read from the table now, the others' when
    their broker connection comes back.

    The publish runs to its end (`to_the_end`): an operation stopped after its
    commit is still announced. Cancelled with it, the event was never
    published and nothing told the streams to re-read, so a subscriber that
    stayed connected never had it."""
    if broker is None or not events:
        return
    await to_the_end(_publish(broker, events))


# The last announcement on each channel still on its way out of this process,
# for `publish_in_turn`.
_in_turn: dict[str, asyncio.Future[None]] = {}


async def publish_in_turn(broker: EventBus | None, channel: str, event: Event) -> None:
    """`publish_committed` for a channel whose events must leave in the order
    of their commits: each waits for the one handed over before it in this
    process. A write and the work it hands on (a content's move to PROCESSING
    and the pipeline that moves it on) each announce their own move; the work
    could otherwise announce its later move first, and a stream that hears a
    move from a status it has not reported can only report the status as it
    is now, skipping one."""
    if broker is None:
        return
    before = _in_turn.get(channel)
    turn = asyncio.ensure_future(_after(before, broker, [(channel, event)]))
    _in_turn[channel] = turn
    turn.add_done_callback(lambda done: _left(channel, done))
    await to_the_end(turn)


async def _after(
    before: asyncio.Future[None] | None, broker: EventBus, events: Sequence[tuple[str, Event]]
) -> None:
    if before is not None:
        await asyncio.wait((before,))  # its outcome is its own: a failure was told to the streams
    await _publish(broker, events)


def _left(channel: str, turn: asyncio.Future[None]) -> None:
    if _in_turn.get(channel) is turn:
        del _in_turn[channel]


async def _publish(broker: EventBus, events: Sequence[tuple[str, Event]]) -> None:
    try:
        await broker.publish_many(events)
    except Exception:
        broker.publish_failed()


class Broker(EventBus, Protocol):
    """The event bus, and what the composition asks of it besides."""

    async def ping(self) -> None:
        """Raises when the broker cannot carry events now (readiness)."""

    async def close(self) -> None: ...


class _Fanout:
    """Local delivery to the queues of this process's subscribers."""

    def __init__(self, metrics: Metrics | None = None, heap: SubscriptionHeap | None = None) -> None:
        self.metrics = metrics or Metrics.disabled()
        self.heap = heap or SubscriptionHeap(enabled=False)
        self.queues: defaultdict[str, set[Inbox]] = defaultdict(set)
        # Events waiting to be handed to their subscribers, in the order they
        # came (so every subscriber sees a channel's events in order), and the
        # one task handing them over while there are some: one opening
        # publishes to a thousand channels, which is not a thousand tasks.
        self._pending: deque[tuple[str, Event]] = deque()
        self._delivering: asyncio.Task[None] | None = None

    def deliver_soon(self, channel: str, event: Event) -> None:
        """Hands the event to the channel's subscribers without making the
        publisher wait for all of them."""
        if channel not in self.queues:
            return
        self._pending.append((channel, event))
        if self._delivering is None or self._delivering.done():  # (done: its loop was closed)
            self._delivering = asyncio.create_task(self._deliver_pending())

    async def _deliver_pending(self) -> None:
        """Wakes subscribers a slice at a time: between slices the loop serves
        everything else (health checks, other sockets), so ten thousand
        subscribers of one content never hold it for long."""
        woken = 0
        try:
            while self._pending:
                channel, event = self._pending.popleft()
                delivered = dropped = 0
                for queue in tuple(self.queues.get(channel, ())):
                    woken += 1
                    if woken % DELIVERY_SLICE == 0:
                        await asyncio.sleep(0)
                    if queue.offered(event):
                        delivered += 1
                        continue
                    try:
                        queue.put_nowait(event)
                        delivered += 1
                    except asyncio.QueueFull:
                        # A subscriber this far behind is stuck; its stream ends at its
                        # next read (it resumes with `after`), and memory stays bounded.
                        dropped += 1
                        if not queue.fell_behind:
                            queue.fell_behind = True
                            self.metrics.slow_client_closed("stream", "queue_full")
                            log.warning(
                                "a subscriber on %s fell %d events behind; its stream ends",
                                channel,
                                QUEUE_LIMIT,
                            )
                self.metrics.delivered(channel, delivered, dropped)
        finally:
            self._delivering = None

    def count(self, channel: str) -> int:
        return len(self.queues.get(channel, ()))

    def resync(self) -> None:
        """Tells every local subscriber to re-read what it may have missed."""
        for channel in tuple(self.queues):
            self.deliver_soon(channel, RESYNC)

    @contextlib.asynccontextmanager
    async def listen(self, channel: str, receiver: Receiver | None = None) -> AsyncIterator[Inbox]:
        queue = Inbox(QUEUE_LIMIT, receiver)
        self.queues[channel].add(queue)
        self.heap.started()
        try:
            yield queue
        finally:
            self.heap.ended()
            subscribers = self.queues.get(channel)
            if subscribers is not None:
                subscribers.discard(queue)
                if not subscribers:
                    del self.queues[channel]


class Inbox:
    """One subscriber's events, bounded; `fell_behind` once one did not fit.

    Thousands of subscribers sit idle for hours, each with an inbox: an
    asyncio.Queue holds four deques (about 3 KB) from its start, this holds
    its events only while it has some, and a future only while it waits.

    An event that comes while the stream waits, with nothing before it, is
    offered to the subscriber's `receiver` first; one it takes leaves the
    inbox `held` until the receiver releases it, and whatever comes meanwhile
    waits behind it, so the stream sees its events in order either way."""

    __slots__ = ("_events", "_waiter", "fell_behind", "held", "limit", "receiver")

    def __init__(self, limit: int, receiver: Receiver | None = None) -> None:
        self.limit = limit
        self.receiver = receiver
        self.fell_behind = False
        self.held = False
        self._events: deque[Event] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def offered(self, event: Event) -> bool:
        """Whether the receiver took `event` (the stream is waiting, and
        nothing is ahead of it)."""
        if (
            self.receiver is None
            or self.held
            or self._events
            or self._waiter is None
            or self._waiter.done()
            or not self.receiver.offer(event, self)
        ):
            return False
        self.held = True
        return True

    def release(self, event: Event | None = None) -> None:
        """Lets the stream go on, with `event` (one the receiver gave back) first."""
        if not self.held:
            return
        self.held = False
        if event is not None:
            if self._events is None:
                self._events = deque()
            self._events.appendleft(event)
        self._wake()

    def put_nowait(self, event: Event) -> None:
        """Raises asyncio.QueueFull when `limit` events wait already."""
        if self._events is None:
            self._events = deque()
        elif len(self._events) >= self.limit:
            raise asyncio.QueueFull
        self._events.append(event)
        if not self.held:
            self._wake()

    def _wake(self) -> None:
        if self._events and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Event:
        while self.held or not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        assert self._events is not None
        event = self._events.popleft()
        if not self._events:
            self._events = None
        return event


async def _drain(queue: Inbox) -> AsyncIterator[Event]:
    while True:
        if queue.fell_behind:
            # What it holds is stale by now: the client reads on from its last event.
            raise Unavailable(
                f"this stream fell more than {QUEUE_LIMIT} events behind and was ended: "
                "subscribe again with `after` set to the id of the last event you received",
                retryAfter=0,
            )
        yield await queue.get()


class InProcessBroker:
    def __init__(self, metrics: Metrics | None = None, heap: SubscriptionHeap | None = None) -> None:
        self._fanout = _Fanout(metrics, heap)
        self.metrics = self._fanout.metrics

    async def publish(self, channel: str, event: Event) -> None:
        self.metrics.published(channel)
        self._fanout.deliver_soon(channel, event)

    async def publish_many(self, events: Sequence[tuple[str, Event]]) -> None:
        for channel, event in events:
            await self.publish(channel, event)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, channel: str, receiver: Receiver | None = None
    ) -> AsyncIterator[AsyncIterator[Event]]:
        async with self._fanout.listen(channel, receiver) as queue:
            yield _drain(queue)

    def subscriber_count(self, channel: str) -> int:
        return self._fanout.count(channel)

    async def ping(self) -> None:
        pass  # the process itself: nothing to be down

    def publish_failed(self) -> None:
        self._fanout.resync()

    async def close(self) -> None:
        pass


class RedisBroker:
    """One Redis connection listens for the whole process; it subscribes to a
    channel while this process has at least one local subscriber to it."""

    def __init__(
        self,
        url: str,
        prefix: str = "mifamilias:",
        *,
        metrics: Metrics | None = None,
        heap: SubscriptionHeap | None = None,
    ) -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._prefix = prefix
        self._fanout = _Fanout(metrics, heap)
        self.metrics = self._fanout.metrics
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # Channels with local subscribers that Redis has not confirmed (it was
        # down when they came): the reader subscribes them when it is back.
        self._missing: set[str] = set()
        self._down = False  # as last seen: one warning when it goes, one when it returns
        self._reader_down = False

    def _went(self, what: str) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "Redis is not answering (%s); live events wait, streams catch up when it returns", what
            )

    def _back(self) -> None:
        if self._down:
            self._down = False
            log.warning("Redis answers again; live streams catch up from the table")

    def publish_failed(self) -> None:
        self._went("a publish failed")
        self._fanout.resync()

    async def publish(self, channel: str, event: Event) -> None:
        self.metrics.published(channel)
        await self._redis.publish(self._prefix + channel, json.dumps(event))
        self._back()

    async def publish_many(self, events: Sequence[tuple[str, Event]]) -> None:
        if not events:
            return
        # A pipeline without MULTI: one round trip, and Redis keeps the order.
        async with self._redis.pipeline(transaction=False) as pipe:
            for channel, event in events:
                self.metrics.published(channel)
                pipe.publish(self._prefix + channel, json.dumps(event))
            await pipe.execute()
        self._back()

    async def _read(self) -> None:
        while True:
            try:
                if self._missing:
                    missing = tuple(self._missing)
                    await self._pubsub.subscribe(*(self._prefix + channel for channel in missing))
                    self._missing.difference_update(missing)
                message = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self._reader_down = True
                self._went(type(error).__name__)
                await asyncio.sleep(0.5)
                continue
            if self._reader_down:
                # Reconnected (redis-py subscribed its channels again): what
                # was published meanwhile is gone, so the streams re-read.
                self._reader_down = False
                self._back()
                self._fanout.resync()
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"].decode()[len(self._prefix) :]
            self._fanout.deliver_soon(channel, json.loads(message["data"]))

    @contextlib.asynccontextmanager
    async def subscribe(
        self, channel: str, receiver: Receiver | None = None
    ) -> AsyncIterator[AsyncIterator[Event]]:
        async with self._fanout.listen(channel, receiver) as queue:
            async with self._lock:
                if len(self._fanout.queues[channel]) == 1:
                    try:
                        await self._pubsub.subscribe(self._prefix + channel)
                    except Exception as error:
                        # Redis is down: the stream starts all the same, and
                        # hears from the channel once the reader is back.
                        self._went(type(error).__name__)
                        self._missing.add(channel)
                        self._reader_down = True
                if self._reader is None:
                    self._reader = asyncio.create_task(self._read())
            try:
                yield _drain(queue)
            finally:
                async with self._lock:
                    if len(self._fanout.queues.get(channel, ())) <= 1:
                        self._missing.discard(channel)
                        with contextlib.suppress(Exception):  # down: it goes with the connection
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
        await self._pubsub.aclose()
        await self._redis.aclose()
