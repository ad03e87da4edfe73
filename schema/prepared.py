"""Prepared operations: a document already parsed and validated runs again
without Strawberry's per-operation machinery.

For every operation Strawberry makes a fresh instance of each of the schema's
extensions, and a context manager for each of their hooks, phase by phase;
on `{ me { id } }` over HTTP that machinery cost more than the execution.
Clients send a few fixed documents: once one has parsed and validated for a
signed-in request (and asks nothing of introspection), what is left to decide
when it comes again depends on the request alone. So a prepared document's
next runs take the same steps the extensions take, as the same functions and
in the same order, without the extension objects:

1. fresh loaders, and the operation's name in the log context;
2. the request counted; the cost of these variables checked, and taken from
   the viewer's bucket (`schema.cost.admit`);
3. graphql-core's execution, with the schema's execution context (the read
   guard, the deadline, the turns) exactly as Strawberry calls it;
4. every error relabelled with its contract code (`schema.errors`), counted
   by code; a GET answer's cache headers (`schema.caching`); the actual cost
   counted and the unused points given back (`schema.cost.settle`).

A subscription is prepared the same way (`stream`), and there it saves
memory as well as time: Strawberry keeps an operation's extension instances,
their hooks' generators and its exit stacks for as long as the operation
runs, which for a subscription is the life of its socket.

Anything else goes Strawberry's way: a document not yet prepared, a request
without a valid token, a persisted query still to be stored, an operation
type the transport does not allow, and every operation of a schema that
traces (its spans hang on the extension hooks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

from cachetools import LRUCache
from graphql import DocumentNode, GraphQLError, execute, subscribe, validate
from graphql import ExecutionResult as GraphQLExecutionResult
from graphql.validation import NoSchemaIntrospectionCustomRule
from strawberry.extensions import SchemaExtension
from strawberry.types import ExecutionResult

from resolvers.core import logs
from resolvers.core.caches import lru
from resolvers.core.context import Context
from resolvers.core.metrics import Metrics
from schema import cost
from schema.caching import set_cache_headers
from schema.documents import MAX_CACHED_CHARS, MAX_ENTRIES
from schema.errors import relabel_all
from schema.observability import count_errors, label_of
from schema.strawberry_internals import (
    OperationType,
    PreExecutionError,
    await_maybe,
    core_schema,
    optimized_is_awaitable,
    provided_operation_name,
)

RUNNABLE = (OperationType.QUERY, OperationType.MUTATION)  # by `run`
PREPARED = (*RUNNABLE, OperationType.SUBSCRIPTION)  # `stream` runs the last


@dataclass(frozen=True)
class Prepared:
    """A document that parsed and validated, and the operation in it that a
    request's `operationName` (or its absence) picks."""

    document: DocumentNode
    name: str | None  # the operation's own name, as the metrics and logs know it
    operation_type: OperationType


class PreparedOperations:
    """Prepared operations by (document text, operationName sent), an LRU
    bounded as the document cache is: only signed-in requests add to it, and
    no text longer than `MAX_CACHED_CHARS`."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: LRUCache[tuple[str, str | None], Prepared] = lru(max_entries)
        self.runs = 0  # operations run prepared (tests read it)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def add(self, query: str, operation_name: str | None, prepared: Prepared) -> None:
        self._entries[query, operation_name] = prepared

    def find(
        self,
        query: object,
        operation_name: object,
        context: Context,
        allowed: Collection[OperationType],
    ) -> Prepared | None:
        """The prepared operation this request may run, or None when it goes
        Strawberry's way."""
        if not isinstance(query, str) or not isinstance(operation_name, str | None):
            return None
        found = self._entries.get((query, operation_name))
        if (
            found is None
            or found.operation_type not in allowed
            or context.signed_in_error() is not None
            or query in context.documents_to_register
        ):
            return None
        return found


class Prepare(SchemaExtension):
    """Keeps a document that has just passed validation for a signed-in
    request as prepared, for its next run (the schema's `prepared`, if any).
    Introspection is never prepared: its gate and its exemption from
    signing in are the extensions' to apply."""

    def on_validate(self) -> Iterator[None]:
        yield
        execution_context = self.execution_context
        table = getattr(execution_context.schema, "prepared", None)
        document = execution_context.graphql_document
        query = execution_context.query
        context = execution_context.context
        if (
            not isinstance(table, PreparedOperations)
            or document is None
            or execution_context.pre_execution_errors
            or not isinstance(query, str)
            or len(query) > MAX_CACHED_CHARS
            or not isinstance(context, Context)
            or context.signed_in_error() is not None
        ):
            return
        operation_type = execution_context.operation_type
        graphql_schema = core_schema(execution_context.schema)
        if operation_type not in PREPARED or validate(
            graphql_schema, document, [NoSchemaIntrospectionCustomRule]
        ):
            return
        # The name as the request sent it (None picks the document's only
        # operation): what the next request is looked up by.
        sent = provided_operation_name(execution_context)
        table.add(
            query,
            sent,
            Prepared(document, execution_context.operation_name, operation_type),
        )


@dataclass(frozen=True)
class Call:
    """What one request brings to a prepared operation."""

    query: str
    context: Context
    variables: dict[str, Any] | None
    root_value: Any
    operation_extensions: dict[str, Any] | None


def _begin(prepared: Prepared, call: Call, *, counted: bool) -> tuple[Metrics | None, str]:
    """The first steps of every prepared run: fresh loaders, the operation's
    name in the log context, the request counted (`counted`: the schema
    counts operations in its metrics). The metrics, if counted, and the
    operation's label in them."""
    context = call.context
    metrics = context.services.metrics if counted and context.services.metrics.enabled else None
    label = label_of(metrics, prepared.name, prepared.document, context, call.query) if metrics else ""
    context.forget_loaders()
    logs.set_operation(prepared.name)
    if metrics is not None:
        # Neither parsed nor validated again: those phases took nothing.
        metrics.graphql_operation(label, prepared.operation_type.value, {"parse": 0.0, "validate": 0.0})
    return metrics, label


def _coerced(error: Exception) -> GraphQLError:
    """What leaves an operation as an exception, as Strawberry answers it."""
    return error if isinstance(error, GraphQLError) else GraphQLError(str(error), original_error=error)


async def run(schema: Any, prepared: Prepared, call: Call, *, counted: bool) -> ExecutionResult:
    """A prepared operation's run: what the schema's extensions would do
    around its execution, in their order."""
    metrics, label = _begin(prepared, call, counted=counted)
    context, variables = call.context, call.variables
    graphql_schema = core_schema(schema)
    try:
        started = time.perf_counter()
        try:
            admitted = await cost.admit(
                context, graphql_schema, prepared.document, prepared.name, variables, prepared.operation_type
            )
            if isinstance(admitted, GraphQLError):
                result: GraphQLExecutionResult = GraphQLExecutionResult(data=None, errors=[admitted])
            else:
                result = await await_maybe(
                    execute(
                        graphql_schema,
                        prepared.document,
                        root_value=call.root_value,
                        variable_values=variables,
                        operation_name=prepared.name,
                        context_value=context,
                        is_awaitable=cast(Any, optimized_is_awaitable),
                        executor_class=schema.execution_context_class,
                        operation_extensions=call.operation_extensions,
                    )
                )
        finally:
            if metrics is not None:
                metrics.graphql_phase_done(label, "execute", time.perf_counter() - started)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        # As Strawberry answers what leaves an operation as an exception.
        if metrics is not None:
            count_errors(metrics, label, [error])
        return ExecutionResult(data=None, errors=[_coerced(error)], extensions={})
    relabel_all(result, context.request_id)
    if metrics is not None:
        count_errors(metrics, label, result.errors)
    set_cache_headers(context, introspection=False)
    extensions = (
        {}
        if isinstance(admitted, GraphQLError)
        else cost.settle(context, admitted, graphql_schema, prepared.document, prepared.name, result.data)
    )
    return ExecutionResult(data=result.data, errors=result.errors, extensions=extensions)


async def stream(
    schema: Any, prepared: Prepared, call: Call, *, counted: bool
) -> AsyncGenerator[ExecutionResult, None]:
    """A prepared subscription's stream: what the extensions do around
    Strawberry's, in their order. The stream is counted when it starts; its
    cost is checked against the limit then, and charged per event by its
    resolver; every result's errors are relabelled and counted. As in
    Strawberry's stream, what graphql-core refuses before the source stream
    exists (variables that do not coerce, a resolver's refusal) is a
    pre-execution error, the protocol's `error` message."""
    metrics, label = _begin(prepared, call, counted=counted)
    context, variables = call.context, call.variables

    def answer(result: GraphQLExecutionResult, *, before: bool = False) -> ExecutionResult:
        relabel_all(result, context.request_id)
        if metrics is not None:
            count_errors(metrics, label, result.errors)
        made = PreExecutionError if before else ExecutionResult
        return made(data=result.data, errors=result.errors, extensions={})

    def failed(error: Exception) -> ExecutionResult:
        return answer(GraphQLExecutionResult(data=None, errors=[_coerced(error)]))

    graphql_schema = core_schema(schema)
    try:
        admitted = await cost.admit(
            context, graphql_schema, prepared.document, prepared.name, variables, prepared.operation_type
        )
    except asyncio.CancelledError:
        raise
    except Exception as error:
        yield failed(error)
        return
    if isinstance(admitted, GraphQLError):
        # As the cost extension refuses it: the stream's one result, before its
        # execution phase starts.
        yield answer(GraphQLExecutionResult(data=None, errors=[admitted]))
        return
    started = time.perf_counter()
    source: AsyncIterator[GraphQLExecutionResult] | GraphQLExecutionResult
    try:
        source = await await_maybe(
            subscribe(
                graphql_schema,
                prepared.document,
                root_value=call.root_value,
                context_value=context,
                variable_values=variables,
                operation_name=prepared.name,
                executor_class=schema.execution_context_class,
                operation_extensions=call.operation_extensions,
            )
        )
    except asyncio.CancelledError:
        raise
    except Exception as error:
        yield failed(error)
        return
    finally:
        if metrics is not None:
            metrics.graphql_phase_done(label, "execute", time.perf_counter() - started)
    if isinstance(source, GraphQLExecutionResult):
        yield answer(source, before=True)
        return
    try:
        async with aclosing(cast(AsyncGenerator[GraphQLExecutionResult, None], source)) as events:
            async for event in events:
                cost.settle_event(graphql_schema, prepared.document, prepared.name, event.data)
                yield answer(event)
    except Exception as error:  # graphql-core does not catch what an event's execution raises
        yield failed(error)
