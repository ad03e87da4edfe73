"""What a `Context` carries, as Protocols of what is called on it.

The implementations live above the plumbing (the broker among the adapters,
the queues among the processes) and are put together once per process by
`resolvers.services.Services`. Code below the composition names only these,
so no layer points up, not even for a type.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from resolvers.core.auth import TokenVerifier
    from resolvers.core.config import Settings
    from resolvers.core.context import Context, KnownUsers
    from resolvers.core.cursors import CursorSigner
    from resolvers.core.metrics import Metrics
    from resolvers.core.persisted import PersistedDocuments
    from resolvers.core.ratelimit import RateLimiter
    from store.blobs import BlobStore
    from store.port import Table

T = TypeVar("T")

Event = dict[str, Any]


class Held(Protocol):
    """A subscriber's inbox while something other than its own stream has an
    event of it in hand: what comes meanwhile waits behind that event."""

    def release(self, event: Event | None = None) -> None:
        """Lets the stream go on; with `event`, that event is its next."""


class Receiver(Protocol):
    """A subscriber whose events may be taken in hand before its own stream
    wakes (`resolvers.processes.live._Opening`: one turn for every subscriber
    an opening wakes)."""

    def offer(self, event: Event, inbox: Held) -> bool:
        """Whether it took `event`: it then holds `inbox` until it calls
        `inbox.release`, and the stream sees nothing of it meanwhile."""
        ...


class EventBus(Protocol):
    """Publishing and subscribing by channel (the broker, to a request)."""

    async def publish(self, channel: str, event: Event) -> None: ...

    async def publish_many(self, events: Sequence[tuple[str, Event]]) -> None:
        """Publishes in one go: one round trip to Redis for a whole unlock."""

    def subscribe(
        self, channel: str, receiver: Receiver | None = None
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[Event]]:
        """The channel's events, in order. With a `receiver`, an event that
        comes while the subscriber waits for one is offered to it first."""
        ...

    def publish_failed(self) -> None:
        """A publish did not get out: the local streams re-read from the table."""

    def subscriber_count(self, channel: str) -> int:
        """How many subscribers in this process listen on `channel` now."""
        ...


class MediaQueue(Protocol):
    """The media pipeline, to a request: an upload to process."""

    def submit(self, content_id: str, author_id: str | None = None) -> None: ...


class ExportQueue(Protocol):
    """The export builder, to a request: an export to build."""

    def submit(self, user_id: str, export_id: str) -> None: ...


class DeletionQueue(Protocol):
    """The account deletions, to a request: one to finish now or later."""

    async def finish(self, ctx: Context, user_id: str) -> bool: ...

    def resume(self, services: ContextServices, user_id: str) -> None: ...


class SharedReads(Protocol):
    """Reads shared by every subscriber one event wakes, and the slots they
    take turns in."""

    @property
    def slots(self) -> asyncio.Semaphore: ...

    async def read(self, key: tuple[str, ...], load: Callable[[], Awaitable[T]]) -> T: ...

    def gathering(self, key: tuple[str, ...], start: Callable[[], T]) -> T:
        """The one gathering open for `key` (`start()` opens it), until `closed(key)`:
        what an event's subscribers in this process have in hand together."""
        ...

    def closed(self, key: tuple[str, ...]) -> None: ...


class WebPushKey(Protocol):
    """Web Push, to a request: the key browsers subscribe with."""

    @property
    def public_key(self) -> str: ...


class NativePush(Protocol):
    """Native push (SNS), to a request: a device's platform endpoint."""

    async def endpoint_for(self, platform: str, token: str, user_id: str) -> str: ...

    async def forget(self, arn: str) -> None: ...


class ContextServices(Protocol):
    """The services as a `Context` (and everything below the composition)
    sees them."""

    @property
    def settings(self) -> Settings: ...
    @property
    def table(self) -> Table: ...
    @property
    def verifier(self) -> TokenVerifier: ...
    @property
    def cursors(self) -> CursorSigner: ...
    @property
    def rates(self) -> RateLimiter: ...
    @property
    def broker(self) -> EventBus: ...
    @property
    def blobs(self) -> BlobStore: ...
    @property
    def pipeline(self) -> MediaQueue: ...
    @property
    def event_reads(self) -> SharedReads: ...
    @property
    def persisted(self) -> PersistedDocuments: ...
    @property
    def exports(self) -> ExportQueue: ...
    @property
    def accounts(self) -> DeletionQueue: ...
    @property
    def known_users(self) -> KnownUsers: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def tracer(self) -> Tracer | None: ...
    @property
    def web_push(self) -> WebPushKey | None: ...
    @property
    def native_push(self) -> NativePush | None: ...

    def now(self) -> datetime: ...

    def now_iso(self) -> str: ...
