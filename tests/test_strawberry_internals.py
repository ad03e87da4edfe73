"""schema/strawberry_internals.py against the installed Strawberry: each of
Strawberry's internals it names, called the way our code calls it. When an
upgrade changes one, the test says so, naming the seam, so that the seam is
adapted there rather than its users (`./dev upgrade` runs this with the rest).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import timedelta
from importlib import metadata
from types import ModuleType
from typing import Any

import httpx
import pytest
import strawberry
from graphql import (
    GraphQLError,
    GraphQLObjectType,
    GraphQLResolveInfo,
    GraphQLSchema,
    OperationDefinitionNode,
    execute,
    parse,
    specified_rules,
    validate,
)
from strawberry.asgi import GraphQL
from strawberry.extensions import MaxAliasesLimiter, QueryDepthLimiter, SchemaExtension
from strawberry.subscriptions import GRAPHQL_SSE_PROTOCOL, MULTIPART_SUBSCRIPTION_PROTOCOL
from strawberry.types import ExecutionContext, ExecutionResult

from tests.tiers import ROOT

SEAM = "schema/strawberry_internals.py"
VERSION = metadata.version("strawberry-graphql")


def changed(what: str) -> str:
    return f"{SEAM}: Strawberry {VERSION} no longer {what}; adapt the seam"


@contextlib.contextmanager
def relied_on(what: str) -> Iterator[None]:
    """What fails inside fails naming the seam and what it relies on."""
    try:
        yield
    except Exception as error:
        pytest.fail(f"{changed(what)}\n({type(error).__name__}: {error})")


def internals() -> ModuleType:
    with relied_on("has every name the seam imports (see test_every_name_the_seam_imports_is_there)"):
        return importlib.import_module("schema.strawberry_internals")
    raise AssertionError("unreachable")


# A small schema of each kind of field the seam's users meet.


class NotFound(Exception):
    pass


@strawberry.type
class Missing:
    message: str


@strawberry.type
class Node:
    name: str

    @strawberry.field
    def child(self) -> Node:
        return Node(name=f"{self.name}'s child")


class Answer(strawberry.ExceptionHandler[NotFound, Missing]):
    def handle(self, exception: NotFound, *, field: Any, info: Any) -> Missing:
        return Missing(message=str(exception))


SEEN: dict[str, Any] = {}


@strawberry.type
class Query:
    @strawberry.field
    def hello(self, info: strawberry.Info, to_whom: str = "you") -> str:
        SEEN["info"] = info
        return f"hello {to_whom}"

    @strawberry.field
    def node(self) -> Node:
        return Node(name="root")

    @strawberry.field
    def found(self) -> Node | Missing:
        raise NotFound("gone")

    @strawberry.field
    async def later(self) -> int:
        await asyncio.sleep(0)
        return 1


@strawberry.type
class Mutation:
    @strawberry.mutation
    def poke(self) -> int:
        return 1


@strawberry.type
class Subscription:
    @strawberry.subscription
    async def count(self, upto: int, pause: float = 0.0) -> AsyncGenerator[int, None]:
        for n in range(upto):
            await asyncio.sleep(pause)
            yield n


class Quiet(strawberry.Schema):
    def process_errors(self, errors: Any, execution_context: Any = None) -> None:
        return None  # the refusals below are what the tests ask for


def small_schema(**options: Any) -> strawberry.Schema:
    return Quiet(
        query=Query, mutation=Mutation, subscription=Subscription, exception_handlers=[Answer()], **options
    )


# Names ------------------------------------------------------------------------------------


def test_every_name_the_seam_imports_is_there() -> None:
    """Each name the seam imports from Strawberry, one by one, so that a
    missing one is named (the seam itself then fails to import)."""
    tree = ast.parse((ROOT / SEAM).read_text())
    imported = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "strawberry"
        for alias in node.names
    ]
    assert len(imported) > 20
    missing = []
    for module, name in imported:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{name}")
    assert missing == [], changed(f"has {', '.join(missing)}")


def test_operation_types() -> None:
    seam = internals()
    with relied_on("names operation types with `OperationType`, allowing each by default"):
        assert {kind.value for kind in seam.OperationType} >= {"query", "mutation", "subscription"}
        assert set(seam.DEFAULT_ALLOWED_OPERATION_TYPES) == {
            seam.OperationType.QUERY,
            seam.OperationType.MUTATION,
            seam.OperationType.SUBSCRIPTION,
        }
        seen: list[Any] = []

        class Kind(SchemaExtension):
            def on_execute(self) -> Iterator[None]:
                seen.append(self.execution_context.operation_type)
                yield

        schema = small_schema(extensions=[Kind])
        assert asyncio.run(schema.execute("mutation { poke }")).errors is None
        assert seen == [seam.OperationType.MUTATION]


async def test_request_errors() -> None:
    """What schema.errors and schema.observability take for a request that
    names no operation it may run."""
    seam = internals()
    schema = small_schema()
    with relied_on("raises `REQUEST_ERRORS` for an unknown operation name or a type not allowed"):
        with pytest.raises(seam.REQUEST_ERRORS):
            await schema.execute("query A { node { name } } query B { node { name } }", operation_name="C")
        with pytest.raises(seam.REQUEST_ERRORS):
            await schema.execute("mutation { poke }", allowed_operation_types=(seam.OperationType.QUERY,))
        results: Any = await schema.stream(
            "mutation { poke }", allowed_operation_types=(seam.OperationType.QUERY,)
        )
        [result] = [result async for result in results]
        assert isinstance(result.errors[0].original_error, seam.REQUEST_ERRORS)


# A schema's graphql-core schema, an Info's graphql-core info ----------------------------------


async def test_core_schema_is_what_strawberry_executes() -> None:
    seam = internals()
    schema = small_schema()
    with relied_on("keeps the graphql-core schema it executes as `_schema`"):
        core = seam.core_schema(schema)
        assert isinstance(core, GraphQLSchema)
        assert execute(core, parse("{ node { name } }")).data == {"node": {"name": "root"}}  # type: ignore[union-attr]
        # schema.resolving replaces resolvers there, and Strawberry runs them.
        node = core.type_map["Node"]
        assert isinstance(node, GraphQLObjectType)
        node.fields["name"].resolve = lambda source, info: "direct"
        assert (await schema.execute("{ node { name } }")).data == {"node": {"name": "direct"}}


async def test_raw_info_and_info_maker() -> None:
    """schema.cost and schema.frames read an Info's graphql-core info;
    schema.resolving makes an Info from one, as Strawberry's wrapper does."""
    seam = internals()
    schema = small_schema()
    with relied_on(
        "keeps graphql-core's info as `Info._raw_info`, or makes an `Info` from `_raw_info` and `_field`"
    ):
        result = await schema.execute('query Hi { hello(toWhom: "ana") }', context_value={"who": "ana"})
        assert result.errors is None
        info = SEEN["info"]
        raw = seam.raw_info(info)  # graphql-core's, or a copy with the same fields
        assert set(GraphQLResolveInfo._fields) <= set(raw._fields)
        assert raw.field_name == "hello"
        assert raw.schema is seam.core_schema(schema)
        assert isinstance(raw.operation, OperationDefinitionNode)
        assert raw.operation.name is not None and raw.operation.name.value == "Hi"
        assert raw.fragments == {}
        assert raw.variable_values == {}
        field = seam.strawberry_field(seam.core_schema(schema).query_type.fields["hello"])
        made = seam.info_maker(schema, field)(raw)
        assert isinstance(made, schema.config.info_class)
        assert seam.raw_info(made) is raw
        assert (made.field_name, made.python_name, made.context) == ("hello", "hello", {"who": "ana"})


def test_strawberry_field() -> None:
    """What schema.resolving reads of a field to decide whether graphql-core
    may call its resolver directly."""
    seam = internals()
    schema = small_schema()
    core = seam.core_schema(schema)
    with relied_on("links a graphql-core field to its `StrawberryField`, with its resolver's parameters"):
        hello = seam.strawberry_field(core.query_type.fields["hello"])
        assert isinstance(hello, seam.StrawberryField)
        resolver = hello.base_resolver
        assert resolver is not None
        assert resolver.wrapped_func.__name__ == "hello"
        assert resolver.self_parameter is not None
        assert resolver.info_parameter is not None and resolver.info_parameter.name == "info"
        assert resolver.parent_parameter is None and resolver.root_parameter is None
        assert [argument.python_name for argument in hello.arguments] == ["to_whom"]
        assert schema.config.name_converter.from_argument(hello.arguments[0]) == "toWhom"
        assert not hello.extensions and not hello.permission_classes
        assert seam.strawberry_field(core.type_map["__Schema"].fields["types"]) is None


async def test_has_exception_handlers() -> None:
    seam = internals()
    schema = small_schema()
    core = seam.core_schema(schema)
    with relied_on("tells which fields an exception handler may answer for"):
        assert seam.has_exception_handlers(schema, seam.strawberry_field(core.query_type.fields["found"]))
        assert not seam.has_exception_handlers(schema, seam.strawberry_field(core.query_type.fields["node"]))
        result = await schema.execute("{ found { ... on Missing { message } } }")
        assert result.data == {"found": {"message": "gone"}}


async def test_provided_operation_name() -> None:
    """schema.prepared keeps a document by the operation name the request sent."""
    seam = internals()
    schema = small_schema()
    with relied_on("keeps the operation name a request sent as `ExecutionContext._provided_operation_name`"):
        query = "query Named { node { name } }"
        for sent in (None, "Named"):
            context = ExecutionContext(
                query=query,
                schema=schema,
                allowed_operations=seam.DEFAULT_ALLOWED_OPERATION_TYPES,
                provided_operation_name=sent,
            )
            context.graphql_document = parse(query)
            assert context.operation_name == "Named"
            assert seam.provided_operation_name(context) == sent
        found: list[str | None] = []

        class Sent(SchemaExtension):
            def on_validate(self) -> Iterator[None]:
                yield
                found.append(seam.provided_operation_name(self.execution_context))

        schema = small_schema(extensions=[Sent])
        await schema.execute(query)
        await schema.execute(query, operation_name="Named")
        assert found == [None, "Named"]


# Validation -------------------------------------------------------------------------------


async def test_limits_rules_are_the_extensions() -> None:
    """schema.persisted checks a manifest with the depth and alias limits'
    own rules: they refuse what the extensions refuse."""
    seam = internals()
    schema = small_schema()
    core = seam.core_schema(schema)
    deep = parse("{ node { child { child { name } } } }")
    aliased = parse("{ a: node { name } b: node { name } }")
    with relied_on("makes the depth and alias limits' rules with `create_validator`"):
        assert validate(core, deep, [seam.depth_rule(3)]) == []
        [too_deep] = validate(core, deep, [seam.depth_rule(2)])
        assert validate(core, aliased, [seam.aliases_rule(2)]) == []
        [too_many] = validate(core, aliased, [seam.aliases_rule(1)])
        limited = small_schema(
            extensions=[QueryDepthLimiter(max_depth=2), MaxAliasesLimiter(max_alias_count=1)]
        )
        assert [e.message for e in (await limited.execute(deep.loc.source.body)).errors or ()] == [  # type: ignore[union-attr]
            too_deep.message
        ]
        assert [e.message for e in (await limited.execute(aliased.loc.source.body)).errors or ()] == [  # type: ignore[union-attr]
            too_many.message
        ]


async def test_validate_document_is_strawberry_validation() -> None:
    """schema.documents caches what Strawberry's validation answers."""
    seam = internals()
    schema = small_schema()
    core = seam.core_schema(schema)
    with relied_on("validates with `validate_document(schema, document, rules)`"):
        rules = tuple(specified_rules)
        assert seam.validate_document(core, parse("{ node { name } }"), rules) == []
        errors = seam.validate_document(core, parse("{ nope }"), rules)
        assert errors and all(isinstance(error, GraphQLError) for error in errors)
        result = await schema.execute("{ nope }")
        assert [e.message for e in result.errors or ()] == [e.message for e in errors]


# Execution --------------------------------------------------------------------------------


async def test_awaiting_as_strawberry_does() -> None:
    """schema.prepared executes with graphql-core as Strawberry calls it."""
    seam = internals()
    schema = small_schema()
    with relied_on("has `optimized_is_awaitable` and `await_maybe` as graphql-core's execution takes them"):

        async def two() -> int:
            return 2

        coroutine = two()
        assert seam.optimized_is_awaitable(coroutine) and not seam.optimized_is_awaitable(2)
        assert await seam.await_maybe(coroutine) == 2
        assert await seam.await_maybe(3) == 3
        result = await seam.await_maybe(
            execute(
                seam.core_schema(schema),
                parse("{ later }"),
                is_awaitable=seam.optimized_is_awaitable,
                executor_class=schema.execution_context_class,
                operation_extensions=None,
            )
        )
        assert result.data == {"later": 1}


async def test_pre_execution_error() -> None:
    """schema.prepared answers a subscription refused before its stream
    exists as Strawberry does, which the WebSocket handlers tell apart."""
    seam = internals()
    schema = small_schema()
    with relied_on("answers a refused subscription with a `PreExecutionError` result"):
        assert issubclass(seam.PreExecutionError, ExecutionResult)
        made = seam.PreExecutionError(data=None, errors=[GraphQLError("no")], extensions={})
        assert isinstance(made, ExecutionResult)
        results = await schema.subscribe(
            "subscription ($n: Int!) { count(upto: $n) }", variable_values={"n": "many"}
        )
        [result] = [result async for result in results]
        assert isinstance(result, seam.PreExecutionError)


async def test_execution_context_class() -> None:
    """schema.guard and schema.deadline derive from Strawberry's execution
    context and complete objects through graphql-core's method."""
    seam = internals()
    seen: list[tuple[str, Any, Any]] = []

    class Recording(seam.StrawberryGraphQLCoreExecutionContext):  # type: ignore[name-defined,misc]
        def complete_object_value(
            self,
            return_type: Any,
            field_details_list: Any,
            info: Any,
            path: Any,
            result: Any,
            position_context: Any,
        ) -> Any:
            seen.append((return_type.name, self.context_value, self.operation_extensions))
            assert not self.is_awaitable(result)
            return super().complete_object_value(
                return_type, field_details_list, info, path, result, position_context
            )

    with relied_on("executes with a `StrawberryGraphQLCoreExecutionContext` subclass as graphql-core's"):
        schema = small_schema(execution_context_class=Recording)
        result = await schema.execute(
            "{ node { name } }", context_value="them", operation_extensions={"x": 1}
        )
        assert result.data == {"node": {"name": "root"}}
        assert seen == [("Node", "them", {"x": 1})]


# The extension runner (schema.hooks) ---------------------------------------------------------


def _hooks_run(calls: list[str]) -> list[type[SchemaExtension]]:
    class Every(SchemaExtension):
        def on_operation(self) -> Iterator[None]:
            calls.append("operation")
            yield
            calls.append("operation done")

        async def on_validate(self) -> AsyncIterator[None]:
            calls.append("validate")
            yield
            calls.append("validate done")

        def on_parse(self) -> None:  # type: ignore[override]  # a plain function, run on entering
            calls.append("parse")

        async def on_execute(self) -> None:  # type: ignore[override]
            calls.append("execute")

        def on_stream_result(self, result: Any) -> None:  # type: ignore[override]
            calls.append(f"result {result.data}")

    class Other(SchemaExtension):
        def on_operation(self) -> Iterator[None]:
            calls.append("other")
            yield
            calls.append("other done")

        def on_stream_result(self, result: Any) -> Iterator[None]:
            calls.append("other result")
            yield

    return [Every, Other]


async def test_extension_runner() -> None:
    """schema.hooks' runner, made by the schema's `create_extensions_runner`
    from Strawberry's runner and context managers, runs every hook as
    Strawberry's own runner does."""
    from schema.hooks import HooksFoundOnce

    made: list[str] = []

    class FoundOnce(Quiet):
        def create_extensions_runner(self, execution_context: Any, extensions: Any) -> Any:
            made.append("runner")
            return HooksFoundOnce(execution_context=execution_context, extensions=extensions)

    async def run(schema_class: type[strawberry.Schema]) -> list[str]:
        calls: list[str] = []
        schema = schema_class(query=Query, subscription=Subscription, extensions=_hooks_run(calls))
        assert (await schema.execute("{ node { name } }")).errors is None
        results = await schema.subscribe("subscription { count(upto: 2) }")
        assert [result.data async for result in results] == [{"count": 0}, {"count": 1}]
        return calls

    with relied_on("runs extensions through `create_extensions_runner` and its context managers"):
        theirs = await run(Quiet)
        ours = await run(FoundOnce)
        assert made == ["runner", "runner"]
        assert "result {'count': 1}" in theirs and "other result" in theirs
        assert ours == theirs


# Transports -------------------------------------------------------------------------------


class FakeSocket:
    """A client that sends `messages`, a little apart, then goes away."""

    def __init__(self, seam: ModuleType, view: Any, messages: list[dict[str, Any]]) -> None:
        class Socket(seam.AsyncWebSocketAdapter):  # type: ignore[name-defined,misc]
            async def iter_json(self, *, ignore_parsing_errors: bool = False) -> AsyncGenerator[object, None]:
                for message in messages:
                    yield message
                    await asyncio.sleep(0.05)
                raise seam.WebSocketDisconnected

            async def send_json(self, message: Any) -> None:
                sent.append(message)

            async def close(self, code: int, reason: str) -> None:
                sent.append({"closed": code})

        sent: list[Any] = []
        self.sent = sent
        self.adapter = Socket(view)


async def test_graphql_transport_ws_handler() -> None:
    """What schema.transport's handler reads, sets and calls on Strawberry's."""
    seam = internals()
    schema = small_schema()
    view = GraphQL(schema)
    seen: dict[str, Any] = {}

    class Handler(seam.BaseGraphQLTransportWSHandler):  # type: ignore[name-defined,misc]
        async def handle_connection_init(self, message: Any) -> None:
            seen["before"] = (self.connection_init_received, self.connection_timed_out)
            await super().handle_connection_init(message)
            seen["acknowledged"] = self.connection_acknowledged

        async def handle_subscribe(self, message: Any) -> None:
            await super().handle_subscribe(message)
            seen["operations"] = {id: operation.completed for id, operation in self.operations.items()}

    messages = [
        {"type": "connection_init", "payload": {}},
        {"id": "1", "type": "subscribe", "payload": {"query": "subscription { count(upto: 2) }"}},
    ]
    socket = FakeSocket(seam, view, messages)
    with relied_on(
        "runs graphql-transport-ws with `BaseGraphQLTransportWSHandler` as schema.transport uses it"
    ):
        handler = Handler(
            view=view,
            websocket=socket.adapter,
            context={},
            root_value=None,
            schema=schema,
            connection_init_wait_timeout=timedelta(seconds=5),
        )
        assert handler.view is view and handler.websocket is socket.adapter
        await asyncio.wait_for(handler.handle(), 5)  # the client going away ends it
        assert seen == {"before": (False, False), "acknowledged": True, "operations": {"1": False}}
        assert [message["type"] for message in socket.sent] == ["connection_ack", "next", "next", "complete"]
        for name in ("handle_message", "cleanup_operation", "send_message", "shutdown"):
            assert asyncio.iscoroutinefunction(getattr(handler, name)), name


async def test_graphql_ws_handler() -> None:
    """What schema.transport's legacy handler reads, sets and calls on
    Strawberry's, and the schema's `subscribe` it calls (schema.transport
    gives it one that runs queries too)."""
    seam = internals()
    schema = small_schema()
    view = GraphQL(schema)
    seen: dict[str, Any] = {}

    class AnyOperation:
        async def subscribe(self, query: str | None, **kwargs: Any) -> Any:
            return await schema.stream(
                query,
                **kwargs,
                allowed_operation_types=(seam.OperationType.QUERY, seam.OperationType.SUBSCRIPTION),
            )

    class Handler(seam.BaseGraphQLWSHandler):  # type: ignore[name-defined,misc]
        async def handle_start(self, message: Any) -> None:
            await super().handle_start(message)
            seen.setdefault("tasks", []).append(sorted(self.tasks))

    messages = [
        {"type": "connection_init", "payload": {}},
        {"id": "1", "type": "start", "payload": {"query": "subscription { count(upto: 1) }"}},
        {"id": "2", "type": "start", "payload": {"query": "{ node { name } }"}},
    ]
    socket = FakeSocket(seam, view, messages)
    with relied_on("runs graphql-ws with `BaseGraphQLWSHandler` as schema.transport uses it"):
        handler = Handler(
            view=view,
            websocket=socket.adapter,
            context={},
            root_value=None,
            schema=schema,
            keep_alive=False,
            keep_alive_interval=None,
        )
        handler.schema = AnyOperation()
        await asyncio.wait_for(handler.handle(), 5)
        assert handler.connection_acknowledged
        assert seen == {"tasks": [["1"], ["2"]]}
        sent = [(message["type"], message.get("id")) for message in socket.sent]
        assert sent == [
            ("connection_ack", None),
            ("data", "1"),
            ("complete", "1"),
            ("data", "2"),
            ("complete", "2"),
        ]
        for name in (
            "handle_message",
            "handle_connection_init",
            "cleanup_operation",
            "cleanup",
            "send_message",
        ):
            assert asyncio.iscoroutinefunction(getattr(handler, name)), name


async def test_stream_transports() -> None:
    """schema.streams sets the SSE and multipart heartbeats on Strawberry's
    transports, which the view picks by protocol."""
    seam = internals()
    from schema import streams

    with relied_on("takes SSE and multipart transports by protocol, with a `heartbeat_interval`"):
        transports = streams.transports(0.05)
        assert set(transports) == {GRAPHQL_SSE_PROTOCOL, MULTIPART_SUBSCRIPTION_PROTOCOL}
        for made in transports.values():
            assert issubclass(made, seam.HTTPStreamTransport)
            assert made().heartbeat_interval == 0.05
        assert (seam.SSETransport.protocol, seam.MultipartSubscriptionTransport.protocol) == streams.STREAMED

        view = GraphQL(small_schema(), subscription_protocols=streams.PROTOCOLS)
        view.stream_transport_classes_by_protocol = transports
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=view), base_url="http://test"
        ) as client:
            body = {"query": "subscription { count(upto: 1, pause: 0.3) }"}
            answer = await client.post("/graphql", json=body, headers={"accept": "text/event-stream"})
        assert answer.status_code == 200
        assert ": ping" in answer.text  # a heartbeat while the event was on its way
        assert "event: next\r\ndata: " in answer.text and '{"data":{"count":0}}' in answer.text.replace(
            " ", ""
        )


async def test_queued_socket_is_a_websocket_adapter() -> None:
    """schema.backpressure's queued socket stands in for Strawberry's adapter:
    every abstract method of it implemented, its `view` given."""
    seam = internals()
    from schema.backpressure import QueuedSocket

    with relied_on("asks of a WebSocket adapter only what schema.backpressure implements"):
        assert issubclass(QueuedSocket, seam.AsyncWebSocketAdapter)
        assert not QueuedSocket.__abstractmethods__
        view = GraphQL(small_schema())
        inner = FakeSocket(seam, view, []).adapter

        async def nothing() -> None:
            return None

        queued = QueuedSocket(
            inner, lambda after: None, lambda why: None, nothing, frames=4, slow_seconds=1.0
        )
        assert queued.view is view


# Tracing ----------------------------------------------------------------------------------


async def test_open_telemetry_base() -> None:
    """schema.observability's tracing gives Strawberry's OpenTelemetry
    extension its tracer and the operation's span; the extension's own hooks
    hang their spans under it."""
    seam = internals()
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import NoOpTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    class Traced(seam.OpenTelemetryBase):  # type: ignore[name-defined,misc]
        def __init__(self, *, execution_context: Any = None) -> None:
            super().__init__(NoOpTracer(), execution_context=execution_context)

        def on_operation(self) -> Iterator[None]:
            self.tracer = tracer
            span = self.tracer.start_span("operation")
            self.hold_operation_span(span)
            yield
            span.end()

    with relied_on("takes `OpenTelemetryExtension`'s tracer and spans from its `_tracer` and `_span_holder`"):
        schema = small_schema(extensions=[Traced])
        assert (await schema.execute("{ hello }")).errors is None
        spans = {span.name: span for span in exporter.get_finished_spans()}
        assert {"operation", "GraphQL Parsing", "GraphQL Validation", "GraphQL Resolving: hello"} <= set(
            spans
        )
        operation = spans["operation"].context
        for name in ("GraphQL Parsing", "GraphQL Validation", "GraphQL Resolving: hello"):
            parent = spans[name].parent
            assert parent is not None and parent.span_id == operation.span_id, name
