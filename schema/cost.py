"""What an operation may cost, estimated before anything runs.

Depth, alias and token limits bound a document's shape; this bounds its work.
The estimate counts the objects the answer can hold, the way Apollo's demand
control (`@listSize`, `@cost`) and Ariadne's cost validator do: every object
field costs 1 for each time it can appear, and a list multiplies what is below
it by its size. A connection's size is its `first` argument, a plain list's
size is the bound the domain sets (`ASSUMED_SIZES`, else `DEFAULT_LIST_SIZE`).
A scalar field costs 1 where its resolver awaits something (a signed URL, a
per-viewer read, the store: `work_fields` finds them from the schema, so a new
one is counted without being listed); other scalars and introspection are free.

Arguments are read the way execution will read them: variables coerced by
graphql-core with the operation's defaults applied (`100.0` is the Int 100, a
declared default counts when the variable is not sent), literals and field
defaults by `get_argument_values`. A size that cannot be known that way counts
the largest page, never the default.

An operation over `MIFAMILIAS_MAX_QUERY_COST` is refused with BAD_USER_INPUT and
`extensions.cost = {estimated, limit}`. With a budget (`MIFAMILIAS_COST_BUDGET`),
a query or mutation that passes is charged its estimate (at least 1) before it
runs, and a subscription each event it delivers; past the budget, RATE_LIMITED
with `retryAfter` and `rateLimit` (GitHub's model: `Query.rateLimit` answers the
same state). Variables are bounded too: no list of
more than `MAX_LIST_ITEMS` items, but for the few the domain bounds itself
(`LONG_LISTS`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator, Mapping
from contextvars import ContextVar
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
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
)
from graphql.execution.values import VariableValues, get_argument_values, get_variable_values
from graphql.utilities import get_operation_ast
from strawberry.extensions import SchemaExtension
from strawberry.types.graphql import OperationType

from resolvers.core.context import Context
from resolvers.core.errors import ApiError, BadInput
from resolvers.core.pagination import MAX_PAGE
from resolvers.core.ratelimit import BudgetState
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


@functools.cache
def work_fields(schema: GraphQLSchema) -> frozenset[str]:
    """ "Type.field" of every field whose resolver is a coroutine: it awaits
    something (the store, the blob store's signer) each time it appears."""
    found = set()
    for type_ in schema.type_map.values():
        if not isinstance(type_, GraphQLObjectType) or type_.name.startswith("__"):
            continue
        for name, field in type_.fields.items():
            definition = (field.extensions or {}).get("strawberry-definition")
            if definition is not None and getattr(definition, "is_async", False):
                found.add(f"{type_.name}.{name}")
    return frozenset(found)


class Estimate:
    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, FragmentDefinitionNode],
        variables: VariableValues | None,
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables
        self.work = work_fields(schema)

    def _first(self, node: FieldNode, field: Any) -> int | None:
        """The page size a `first` argument asks for, or None when there is none."""
        if "first" not in field.args:
            return None
        if self.variables is None and any(
            argument.name.value == "first" and isinstance(argument.value, VariableNode)
            for argument in node.arguments or ()
        ):
            return MAX_PAGE  # any variables: the page could be the largest
        try:
            value = get_argument_values(field, node, self.variables).get("first")
        except GraphQLError:
            return 0  # execution refuses the field the same way: nothing below it runs
        if value is None:  # an explicit null means the field's default
            value = field.args["first"].default_value
        if not isinstance(value, int) or not 1 <= value <= MAX_PAGE:
            return MAX_PAGE
        return value

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
            return times if f"{parent.name}.{name}" in self.work else 0
        first = self._first(node, definition)
        size = 1
        if is_list and first is not None:
            # A plain list with its own page size (Capsule.recipients).
            size, first = first, None
        elif is_list:
            size = page if page is not None else ASSUMED_SIZES.get(f"{parent.name}.{name}", DEFAULT_LIST_SIZE)
        count = times * size
        return count + self.selection(node.selection_set, inner, count, first)


def coerced_variables(
    schema: GraphQLSchema, operation: OperationDefinitionNode, variables: Mapping[str, Any] | None
) -> VariableValues | None:
    """The variables as execution will see them, or None when execution will
    refuse them (and so run nothing)."""
    coerced = get_variable_values(
        schema, operation.variable_definitions or (), dict(variables or {}), max_errors=1
    )
    return None if isinstance(coerced, list) else coerced


def estimate_cost(
    schema: GraphQLSchema, document: Any, operation_name: str | None, variables: Mapping[str, Any] | None
) -> int:
    """The operation's cost with these variables; with None, the most any
    variables could make it cost (a document checked before anyone sends it)."""
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
    coerced = None
    if variables is not None:
        coerced = coerced_variables(schema, operation, variables)
        if coerced is None:
            return 0  # execution refuses the variables before anything runs
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    return Estimate(schema, fragments, coerced).selection(operation.selection_set, root, 1, None)


def event_cost(info: Any) -> int:
    """What one event of the subscription `info` resolves costs: its selection,
    estimated with the operation's coerced variables (at least 1)."""
    raw = info._raw_info
    root = raw.schema.subscription_type
    estimate = Estimate(raw.schema, raw.fragments, raw.variable_values)
    return max(1, estimate.selection(raw.operation.selection_set, root, 1, None))


def _lists(value: Any, path: str) -> Iterator[tuple[str, int]]:
    if isinstance(value, list):
        yield path, len(value)
        for item in value[: max(MAX_LIST_ITEMS, *LONG_LISTS.values())]:
            yield from _lists(item, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _lists(item, f"{path}.{key}")


# What the running operation was charged, for `Query.rateLimit`.
charged: ContextVar[BudgetState | None] = ContextVar("charged", default=None)


async def refusal(
    context: Context,
    schema: GraphQLSchema,
    document: Any,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    operation_type: OperationType,
) -> GraphQLError | None:
    """Why the operation may not run (too long a list in its variables, a cost
    over the limit, the viewer's budget spent), or None: then its points are
    spent (a subscription pays per event delivered instead)."""
    variables = variables or {}
    for name, value in variables.items():
        for path, length in _lists(value, f"${name}"):
            bound = LONG_LISTS.get(path.rsplit(".", 1)[-1].lstrip("$"), MAX_LIST_ITEMS)
            if length > bound:
                error = BadInput(f"{path} holds {length} items; at most {bound} are accepted")
                return GraphQLError(error.message, original_error=error)
    limit = context.services.settings.max_query_cost
    estimated = estimate_cost(schema, document, operation_name, variables)
    if estimated <= limit:
        return await _charge(context, estimated, operation_type)
    message = (
        f"this operation could cost {estimated}, over the limit of {limit}: "
        "ask for smaller pages (first) or fewer nested lists"
    )
    return GraphQLError(
        message, extensions={"code": "BAD_USER_INPUT", "cost": {"estimated": estimated, "limit": limit}}
    )


async def _charge(context: Context, estimated: int, operation_type: OperationType) -> GraphQLError | None:
    """Spends the operation's points of the viewer's budget; subscriptions
    pay per event delivered instead."""
    rates = context.services.rates
    if not rates.budget.enabled or context.signed_in_error() is not None:
        return None
    if operation_type is OperationType.SUBSCRIPTION:
        return None
    try:
        state = await rates.budget.charge(
            f"user:{await context.viewer_id()}", max(1, estimated), context.services.now()
        )
    except ApiError as error:
        return GraphQLError(error.message, extensions={"code": error.code, **error.extensions})
    charged.set(state)
    return None


class QueryCost(SchemaExtension):
    async def on_execute(self) -> AsyncIterator[None]:
        execution_context = self.execution_context
        context = execution_context.context
        document = execution_context.graphql_document
        if isinstance(context, Context) and document is not None and execution_context.result is None:
            refused = await refusal(
                context,
                execution_context.schema._schema,
                document,
                execution_context.operation_name,
                execution_context.variables,
                execution_context.operation_type,
            )
            if refused is not None:
                refuse(execution_context, refused)
        yield
