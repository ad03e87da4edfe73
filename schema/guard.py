"""Where the read rule meets the schema: every operation and every object.

`SignedIn` refuses an operation without a valid, unexpired token before any
resolver runs, so nothing touches the store and no answer tells an existing id
from a missing one. Only introspection is open to everyone.

`GuardedExecutionContext` decides the read rule where a value becomes a GraphQL
object: graphql-core completes every object value, whichever field returned
it, in `complete_object_value`, before any field of that object runs. An object
that wraps a store record (its `item`) is completed only when
`resolvers.domain.access.may_read` allows the record; otherwise the field that
returned it answers NOT_FOUND. Resolvers already filter what they return; this
is what makes a field added tomorrow, or a path that forgets, answer NOT_FOUND
instead of leaking, without a hook on every field: scalar fields stay on
graphql-core's default resolver, and the check costs one attribute read per
object (one dict lookup once the operation has a verdict for the record).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    SelectionSetNode,
)
from graphql import ExecutionResult as GraphQLExecutionResult
from graphql.utilities import get_operation_ast
from strawberry.extensions import SchemaExtension

from resolvers.core.context import Context
from resolvers.core.errors import ApiError
from resolvers.domain import access
from schema.strawberry_internals import OperationType, StrawberryGraphQLCoreExecutionContext


def _only_introspection(selection_set: SelectionSetNode, fragments: dict[str, Any], depth: int = 0) -> bool:
    if depth > 20:
        return False
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            if not selection.name.value.startswith("__"):
                return False
        elif isinstance(selection, InlineFragmentNode):
            if not _only_introspection(selection.selection_set, fragments, depth + 1):
                return False
        elif isinstance(selection, FragmentSpreadNode):
            fragment = fragments.get(selection.name.value)
            if fragment is None or not _only_introspection(fragment.selection_set, fragments, depth + 1):
                return False
    return True


def is_introspection(execution_context: Any) -> bool:
    document = execution_context.graphql_document
    if document is None:
        return False
    return document_is_introspection(document, execution_context.operation_name)


def document_is_introspection(document: DocumentNode, operation_name: str | None) -> bool:
    """Whether the operation named (or the only one) is a query of `__schema`,
    `__type` and `__typename` alone."""
    operation = get_operation_ast(document, operation_name)
    if operation is None or operation.operation.value != "query":
        return False
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    return _only_introspection(operation.selection_set, fragments)


def refuse(execution_context: Any, error: GraphQLError) -> None:
    """Answers the operation with `error` instead of running it (from on_execute)."""
    if execution_context.operation_type is OperationType.SUBSCRIPTION:
        raise error  # a subscription's on_execute error becomes its one result
    execution_context.result = GraphQLExecutionResult(data=None, errors=[error])


class SignedIn(SchemaExtension):
    def on_execute(self) -> Iterator[None]:
        execution_context = self.execution_context
        context = execution_context.context
        refusal: ApiError | None = None
        if isinstance(context, Context) and not is_introspection(execution_context):
            refusal = context.signed_in_error()
        if refusal is not None:
            refuse(execution_context, GraphQLError(refusal.message, original_error=refusal))
        yield


class GuardedExecutionContext(StrawberryGraphQLCoreExecutionContext):
    """Strawberry's execution context, with the read rule decided once per
    object that wraps a record."""

    def complete_object_value(
        self,
        return_type: Any,
        field_details_list: Any,
        info: Any,
        path: Any,
        result: Any,
        position_context: Any,
    ) -> Any:
        record = getattr(result, "item", None)
        if record is not None and type(record) in access.GUARDED:
            verdict = access.cached_verdict(self.context_value, record)
            if verdict is None:
                return self._complete_readable(
                    record, return_type, field_details_list, info, path, result, position_context
                )
            if verdict is False:
                raise access.refusal(record)
        return super().complete_object_value(
            return_type, field_details_list, info, path, result, position_context
        )

    async def _complete_readable(
        self,
        record: access.GuardedRecord,
        return_type: Any,
        field_details_list: Any,
        info: Any,
        path: Any,
        result: Any,
        position_context: Any,
    ) -> Any:
        if not await access.may_read(self.context_value, record):
            raise access.refusal(record)
        completed = super().complete_object_value(
            return_type, field_details_list, info, path, result, position_context
        )
        return await completed if self.is_awaitable(completed) else completed
