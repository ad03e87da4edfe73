"""The table port, observed: every call counted and timed by kind
(`Metrics.store_call`) and, when tracing is on, a span per call whose parent is
whatever span is current (a resolver, a pipeline step, a scheduler pass).
Spans are named by kind only ("store get"); partition keys go in attributes,
with what could be a secret in them (an invite code is a key) redacted.

DynamoDB's throttles and retries happen inside botocore and inside our
adapter's loops, below the port: `watch_botocore` listens to the client's
events for them (`needs-retry` for each throttled attempt, `after-call` for
botocore's `RetryAttempts` and for what our adapter will resend: unprocessed
batch items, a transaction cancelled for throttling).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from resolvers.core.logs import redact
from resolvers.core.metrics import Metrics
from store.port import (
    Condition,
    ConditionFailed,
    Index,
    Item,
    Key,
    Page,
    SortKey,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

T = TypeVar("T")

THROTTLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
    }
)


def _error_kind(error: BaseException) -> str:
    if isinstance(error, ConditionFailed):
        return "condition_failed"
    if isinstance(error, TransactionCancelled):
        return "transaction_cancelled"
    return "error"


class ObservedTable:
    def __init__(
        self,
        inner: Table,
        metrics: Metrics,
        tracer: Tracer | None = None,
        *,
        engine: str = "",
        name: str = "",
    ) -> None:
        self.inner = inner
        self.metrics = metrics
        self.tracer = tracer
        self.engine = engine
        self.table_name = name

    async def _call(self, kind: str, call: Awaitable[T], attributes: dict[str, Any]) -> T:
        """`call` is the inner table's coroutine, not started yet: it runs when awaited here."""
        span = None
        if self.tracer is not None:
            if "mifamilias.store.pk" in attributes:
                attributes["mifamilias.store.pk"] = redact(attributes["mifamilias.store.pk"])
            span = self.tracer.start_span(
                f"store {kind}",
                attributes={
                    "db.system": self.engine,
                    "db.collection.name": self.table_name,
                    "db.operation.name": kind,
                    **attributes,
                },
            )
        started = time.perf_counter()
        error: str | None = None
        try:
            return await call
        except BaseException as failure:
            error = _error_kind(failure)
            if span is not None:
                span.set_attribute("mifamilias.store.outcome", error)
                if error == "error":
                    from opentelemetry.trace import Status, StatusCode

                    span.record_exception(failure)
                    span.set_status(Status(StatusCode.ERROR, type(failure).__name__))
            raise
        finally:
            self.metrics.store_call(kind, time.perf_counter() - started, error)
            if span is not None:
                span.end()

    async def get(self, key: Key) -> Item | None:
        return await self._call("get", self.inner.get(key), {"mifamilias.store.pk": key[0]})

    async def batch_get(self, keys: Sequence[Key]) -> dict[Key, Item]:
        return await self._call("batch_get", self.inner.batch_get(keys), {"mifamilias.store.keys": len(keys)})

    async def query(
        self,
        pk: str,
        sk: SortKey | None = None,
        *,
        index: Index = "table",
        descending: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page:
        return await self._call(
            "query",
            self.inner.query(pk, sk, index=index, descending=descending, limit=limit, cursor=cursor),
            {"mifamilias.store.index": index, "mifamilias.store.pk": pk},
        )

    async def put(self, item: Item, condition: Condition | None = None) -> None:
        await self._call("put", self.inner.put(item, condition), {"mifamilias.store.pk": item["PK"]})

    async def update(self, update: Update) -> Item:
        return await self._call("update", self.inner.update(update), {"mifamilias.store.pk": update.key[0]})

    async def delete(self, key: Key, condition: Condition | None = None) -> Item | None:
        return await self._call("delete", self.inner.delete(key, condition), {"mifamilias.store.pk": key[0]})

    async def batch_write(self, puts: Sequence[Item] = (), deletes: Sequence[Key] = ()) -> None:
        await self._call(
            "batch_write",
            self.inner.batch_write(puts, deletes),
            {"mifamilias.store.items": len(puts) + len(deletes)},
        )

    async def transact(self, ops: Sequence[WriteOp]) -> None:
        await self._call("transact", self.inner.transact(ops), {"mifamilias.store.items": len(ops)})

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


def engine_of(table: Table) -> str:
    """ "dynamodb" or "sqlite", looking through wrappers with `inner`."""
    found: object = table
    for _ in range(10):
        name = type(found).__name__.lower()
        if "dynamo" in name or "sqlite" in name:
            return "dynamodb" if "dynamo" in name else "sqlite"
        inner = getattr(found, "inner", None)
        if inner is None:
            break
        found = inner
    return type(table).__name__.lower()


def botocore_client(table: Table) -> Any:
    """The botocore client under `table` (through wrappers with `inner`), if any."""
    found: object = table
    for _ in range(10):
        if found is None:
            return None
        client = getattr(found, "client", None)
        if client is not None and hasattr(getattr(client, "meta", None), "events"):
            return client
        found = getattr(found, "inner", None)
    return None


def watch_botocore(client: Any, metrics: Metrics) -> None:
    """Counts DynamoDB throttles and retries from the client's events."""

    def on_attempt(**kwargs: Any) -> None:
        # Called after every attempt, before botocore decides whether to retry.
        response = kwargs.get("response")
        if not response:
            return
        parsed = response[1] if isinstance(response, tuple) and len(response) > 1 else None
        code = str((parsed or {}).get("Error", {}).get("Code", "")) if isinstance(parsed, dict) else ""
        if code in THROTTLE_CODES:
            metrics.store_throttled(_operation(kwargs))

    def after_call(**kwargs: Any) -> None:
        parsed = kwargs.get("parsed")
        if not isinstance(parsed, dict):
            return
        operation = _operation(kwargs)
        attempts = parsed.get("ResponseMetadata", {}).get("RetryAttempts") or 0
        metrics.store_retried(operation, "botocore", int(attempts))
        # What our adapter resends: it resends because DynamoDB throttled it.
        unprocessed = parsed.get("UnprocessedKeys") or parsed.get("UnprocessedItems")
        failed = [
            str(reason.get("Code"))
            for reason in parsed.get("CancellationReasons") or []
            if isinstance(reason, dict) and reason.get("Code") not in (None, "None", "")
        ]
        throttled = bool(failed) and all(code in THROTTLE_CODES for code in failed)
        if unprocessed or throttled:
            metrics.store_throttled(operation)
            metrics.store_retried(operation, "adapter")

    events = client.meta.events
    # First, so botocore's own retry handler (which answers for the event) cannot hide an attempt.
    events.register_first("needs-retry.dynamodb", on_attempt, unique_id="mifamilias-metrics-attempt")
    events.register("after-call.dynamodb", after_call, unique_id="mifamilias-metrics-after-call")


def _operation(kwargs: dict[str, Any]) -> str:
    model = kwargs.get("model") or kwargs.get("operation")
    name = getattr(model, "name", None)
    return str(name) if name else "unknown"
