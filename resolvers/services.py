"""Every service of one server process, typed: what `resolvers.runtime.compose`
builds once and every `Context` carries.

It sits above what it holds (the adapters and the processes); the code below
sees it through `resolvers.core.ports.ContextServices`, which names only what
a request calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from resolvers.adapters.broker import Broker
from resolvers.adapters.sns import SnsPush
from resolvers.adapters.transcribe import Transcriber
from resolvers.adapters.webpush import WebPushSender
from resolvers.core.auth import TokenVerifier
from resolvers.core.config import Settings
from resolvers.core.context import KnownUsers, utc_now
from resolvers.core.cursors import CursorSigner
from resolvers.core.metrics import Metrics
from resolvers.core.persisted import PersistedDocuments
from resolvers.core.ratelimit import RateLimiter
from resolvers.processes.accounts import AccountDeletions
from resolvers.processes.exports import ExportBuilder
from resolvers.processes.live import EventReads
from resolvers.processes.mailer import Mailer
from resolvers.processes.pipeline import Pipeline
from resolvers.processes.pusher import PushQueue
from resolvers.processes.scheduler import UnlockScheduler
from store import items
from store.blobs import BlobStore
from store.port import Table

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass(frozen=True)
class Services:
    """Everything a request or a background process may use, typed; built once
    per process by `resolvers.runtime.compose`."""

    settings: Settings
    table: Table
    verifier: TokenVerifier
    cursors: CursorSigner
    rates: RateLimiter
    broker: Broker
    blobs: BlobStore
    pipeline: Pipeline
    scheduler: UnlockScheduler
    event_reads: EventReads
    persisted: PersistedDocuments
    exports: ExportBuilder
    accounts: AccountDeletions
    transcriber: Transcriber | None = None
    # Only when MIFAMILIAS_SMTP_URL is set: without it nothing sends mail.
    mailer: Mailer | None = None
    # Web Push, on by default; native push when an SNS platform application is set.
    web_push: WebPushSender | None = None
    native_push: SnsPush | None = None
    pusher: PushQueue | None = None
    clock: Callable[[], datetime] = utc_now
    known_users: KnownUsers = field(default_factory=KnownUsers)
    metrics: Metrics = field(default_factory=Metrics.disabled)
    tracer: Tracer | None = None

    def now(self) -> datetime:
        return self.clock()

    def now_iso(self) -> str:
        return items.iso(self.clock())
