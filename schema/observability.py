"""What an operation tells the operators: its log fields, its metrics, its spans.

- `RequestObservability` (ASGI, around every route): a `RequestLog` in the
  log context for each HTTP request and each WebSocket connection, and with
  tracing a server span per HTTP request (parented by an incoming
  `traceparent`), current while the request runs.
- `OperationLog` (schema extension): the operation's name into the log
  context, a DEBUG line when it ends.
- `OperationMetrics` (schema extension, with metrics on): requests by
  operation and type, parse / validate / execute time, errors by
  `extensions.code` (after `ContractErrors` gave every error one).
- `Tracing`: Strawberry's `OpenTelemetryExtension`, with the app's tracer
  (from `Services`), our span names, and no document text or argument values
  but ids and page sizes on the spans (documents and inputs may hold private
  text and invite codes).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from graphql import DocumentNode, OperationDefinitionNode
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from strawberry.extensions import SchemaExtension

from resolvers.core import logs
from resolvers.core.context import Context
from resolvers.core.metrics import ANONYMOUS, OTHER, Metrics
from schema.strawberry_internals import REQUEST_ERRORS, OpenTelemetryBase

if TYPE_CHECKING:
    from graphql import GraphQLResolveInfo
    from opentelemetry.trace import Tracer
    from strawberry.types import ExecutionContext

log = logging.getLogger("mifamilias.graphql")


# The request --------------------------------------------------------------------------


class RequestObservability:
    def __init__(self, app: ASGIApp, tracer: Tracer | None = None) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        token = logs.current.set(logs.RequestLog())
        try:
            if self.tracer is None or scope["type"] != "http":
                await self.app(scope, receive, send)
            else:
                await self._traced(self.tracer, scope, receive, send)
        finally:
            logs.current.reset(token)

    async def _traced(self, tracer: Tracer, scope: Scope, receive: Receive, send: Send) -> None:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        headers = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers") or ()
        }
        method = scope.get("method", "GET")
        path = scope.get("path") or "/"
        # Named by the route's first segment: a media path holds ids.
        route = "/" + path.strip("/").split("/", 1)[0]
        with tracer.start_as_current_span(
            f"{method} {route}",
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": path,
                "http.route": route,
                "mifamilias.request_id": _request_id(),
            },
        ) as span:

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, send_traced)


def _request_id() -> str:
    found = logs.current.get()
    return found.request_id if found else ""


# The operation ------------------------------------------------------------------------


def _metrics(context: object) -> Metrics | None:
    if isinstance(context, Context):
        metrics = context.services.metrics
        return metrics if metrics.enabled else None
    return None


def operation_type(execution_context: ExecutionContext) -> str:
    try:
        return str(execution_context.operation_type.value)
    except Exception:  # no document, or no such operation in it
        return "unknown"


def operation_label(execution_context: ExecutionContext, metrics: Metrics) -> str:
    return label_of(
        metrics,
        execution_context.operation_name,
        execution_context.graphql_document,
        execution_context.context,
        execution_context.query,
    )


def label_of(
    metrics: Metrics, name: str | None, document: DocumentNode | None, context: object, query: str | None
) -> str:
    """The operation's name as a bounded label: the name of the operation the
    document holds ("anonymous" without one), "other" for a name the document
    does not hold or past the cap. Only an operation run signed in, or one of
    the trusted documents, gives a name its place: anonymous requests cannot
    fill the labels."""
    if not name:
        return ANONYMOUS
    if document is None or not any(
        isinstance(node, OperationDefinitionNode) and node.name is not None and node.name.value == name
        for node in document.definitions
    ):
        return OTHER
    may_add = True
    if isinstance(context, Context) and context.signed_in_error() is not None:
        trusted = context.services.persisted.trusted
        may_add = trusted is not None and trusted.lists(query or "")
    return metrics.operation_label(name, may_add=may_add)


def count_errors(metrics: Metrics, label: str, errors: Sequence[Any] | None) -> None:
    """Each error answered, by its `extensions.code`."""
    for error in errors or ():
        metrics.graphql_error(label, (getattr(error, "extensions", None) or {}).get("code"))


class OperationLog(SchemaExtension):
    """The operation's name in the log context (from validation on, when the
    document is known); a DEBUG line when the operation ends."""

    def on_validate(self) -> Iterator[None]:
        logs.set_operation(self.execution_context.operation_name)
        yield

    def on_operation(self) -> Iterator[None]:
        try:
            yield
        finally:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("operation finished (%s)", operation_type(self.execution_context))


class OperationMetrics(OperationLog):
    """Counts and times each operation. Extensions nest in list order: this one
    comes first, so it times the others' hooks too and sees the errors after
    `ContractErrors` has coded them."""

    def __init__(self, *, execution_context: ExecutionContext | None = None) -> None:
        if execution_context is not None:
            self.execution_context = execution_context
        self._phases: dict[str, float] = {}
        self._label: str | None = None
        self._counted = False
        self._streamed = False

    def _metrics_and_label(self) -> tuple[Metrics | None, str]:
        metrics = _metrics(self.execution_context.context)
        if metrics is None:
            return None, ANONYMOUS
        if self._label is None:
            self._label = operation_label(self.execution_context, metrics)
        return metrics, self._label

    def _count_request(self) -> None:
        """Once per operation, as soon as it runs (a subscription counts when it
        starts) or when it ends without running (refused)."""
        if self._counted:
            return
        self._counted = True
        metrics, label = self._metrics_and_label()
        if metrics is not None:
            metrics.graphql_operation(label, operation_type(self.execution_context), self._phases)

    def _count_errors(self, result: Any) -> None:
        errors = getattr(result, "errors", None)
        if not errors:
            return
        metrics, label = self._metrics_and_label()
        if metrics is not None:
            count_errors(metrics, label, errors)

    def on_parse(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._phases["parse"] = time.perf_counter() - started

    def on_validate(self) -> Iterator[None]:
        logs.set_operation(self.execution_context.operation_name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self._phases["validate"] = time.perf_counter() - started

    def on_execute(self) -> Iterator[None]:
        self._count_request()
        started = time.perf_counter()
        try:
            yield
        finally:
            metrics, label = self._metrics_and_label()
            if metrics is not None:
                metrics.graphql_phase_done(label, "execute", time.perf_counter() - started)

    def on_stream_result(self, result: Any) -> Iterator[None]:
        # Each result on a WebSocket (every subscription event) leaves through here.
        self._streamed = True
        yield None
        self._count_errors(result)

    def on_operation(self) -> Iterator[None]:
        done = False
        try:
            yield
            done = True
        except asyncio.CancelledError:
            raise  # stopped (a deadline): MiFamiliasSchema.execute counts its answer
        except Exception as error:
            # What leaves the operation as an exception (a syntax error from the
            # parser cache, an unknown operation name) is answered outside it.
            metrics, label = self._metrics_and_label()
            if metrics is not None:
                code = (getattr(error, "extensions", None) or {}).get("code")
                if isinstance(error, REQUEST_ERRORS):
                    code = "BAD_USER_INPUT"  # the transport answers them so
                metrics.graphql_error(label, code)
            raise
        finally:
            self._count_request()
            if done and not self._streamed:
                self._count_errors(self.execution_context.result)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("operation finished (%s)", operation_type(self.execution_context))


# Traces -----------------------------------------------------------------------------

# Arguments that may go on a resolver's span: ids and page sizes. Not texts,
# not invite codes, not input objects.
_SAFE_ARGUMENT = re.compile(r"^(id|ids|first|last|after|before)$|Ids?$")


class Tracing(OpenTelemetryBase):
    def __init__(self, *, execution_context: ExecutionContext | None = None) -> None:
        from opentelemetry.trace import NoOpTracer

        super().__init__(NoOpTracer(), execution_context=execution_context)

    def filter_resolver_args(self, args: dict[str, Any], info: GraphQLResolveInfo[Any]) -> dict[str, Any]:
        return {name: value for name, value in args.items() if _SAFE_ARGUMENT.search(name)}

    def on_operation(self) -> Generator[None, None, None]:
        context = self.execution_context.context
        tracer = context.services.tracer if isinstance(context, Context) else None
        if tracer is not None:
            self.tracer = tracer
        span = self.tracer.start_span("GraphQL operation", attributes={"component": "graphql"})
        self.hold_operation_span(span)
        try:
            yield
        finally:
            name = self.execution_context.operation_name
            kind = operation_type(self.execution_context)
            span.update_name(f"GraphQL {kind} {name or ANONYMOUS}"[:120])
            span.set_attribute("graphql.operation.type", kind)
            if name:
                span.set_attribute("graphql.operation.name", name[:100])
            if isinstance(context, Context):
                span.set_attribute("mifamilias.request_id", context.request_id)
            errors = getattr(self.execution_context.result, "errors", None) or ()
            if errors:
                codes = sorted({str((getattr(e, "extensions", None) or {}).get("code")) for e in errors})
                span.set_attribute("graphql.error.codes", codes)
            span.end()
