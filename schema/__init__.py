"""The GraphQL schema: Strawberry types that wrap store items and delegate to
`resolvers/`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from contextlib import aclosing
from typing import Any, cast

import strawberry
from graphql import GraphQLError
from strawberry.extensions import (
    MaxAliasesLimiter,
    MaxTokensLimiter,
    QueryDepthLimiter,
    SchemaExtension,
)
from strawberry.types import ExecutionResult

from resolvers.core import idempotency, logs
from resolvers.core.context import Context
from resolvers.core.errors import ApiError, unavailable
from schema import prepared
from schema.caching import CachePolicy
from schema.cost import QueryCost
from schema.deadline import DeadlinePassed, StoppingExecutionContext, running_within
from schema.documents import DocumentCache
from schema.errors import ContractErrors
from schema.guard import SignedIn
from schema.hooks import HooksFoundOnce
from schema.mutation import Mutation
from schema.observability import OperationLog, OperationMetrics, Tracing
from schema.persisted import IntrospectionGate, RegisterPersisted
from schema.prepared import Prepare, PreparedOperations
from schema.query import Query
from schema.resolving import call_directly
from schema.strawberry_internals import DEFAULT_ALLOWED_OPERATION_TYPES, OperationType
from schema.subscription import Subscription

MAX_DEPTH = 12
MAX_ALIASES = 30
MAX_TOKENS = 5000


class FreshLoaders(SchemaExtension):
    """Loaders live for one operation: a WebSocket connection keeps its context
    for every operation it carries, and must not serve one a stale cache."""

    def on_operation(self) -> Iterator[None]:
        context = self.execution_context.context
        if isinstance(context, Context):
            context.forget_loaders()
        yield


def names_subscription(query: str | None, operation_name: str | None) -> bool:
    """Whether the operation a document names is a subscription."""
    from graphql import OperationType, parse
    from graphql.utilities import get_operation_ast

    if "subscription" not in (query or ""):
        return False  # no second parse for the queries and mutations that make up the traffic
    try:
        document = parse(query or "", no_location=True, max_tokens=MAX_TOKENS)
    except GraphQLError:
        return False  # the schema answers the syntax error
    operation = get_operation_ast(document, operation_name)
    return operation is not None and operation.operation == OperationType.SUBSCRIPTION


def _deadline(context: object) -> float | None:
    if not isinstance(context, Context):
        return None
    return context.services.settings.operation_deadline_seconds or None


def _writes(query: object, operation_name: object) -> bool:
    """Whether the operation a document names is a mutation. A mutation is
    named by its keyword, so a document without it is not parsed again; the
    others are parsed once per 256 documents (the parser cache's bound). What
    a client sent is not trusted to be a string here: the schema refuses a
    wrong `operationName` with its own error."""
    if not isinstance(query, str) or "mutation" not in query:
        return False
    if operation_name is not None and not isinstance(operation_name, str):
        return False
    return _names_mutation(query, operation_name)


@functools.lru_cache(maxsize=256)
def _names_mutation(query: str, operation_name: str | None) -> bool:
    from graphql import OperationType, parse
    from graphql.utilities import get_operation_ast

    try:
        operation = get_operation_ast(parse(query, no_location=True), operation_name)
    except GraphQLError:
        return False
    return operation is not None and operation.operation == OperationType.MUTATION


def _stopped(deadline: float, context: object, *, writes: bool) -> ExecutionResult:
    """The deadline's answer. The cost limit refused what asks too much before
    it ran, so what runs out of time waited on something (the store, most
    often): UNAVAILABLE, to retry; a mutation stopped mid-way may have been
    applied, so its outcome is UNKNOWN."""
    error = unavailable(
        f"the operation did not finish within {deadline:g} s and was stopped: "
        "the service is slow to answer now",
        outcome_known=not writes,
    )
    if isinstance(context, Context):  # the metrics extension was stopped with the operation
        found = logs.current.get()
        metrics = context.services.metrics
        metrics.graphql_error(metrics.operation_label(found.operation if found else None), error.code)
    return ExecutionResult(
        data=None,
        errors=[
            GraphQLError(
                error.message,
                extensions={"code": error.code, **error.extensions, "deadlineSeconds": deadline},
            )
        ],
    )


async def _within(
    results: AsyncGenerator[Any, None],
    deadline: float,
    context: object,
    *,
    writes: bool,
    request: tuple[str | None, str | None, object],
) -> AsyncGenerator[Any, None]:
    """A query's or mutation's stream (one result) run within the deadline."""

    async def collect() -> list[Any]:
        return [result async for result in results]

    async with aclosing(results):
        try:
            with running_within(deadline):
                async with asyncio.timeout(deadline):
                    if writes:
                        collected = [await _once(context, request, deadline, lambda: _single(collect()))]
                    else:
                        collected = await collect()
        except (TimeoutError, DeadlinePassed):
            collected = [_stopped(deadline, context, writes=writes)]
    for result in collected:
        yield result


async def _single(results: Awaitable[list[Any]]) -> Any:
    found = await results
    return found[0] if len(found) == 1 else found


def _as_result(answer: idempotency.Result) -> ExecutionResult:
    errors = [
        GraphQLError(error.get("message", ""), path=error.get("path"), extensions=error.get("extensions"))
        for error in answer.get("errors") or ()
    ]
    return ExecutionResult(data=answer.get("data"), errors=errors or None)


async def _once(
    context: object,
    request: tuple[str | None, str | None, object],
    deadline: float,
    run: Callable[[], Awaitable[Any]],
) -> Any:
    """A mutation sent with an Idempotency-Key runs once per person and key
    (`resolvers.core.idempotency`); without one, it just runs."""
    key = idempotency.requested_key.get()
    if key is None or not isinstance(context, Context) or context.claims is None:
        return await run()
    try:
        key = idempotency.check_key(key)
    except ApiError as error:
        return ExecutionResult(
            data=None, errors=[GraphQLError(error.message, extensions={"code": error.code})]
        )

    async def attempt(_: idempotency.Attempt) -> idempotency.Result:
        result = await run()
        if not isinstance(result, ExecutionResult):
            return {
                "data": None,
                "errors": [{"message": "not one result", "extensions": {"code": "INTERNAL_SERVER_ERROR"}}],
            }
        return {"data": result.data, "errors": [error.formatted for error in result.errors or ()]}

    try:
        answer = await idempotency.run_once(
            context.table,
            context.claims.sub,
            key,
            idempotency.request_hash(*request),
            deadline_seconds=deadline,
            run=attempt,
        )
    except ApiError as error:
        return ExecutionResult(
            data=None,
            errors=[GraphQLError(error.message, extensions={"code": error.code, **error.extensions})],
        )
    return _as_result(answer)


class MiFamiliasSchema(strawberry.Schema):
    """Queries and mutations run within the operation deadline
    (`MIFAMILIAS_OPERATION_DEADLINE_SECONDS`) on every transport; past it, one
    is stopped and answered with a clear error, and its fields stop running
    (`schema.deadline`). Writes are conditional or
    transactional, so one stopped between two writes leaves each write whole.
    A subscription's life has no deadline (the cost limit bounds each event)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Operations run again without the extensions' machinery (schema.prepared);
        # not where tracing is on, whose spans hang on the extension hooks.
        extensions = [e if isinstance(e, type) else type(e) for e in self.extensions]
        self.prepared = None if any(issubclass(e, Tracing) for e in extensions) else PreparedOperations()
        self._counted = any(issubclass(e, OperationMetrics) for e in extensions)

    async def execute(
        self,
        query: str | None,
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        allowed_operation_types: Iterable[OperationType] | None = None,
        operation_extensions: dict[str, Any] | None = None,
    ) -> ExecutionResult:
        # Plain HTTP (and in-process callers).
        arguments = (
            query,
            variable_values,
            context_value,
            root_value,
            operation_name,
            allowed_operation_types,
            operation_extensions,
        )

        def once() -> Awaitable[ExecutionResult]:
            return self._execute_once(arguments)

        deadline = _deadline(context_value)
        if deadline is None:
            return await once()
        writes = _writes(query, operation_name)
        request = (query, operation_name, variable_values)
        try:
            with running_within(deadline):
                async with asyncio.timeout(deadline):
                    if writes:
                        result: ExecutionResult = await _once(context_value, request, deadline, once)
                        return result
                    return await once()
        except (TimeoutError, DeadlinePassed):
            return _stopped(deadline, context_value, writes=writes)

    async def _execute_once(self, arguments: tuple[Any, ...]) -> ExecutionResult:
        """One run (`arguments` as `execute` takes them): prepared when the
        document is (`schema.prepared`), else Strawberry's with every extension."""
        query, variables, context, root_value, operation_name, allowed, operation_extensions = arguments
        table = self.prepared
        if table is not None and isinstance(context, Context):
            found = table.find(
                query, operation_name, context, frozenset(allowed or DEFAULT_ALLOWED_OPERATION_TYPES)
            )
            if found is not None and found.operation_type in prepared.RUNNABLE:
                table.runs += 1
                call = prepared.Call(query, context, variables, root_value, operation_extensions)
                return await prepared.run(self, found, call, counted=self._counted)
        return await super().execute(*arguments)

    async def stream(
        self,
        query: str | None,
        variable_values: dict[str, Any] | None = None,
        context_value: Any | None = None,
        root_value: Any | None = None,
        operation_name: str | None = None,
        operation_extensions: dict[str, Any] | None = None,
        allowed_operation_types: Iterable[OperationType] | None = None,
    ) -> Any:
        # WebSockets, SSE and multipart: one result for a query or mutation,
        # events for a subscription (prepared when its document is).
        table = self.prepared
        if table is not None and isinstance(context_value, Context):
            allowed = frozenset(allowed_operation_types or DEFAULT_ALLOWED_OPERATION_TYPES)
            found = table.find(query, operation_name, context_value, allowed)
            if found is not None and found.operation_type is OperationType.SUBSCRIPTION:
                table.runs += 1
                call = prepared.Call(
                    cast(str, query), context_value, variable_values, root_value, operation_extensions
                )
                return prepared.stream(self, found, call, counted=self._counted)
        results = await super().stream(
            query,
            variable_values,
            context_value,
            root_value,
            operation_name,
            operation_extensions,
            allowed_operation_types,
        )
        deadline = _deadline(context_value)
        if deadline is None or names_subscription(query, operation_name):
            return results
        writes = _writes(query, operation_name)
        request = (query, operation_name, variable_values)
        return _within(results, deadline, context_value, writes=writes, request=request)

    def create_extensions_runner(self, execution_context: Any, extensions: Any) -> Any:
        return HooksFoundOnce(execution_context=execution_context, extensions=extensions)

    def process_errors(self, errors: Any, execution_context: Any = None) -> None:
        # ContractErrors logs what is unexpected, with the request id; the
        # rest (bad input, refusals) is the client's business, not a log line.
        return None


def build_schema(*, metrics: bool = True, tracing: bool = False) -> strawberry.Schema:
    """The schema; `metrics` and `tracing` add their extensions (nothing of
    them runs in a schema built without)."""
    observe: list[Any] = [OperationMetrics if metrics else OperationLog]
    if tracing:
        observe.append(Tracing)
    built = MiFamiliasSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        # The read rule on every object that wraps a record (schema.guard); a
        # subscription event's answer executed once for the subscribers alike
        # (schema.multiplex); a query's fields stop at its deadline (schema.deadline).
        execution_context_class=StoppingExecutionContext,
        extensions=[
            # First: they time the hooks of the others, and see the coded errors.
            *observe,
            ContractErrors,
            CachePolicy,
            FreshLoaders,
            IntrospectionGate,
            SignedIn,
            QueryCost,
            # After every check that can refuse the operation before it runs.
            RegisterPersisted,
            # Instances, shared by every operation: they only add validation rules.
            QueryDepthLimiter(max_depth=MAX_DEPTH),
            MaxAliasesLimiter(max_alias_count=MAX_ALIASES),
            MaxTokensLimiter(max_token_count=MAX_TOKENS),
            DocumentCache,
            # Last: it sees the document once every rule has validated it.
            Prepare,
        ],
    )
    call_directly(built)  # graphql-core calls the resolvers Strawberry would only pass through
    return built


schema = build_schema()


@functools.cache
def schema_for(*, metrics: bool, tracing: bool) -> strawberry.Schema:
    """The schema an app with these settings serves: built once per process."""
    if metrics and not tracing:
        return schema
    return build_schema(metrics=metrics, tracing=tracing)
