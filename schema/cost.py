"""What an operation may cost, estimated before anything runs.

Depth, alias and token limits bound a document's shape; this bounds its work.
The estimate counts the objects the answer can hold, the way Apollo's demand
control (`@listSize`, `@cost`) and Ariadne's cost validator do: every object
field costs 1 for each time it can appear, and a list multiplies what is below
it by its size. A connection's size is its `first` argument (or the default),
a plain list's size is the bound the domain sets (`ASSUMED_SIZES`, else
`DEFAULT_LIST_SIZE`). Scalars are free; introspection is free.

An operation over `MIFAMILIAS_MAX_QUERY_COST` is refused with BAD_USER_INPUT and
`extensions.cost = {estimated, limit}`. Variables are bounded too: no list of
more than `MAX_LIST_ITEMS` items, but for the few the domain bounds itself
(`LONG_LISTS`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    GraphQLType,
    InlineFragmentNode,
    IntValueNode,
    SelectionSetNode,
    VariableNode,
)
from graphql.utilities import get_operation_ast
from strawberry.extensions import SchemaExtension

from resolvers.core.context import Context
from resolvers.core.errors import BadInput
from resolvers.core.pagination import MAX_PAGE
from resolvers.domain.capsules import MAX_RECIPIENTS
from resolvers.domain.tags import MAX_TAGS
from schema.guard import refuse

DEFAULT_LIST_SIZE = 20
MAX_LIST_ITEMS = 100
# Lists the domain bounds higher, by the input field that holds them: a capsule
# may go to the whole family.
LONG_LISTS = {"recipientIds": MAX_RECIPIENTS}
# Plain lists whose size the domain bounds ("Type.field" -> most items).
ASSUMED_SIZES = {
    "Content.reactions": 20,
    "Content.tags": 5 * MAX_TAGS,
    "Mutation.setTags": MAX_TAGS,
    "Query.myFamilies": DEFAULT_LIST_SIZE,
}


def _unwrap(type_: GraphQLType) -> tuple[GraphQLType, bool]:
    is_list = False
    while isinstance(type_, GraphQLNonNull | GraphQLList):
        is_list = is_list or isinstance(type_, GraphQLList)
        type_ = type_.of_type
    return type_, is_list


class Estimate:
    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, FragmentDefinitionNode],
        variables: Mapping[str, Any],
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables

    def _first(self, node: FieldNode, field: Any) -> int | None:
        """The page size a `first` argument asks for, or None when there is none."""
        if "first" not in field.args:
            return None
        value: Any = field.args["first"].default_value
        for argument in node.arguments or ():
            if argument.name.value != "first":
                continue
            if isinstance(argument.value, IntValueNode):
                value = int(argument.value.value)
            elif isinstance(argument.value, VariableNode):
                value = self.variables.get(argument.value.name.value, value)
        if not isinstance(value, int) or value < 0:
            return DEFAULT_LIST_SIZE
        return min(value, MAX_PAGE)

    def selection(
        self, selection_set: SelectionSetNode, parent: GraphQLObjectType, times: int, page: int | None
    ) -> int:
        """The cost of a selection that appears `times` times; `page` sizes the
        list fields of a connection (its `edges`)."""
        total = 0
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                total += self.field(selection, parent, times, page)
            elif isinstance(selection, InlineFragmentNode):
                total += self.selection(selection.selection_set, parent, times, page)
            elif isinstance(selection, FragmentSpreadNode):
                fragment = self.fragments.get(selection.name.value)
                if fragment is not None:
                    total += self.selection(fragment.selection_set, parent, times, page)
        return total

    def field(self, node: FieldNode, parent: GraphQLObjectType, times: int, page: int | None) -> int:
        name = node.name.value
        if name.startswith("__") or name not in parent.fields:
            return 0
        definition = parent.fields[name]
        inner, is_list = _unwrap(definition.type)
        if not isinstance(inner, GraphQLObjectType) or node.selection_set is None:
            return 0
        first = self._first(node, definition)
        size = 1
        if is_list and first is not None:
            # A plain list with its own page size (Capsule.recipients).
            size, first = first, None
        elif is_list:
            size = page if page is not None else ASSUMED_SIZES.get(f"{parent.name}.{name}", DEFAULT_LIST_SIZE)
        count = times * size
        return count + self.selection(node.selection_set, inner, count, first)


def estimate_cost(
    schema: GraphQLSchema, document: Any, operation_name: str | None, variables: Mapping[str, Any]
) -> int:
    operation = get_operation_ast(document, operation_name)
    if operation is None:
        return 0
    root = {
        "query": schema.query_type,
        "mutation": schema.mutation_type,
        "subscription": schema.subscription_type,
    }[operation.operation.value]
    if root is None:
        return 0
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    return Estimate(schema, fragments, variables).selection(operation.selection_set, root, 1, None)


def _lists(value: Any, path: str) -> Iterator[tuple[str, int]]:
    if isinstance(value, list):
        yield path, len(value)
        for item in value[: max(MAX_LIST_ITEMS, *LONG_LISTS.values())]:
            yield from _lists(item, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _lists(item, f"{path}.{key}")


class QueryCost(SchemaExtension):
    def on_execute(self) -> Iterator[None]:
        execution_context = self.execution_context
        context = execution_context.context
        document = execution_context.graphql_document
        if isinstance(context, Context) and document is not None and execution_context.result is None:
            refusal = self._refusal(context, document)
            if refusal is not None:
                refuse(execution_context, refusal)
        yield

    def _refusal(self, context: Context, document: Any) -> GraphQLError | None:
        variables = self.execution_context.variables or {}
        for name, value in variables.items():
            for path, length in _lists(value, f"${name}"):
                bound = LONG_LISTS.get(path.rsplit(".", 1)[-1].lstrip("$"), MAX_LIST_ITEMS)
                if length > bound:
                    error = BadInput(f"{path} holds {length} items; at most {bound} are accepted")
                    return GraphQLError(error.message, original_error=error)
        limit = context.services.settings.max_query_cost
        schema = self.execution_context.schema._schema
        estimated = estimate_cost(schema, document, self.execution_context.operation_name, variables)
        if estimated <= limit:
            return None
        message = (
            f"this operation could cost {estimated}, over the limit of {limit}: "
            "ask for smaller pages (first) or fewer nested lists"
        )
        return GraphQLError(
            message, extensions={"code": "BAD_USER_INPUT", "cost": {"estimated": estimated, "limit": limit}}
        )
