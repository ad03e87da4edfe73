"""Every Prometheus metric of one app, in one registry of its own (tests build
many apps in one process; each scrapes only its own). Built once per app and
carried in `Services.metrics`; served at `/metrics` (or on
`MIFAMILIAS_METRICS_PORT`).

Labels are bounded: operation names come from the document and are capped
(`OPERATION_CAP` distinct names, then "other"), unnamed operations are
"anonymous"; channels, store kinds, pipeline steps and failure reasons come
from fixed sets. No label ever holds an id.

With `enabled=False` every recording method returns at once, and the callers
on hot paths (the store wrapper, the GraphQL extension) are not installed at
all.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

OPERATION_CAP = 200
ANONYMOUS = "anonymous"
OTHER = "other"
_NAME = re.compile(r"[_A-Za-z][_0-9A-Za-z]{0,63}")
CODES = frozenset(
    {
        "UNAUTHENTICATED",
        "FORBIDDEN",
        "NOT_FOUND",
        "BAD_USER_INPUT",
        "CONFLICT",
        "RATE_LIMITED",
        "INTERNAL_SERVER_ERROR",
        "UNAVAILABLE",
    }
)
# "stream": a subscriber let go by the broker (its events queue full), whatever carries it.
TRANSPORTS = frozenset({"graphql-transport-ws", "graphql-ws", "sse", "multipart", "stream"})
SLOW_REASONS = frozenset({"queue_full", "stalled"})
CHANNELS = frozenset({"capsules", "notifications", "content"})
STORE_KINDS = frozenset(
    {"get", "batch_get", "query", "put", "update", "delete", "batch_write", "transact", "ping"}
)
PIPELINE_STEPS = frozenset({"check", "transcode", "transcribe", "finish"})
# Why a pipeline job failed, in kinds: never the message (it may name a file).
FAILURE_REASONS = frozenset({"media", "transcription", "unexpected"})

# Seconds: one GraphQL phase or one store call (sub-millisecond to seconds).
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Seconds: one pipeline step (a note's check to a long transcode).
SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


def channel_kind(channel: str) -> str:
    """`user:<id>:capsules` -> "capsules", `content:<id>` -> "content"."""
    kind = "content" if channel.startswith("content:") else channel.rsplit(":", 1)[-1]
    return kind if kind in CHANNELS else OTHER


class Metrics:
    def __init__(self, *, enabled: bool = True, registry: CollectorRegistry | None = None) -> None:
        self.enabled = enabled
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._operations: set[str] = set()
        self._children: dict[tuple[object, ...], Any] = {}

        # GraphQL
        self.graphql_requests = Counter(
            "mifamilias_graphql_requests",
            "GraphQL operations, by operation name and type",
            ["operation", "type"],
            registry=r,
        )
        self.graphql_phase = Histogram(
            "mifamilias_graphql_phase_seconds",
            "Time spent parsing, validating and executing an operation",
            ["operation", "phase"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.graphql_errors = Counter(
            "mifamilias_graphql_errors",
            "Errors in GraphQL answers, by operation and extensions.code",
            ["operation", "code"],
            registry=r,
        )
        # Live
        self.websockets = Gauge(
            "mifamilias_websocket_connections", "Open WebSocket connections", ["protocol"], registry=r
        )
        self.subscriptions = Gauge(
            "mifamilias_subscriptions_active", "Subscriptions running now", ["subscription"], registry=r
        )
        self.subscriptions_started = Counter(
            "mifamilias_subscriptions_started", "Subscriptions started", ["subscription"], registry=r
        )
        self.events_published = Counter(
            "mifamilias_events_published", "Live events published, by channel kind", ["channel"], registry=r
        )
        self.events_delivered = Counter(
            "mifamilias_events_delivered",
            "Live events handed to a subscriber of this process, by channel kind",
            ["channel"],
            registry=r,
        )
        self.shared_frames = Counter(
            "mifamilias_events_shared_frames",
            "Subscription events sent as their class's frame, encoded once (by subscription field)",
            ["subscription"],
            registry=r,
        )
        self.events_executed = Counter(
            "mifamilias_subscription_events_executed",
            "Subscription events executed for one subscriber, by subscription field "
            "(a class's shared frame is counted apart)",
            ["subscription"],
            registry=r,
        )
        self.events_dropped = Counter(
            "mifamilias_events_dropped",
            "Live events dropped for a subscriber too far behind",
            ["channel"],
            registry=r,
        )
        self.slow_clients_closed = Counter(
            "mifamilias_slow_clients_closed",
            "Subscribers let go for reading too slowly, by transport and reason (queue_full, stalled)",
            ["transport", "reason"],
            registry=r,
        )
        # Store
        self.store_seconds = Histogram(
            "mifamilias_store_call_seconds",
            "Calls through the table port and their latency, by kind",
            ["kind"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(
            "mifamilias_store_errors",
            "Store calls that raised, by kind and error (a failed condition is an answer, counted too)",
            ["kind", "error"],
            registry=r,
        )
        self.store_throttles = Counter(
            "mifamilias_store_throttles",
            "DynamoDB throttling seen: throttled attempts, unprocessed batch items, throttled transactions",
            ["operation"],
            registry=r,
        )
        self.store_retries = Counter(
            "mifamilias_store_retries",
            "DynamoDB retries: by botocore (attempts) or by our adapter (unprocessed items, cancellations)",
            ["operation", "by"],
            registry=r,
        )
        # Pipeline
        self.pipeline_queue = Gauge(
            "mifamilias_pipeline_queue_depth", "Content waiting in this process's pipeline queue", registry=r
        )
        self.pipeline_step = Histogram(
            "mifamilias_pipeline_step_seconds",
            "Pipeline steps and their duration",
            ["step"],
            buckets=SLOW_BUCKETS,
            registry=r,
        )
        self.pipeline_jobs = Counter(
            "mifamilias_pipeline_jobs", "Pipeline jobs finished, by outcome", ["outcome"], registry=r
        )
        self.pipeline_failures = Counter(
            "mifamilias_pipeline_failures",
            "Pipeline jobs that ended FAILED, by step and reason",
            ["step", "reason"],
            registry=r,
        )
        # Scheduler
        self.scheduler_lag = Gauge(
            "mifamilias_scheduler_lag_seconds",
            "At the last unlock pass: now minus the unlock date of the oldest due capsule not yet AVAILABLE",
            registry=r,
        )
        self.capsules_unlocked = Counter(
            "mifamilias_capsules_unlocked", "Capsules this process made AVAILABLE", registry=r
        )

    @classmethod
    def disabled(cls) -> Metrics:
        return cls(enabled=False)

    def collect_process(self) -> None:
        """CPU, memory, file descriptors and the collector, beside ours (a server process)."""
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # GraphQL -------------------------------------------------------------------

    def operation_label(self, name: str | None, *, may_add: bool = True) -> str:
        """A bounded label for an operation name: the first `OPERATION_CAP`
        distinct names keep theirs, later ones are "other"; a name not yet
        known takes a place only when `may_add` (anyone may send any name)."""
        if not name:
            return ANONYMOUS
        if name in self._operations:
            return name
        if not may_add or len(self._operations) >= OPERATION_CAP or not _NAME.fullmatch(name):
            return OTHER
        self._operations.add(name)
        return name

    def graphql_operation(self, operation: str, kind: str, phases: dict[str, float]) -> None:
        if not self.enabled:
            return
        self._child(self.graphql_requests, operation, kind).inc()
        for phase, seconds in phases.items():
            self._child(self.graphql_phase, operation, phase).observe(seconds)

    def graphql_phase_done(self, operation: str, phase: str, seconds: float) -> None:
        if self.enabled:
            self._child(self.graphql_phase, operation, phase).observe(seconds)

    def graphql_error(self, operation: str, code: object) -> None:
        if self.enabled:
            label = code if isinstance(code, str) and code in CODES else OTHER
            self._child(self.graphql_errors, operation, label).inc()

    # Live ------------------------------------------------------------------------

    @contextlib.contextmanager
    def websocket(self, protocol: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        gauge = self._child(self.websockets, protocol)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    @contextlib.contextmanager
    def subscription(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._child(self.subscriptions_started, name).inc()
        gauge = self._child(self.subscriptions, name)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def published(self, channel: str) -> None:
        if self.enabled:
            self._child(self.events_published, channel_kind(channel)).inc()

    def delivered(self, channel: str, count: int, dropped: int = 0) -> None:
        if not self.enabled:
            return
        kind = channel_kind(channel)
        if count:
            self._child(self.events_delivered, kind).inc(count)
        if dropped:
            self._child(self.events_dropped, kind).inc(dropped)

    def shared_frame(self, subscription: str) -> None:
        if self.enabled:
            self._child(self.shared_frames, subscription).inc()

    def executed(self, subscription: str) -> None:
        if self.enabled:
            self._child(self.events_executed, subscription).inc()

    def slow_client_closed(self, transport: str, reason: str) -> None:
        if self.enabled:
            transport = transport if transport in TRANSPORTS else OTHER
            reason = reason if reason in SLOW_REASONS else OTHER
            self._child(self.slow_clients_closed, transport, reason).inc()

    # Store -------------------------------------------------------------------------

    def store_call(self, kind: str, seconds: float, error: str | None = None) -> None:
        if not self.enabled:
            return
        self._child(self.store_seconds, kind).observe(seconds)
        if error is not None:
            self._child(self.store_errors, kind, error).inc()

    def store_throttled(self, operation: str, count: int = 1) -> None:
        if self.enabled and count:
            self._child(self.store_throttles, operation).inc(count)

    def store_retried(self, operation: str, by: str, count: int = 1) -> None:
        if self.enabled and count:
            self._child(self.store_retries, operation, by).inc(count)

    # Pipeline ----------------------------------------------------------------------

    def watch_queue(self, depth: Callable[[], float]) -> None:
        """The queue depth, read when scraped (nothing to do per job)."""
        if self.enabled:
            self.pipeline_queue.set_function(depth)

    def pipeline_step_done(self, step: str, seconds: float) -> None:
        if self.enabled:
            self._child(self.pipeline_step, step if step in PIPELINE_STEPS else OTHER).observe(seconds)

    def pipeline_job(self, outcome: str) -> None:
        if self.enabled:
            self._child(self.pipeline_jobs, outcome).inc()

    def pipeline_failed(self, step: str, reason: str) -> None:
        if self.enabled:
            step = step if step in PIPELINE_STEPS else OTHER
            reason = reason if reason in FAILURE_REASONS else OTHER
            self._child(self.pipeline_failures, step, reason).inc()

    # Scheduler ---------------------------------------------------------------------

    def scheduler_pass(self, lag_seconds: float) -> None:
        if self.enabled:
            self.scheduler_lag.set(max(0.0, lag_seconds))

    def capsule_unlocked(self) -> None:
        if self.enabled:
            self.capsules_unlocked.inc()
