"""Strawberry's internals: everything of Strawberry's we use beyond its public API.

Strawberry's public API is what its packages export (docs/decisions.md,
"Strawberry's public API, and its internals in one module"). What we need
past it is here and nowhere else: the names of its non-public modules,
re-exported, and its private attributes (a schema's graphql-core schema, an
`Info`'s graphql-core info, ...) behind small typed functions. The rest of
the code names these, never Strawberry's modules or underscored names:
pyproject.toml's import-linter contract refuses the modules to every other
module of ours, and tests/test_layers.py the private names.

Each use is checked against the installed Strawberry by
tests/test_strawberry_internals.py, which names this file when an upgrade
changes one; pyproject.toml holds Strawberry and graphql-core to the minor
versions this was written for (`./dev upgrade` re-pins within them and runs
every test).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from graphql import GraphQLField, GraphQLResolveInfo, GraphQLSchema
from graphql.validation import ASTValidationRule
from strawberry.execution import optimized_is_awaitable
from strawberry.extensions import LifecycleStep
from strawberry.extensions.context import (
    ExecutingContextManager,
    ExtensionContextManagerBase,
    OperationContextManager,
    ParsingContextManager,
    StreamResultContextManager,
    ValidationContextManager,
    WrappedHook,
)
from strawberry.extensions.max_aliases import create_validator as _aliases_validator
from strawberry.extensions.query_depth_limiter import create_validator as _depth_validator
from strawberry.extensions.runner import SchemaExtensionsRunner
from strawberry.extensions.tracing import OpenTelemetryExtension
from strawberry.http.async_base_view import AsyncWebSocketAdapter
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.http.streaming import HTTPStreamTransport, MultipartSubscriptionTransport, SSETransport
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.schema.schema import (
    DEFAULT_ALLOWED_OPERATION_TYPES,
    StrawberryGraphQLCoreExecutionContext,
    validate_document,
)
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types.execution import PreExecutionError
from strawberry.types.field import StrawberryField
from strawberry.types.graphql import OperationType
from strawberry.utils.await_maybe import await_maybe

if TYPE_CHECKING:
    import strawberry
    from opentelemetry.trace import Span, Tracer
    from strawberry.types import ExecutionContext, Info

__all__ = [
    "DEFAULT_ALLOWED_OPERATION_TYPES",
    "REQUEST_ERRORS",
    "AsyncWebSocketAdapter",
    "BaseGraphQLTransportWSHandler",
    "BaseGraphQLWSHandler",
    "ExecutingContextManager",
    "ExtensionContextManagerBase",
    "HTTPStreamTransport",
    "MultipartSubscriptionTransport",
    "OpenTelemetryBase",
    "OperationContextManager",
    "OperationType",
    "ParsingContextManager",
    "PreExecutionError",
    "SSETransport",
    "SchemaExtensionsRunner",
    "StrawberryField",
    "StrawberryGraphQLCoreExecutionContext",
    "StreamResultContextManager",
    "ValidationContextManager",
    "WebSocketDisconnected",
    "WrappedHook",
    "aliases_rule",
    "await_maybe",
    "core_schema",
    "depth_rule",
    "has_exception_handlers",
    "info_maker",
    "optimized_is_awaitable",
    "provided_operation_name",
    "raw_info",
    "strawberry_field",
    "validate_document",
]

# What the schema raises for a request that names no operation it may run: an
# unknown `operationName`, or a type the transport does not carry.
REQUEST_ERRORS = (CannotGetOperationTypeError, InvalidOperationTypeError)


# Private attributes -------------------------------------------------------------------


def core_schema(schema: strawberry.Schema) -> GraphQLSchema:
    """The graphql-core schema a Strawberry schema built and executes with."""
    return schema._schema


def raw_info(info: Info[Any, Any]) -> GraphQLResolveInfo[Any]:
    """The graphql-core resolve info a Strawberry `Info` wraps."""
    return info._raw_info


def info_maker(
    schema: strawberry.Schema, field: StrawberryField
) -> Callable[[GraphQLResolveInfo[Any]], Info[Any, Any]]:
    """Makes the `Info` (the schema's `info_class`) that Strawberry would give
    `field`'s resolver, from graphql-core's resolve info."""
    return functools.partial(schema.config.info_class, _field=field)


def has_exception_handlers(schema: strawberry.Schema, field: StrawberryField) -> bool:
    """Whether any of the schema's exception handlers may answer for `field`."""
    return bool(schema.schema_converter._get_field_exception_handlers(field))


def strawberry_field(graphql_field: GraphQLField) -> StrawberryField | None:
    """The Strawberry field a graphql-core field was built from, if any."""
    found = (graphql_field.extensions or {}).get(GraphQLCoreConverter.DEFINITION_BACKREF)
    return found if isinstance(found, StrawberryField) else None


def provided_operation_name(execution_context: ExecutionContext) -> str | None:
    """The `operationName` the request sent (None when it sent none), where
    `execution_context.operation_name` falls back on the document's only
    operation."""
    return getattr(execution_context, "_provided_operation_name", execution_context.operation_name)


# Validation rules of Strawberry's limiting extensions ---------------------------------


def depth_rule(max_depth: int) -> type[ASTValidationRule]:
    """`QueryDepthLimiter(max_depth=...)`'s validation rule, on its own."""
    return _depth_validator(max_depth, None)


def aliases_rule(max_aliases: int) -> type[ASTValidationRule]:
    """`MaxAliasesLimiter(max_alias_count=...)`'s validation rule, on its own."""
    return _aliases_validator(max_aliases)


# Tracing ---------------------------------------------------------------------------------


class OpenTelemetryBase(OpenTelemetryExtension):
    """Strawberry's `OpenTelemetryExtension`, built around a tracer given to
    it (its own constructor asks OpenTelemetry for one per operation), with no
    argument filter of its own. Its hooks read the tracer and the operation's
    span from its private state; these set them."""

    def __init__(self, tracer: Tracer, *, execution_context: ExecutionContext | None = None) -> None:
        self._arg_filter = None
        self._span_holder = {}
        self._tracer = tracer
        if execution_context is not None:
            self.execution_context = execution_context

    @property
    def tracer(self) -> Tracer:
        return self._tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def hold_operation_span(self, span: Span) -> None:
        """The operation's span, the parent of the other hooks' spans."""
        self._span_holder[LifecycleStep.OPERATION] = span
