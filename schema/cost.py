"""What an operation may cost, estimated before anything runs, and what it
really cost, counted from its answer (Shopify's requested and actual cost).

The estimate counts the objects the answer can hold, the way Apollo's demand
control (`@listSize`, `@cost`) and Ariadne's cost validator do: every object
field costs 1 for each time it can appear, and a list multiplies what is below
it by its size. A connection's size is its `first` argument, a plain list's
size is the bound the domain sets (`ASSUMED_SIZES`, else `DEFAULT_LIST_SIZE`),
and `myFamilies` is sized by the families the viewer is really in (read once,
and kept for its resolver). A scalar field costs 1 where its resolver awaits
something (a signed URL, a per-viewer read, the store: `work_fields` finds them
from the schema, so a new one is counted without being listed); other scalars
and introspection are free. The actual cost counts the same way over the
answer: each object it holds, each work scalar it holds.

Arguments are read the way execution will read them: variables coerced by
graphql-core with the operation's defaults applied (`100.0` is the Int 100, a
declared default counts when the variable is not sent), literals and field
defaults by `get_argument_values`. A size that cannot be known that way counts
the largest page, never the default.

An operation over `MIFAMILIAS_MAX_QUERY_COST` is refused with BAD_USER_INPUT,
naming the list that costs most. Each person has a leaky bucket of points
(`MIFAMILIAS_COST_BUDGET`, `MIFAMILIAS_COST_RESTORE_RATE`): a query or mutation
is admitted when its requested cost is in the bucket and takes it before it
runs; once it has run, what it did not use is given back. Every answer says so
in `extensions.cost` with Shopify's names (`requestedQueryCost`,
`actualQueryCost`, `throttleStatus`). A subscription takes each event's cost as
it is delivered. With the bucket empty, RATE_LIMITED with `retryAfter` and
`rateLimit` (GitHub's names: `Query.rateLimit` answers the same state).
Variables are bounded too: no list of more than `MAX_LIST_ITEMS` items, but
for the few the domain bounds itself (`LONG_LISTS`).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

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

from resolvers.core.context import Context
from resolvers.core.errors import ApiError, BadInput
from resolvers.core.pagination import MAX_PAGE
from resolvers.core.ratelimit import BudgetState
from resolvers.domain import families
from resolvers.domain.capsules import MAX_RECIPIENTS
from resolvers.domain.tags import MAX_TAGS
from resolvers.processes import live
from schema.guard import refuse
from schema.strawberry_internals import OperationType, core_schema, raw_info
from store.port import StoreError

log = logging.getLogger("mifamilias.cost")

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
    # Without a viewer to ask (a document checked before anyone sends it).
    "Query.myFamilies": DEFAULT_LIST_SIZE,
}
MY_FAMILIES = "Query.myFamilies"


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
    total = 0

    def __init__(
        self,
        schema: GraphQLSchema,
        fragments: Mapping[str, FragmentDefinitionNode],
        variables: VariableValues | None,
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.variables = variables
        self.work = work_fields(schema)
        self.sizes = {**ASSUMED_SIZES, **(sizes or {})}
        # What each list field costs, itself and all below it ("Type.field").
        self.lists: Counter[str] = Counter()

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
        coordinate = f"{parent.name}.{name}"
        if is_list and first is not None:
            # A plain list with its own page size (Capsule.recipients).
            size, first = first, None
        elif is_list:
            size = page if page is not None else self.sizes.get(coordinate, DEFAULT_LIST_SIZE)
        count = times * size
        total = count + self.selection(node.selection_set, inner, count, first)
        if is_list or first is not None:
            self.lists[coordinate] += total
        return total


def coerced_variables(
    schema: GraphQLSchema, operation: OperationDefinitionNode, variables: Mapping[str, Any] | None
) -> VariableValues | None:
    """The variables as execution will see them, or None when execution will
    refuse them (and so run nothing)."""
    coerced = get_variable_values(
        schema, operation.variable_definitions or (), dict(variables or {}), max_errors=1
    )
    return None if isinstance(coerced, list) else coerced


def _parts(
    schema: GraphQLSchema, document: Any, operation_name: str | None
) -> tuple[OperationDefinitionNode, GraphQLObjectType, dict[str, FragmentDefinitionNode]] | None:
    operation = get_operation_ast(document, operation_name)
    if operation is None:
        return None
    root = {
        "query": schema.query_type,
        "mutation": schema.mutation_type,
        "subscription": schema.subscription_type,
    }[operation.operation.value]
    if root is None:
        return None
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    return operation, root, fragments


def estimate(
    schema: GraphQLSchema,
    document: Any,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    sizes: Mapping[str, int] | None = None,
) -> Estimate | None:
    """The operation's estimate with these variables (None when nothing will
    run); with no variables, the most any variables could make it cost (a
    document checked before anyone sends it)."""
    parts = _parts(schema, document, operation_name)
    if parts is None:
        return None
    operation, root, fragments = parts
    coerced = None
    if variables is not None:
        coerced = coerced_variables(schema, operation, variables)
        if coerced is None:
            return None  # execution refuses the variables before anything runs
    found = Estimate(schema, fragments, coerced, sizes)
    found.total = found.selection(operation.selection_set, root, 1, None)
    return found


def estimate_cost(
    schema: GraphQLSchema, document: Any, operation_name: str | None, variables: Mapping[str, Any] | None
) -> int:
    """The operation's cost with these variables; with None, the most any
    variables could make it cost (a document checked before anyone sends it)."""
    found = estimate(schema, document, operation_name, variables)
    return 0 if found is None else found.total


class Actual:
    """The actual cost of an answer: what `Estimate` counts, over what came
    back. Selections of one response key are merged first, as execution
    merges them, so each object in the answer counts once."""

    def __init__(self, schema: GraphQLSchema, fragments: Mapping[str, FragmentDefinitionNode]) -> None:
        self.fragments = fragments
        self.work = work_fields(schema)

    def _collect(self, selection_sets: list[SelectionSetNode], fields: dict[str, list[FieldNode]]) -> None:
        for selection_set in selection_sets:
            for selection in selection_set.selections:
                if isinstance(selection, FieldNode):
                    key = selection.alias.value if selection.alias else selection.name.value
                    fields.setdefault(key, []).append(selection)
                elif isinstance(selection, InlineFragmentNode):
                    self._collect([selection.selection_set], fields)
                elif isinstance(selection, FragmentSpreadNode):
                    fragment = self.fragments.get(selection.name.value)
                    if fragment is not None:
                        self._collect([fragment.selection_set], fields)

    def objects(self, selection_sets: list[SelectionSetNode], parent: GraphQLObjectType, value: Any) -> int:
        if not isinstance(value, dict):
            return 0
        fields: dict[str, list[FieldNode]] = {}
        self._collect(selection_sets, fields)
        total = 0
        for key, nodes in fields.items():
            name = nodes[0].name.value
            if name.startswith("__") or name not in parent.fields or key not in value:
                continue
            found = value[key]
            inner, _ = _unwrap(parent.fields[name].type)
            below = [node.selection_set for node in nodes if node.selection_set is not None]
            if not isinstance(inner, GraphQLObjectType) or not below:
                total += 1 if f"{parent.name}.{name}" in self.work and found is not None else 0
                continue
            total += sum(1 + self.objects(below, inner, item) for item in _objects(found))
        return total


def _objects(value: Any) -> Iterator[Any]:
    if isinstance(value, list):
        for item in value:
            yield from _objects(item)
    elif value is not None:
        yield value


def actual_cost(schema: GraphQLSchema, document: Any, operation_name: str | None, data: Any) -> int:
    """What the answer `data` cost, counted as the estimate counts."""
    parts = _parts(schema, document, operation_name)
    if parts is None or data is None:
        return 0
    operation, root, fragments = parts
    return Actual(schema, fragments).objects([operation.selection_set], root, data)


def settle_event(schema: GraphQLSchema, document: Any, operation_name: str | None, data: Any) -> None:
    """After a subscription event ran for its subscriber: its actual cost
    settles what its stream charged for it (`live.HeldStream.settle`)."""
    stream = live.delivering.get()
    if stream is None:
        return
    live.delivering.set(None)
    if stream.budgeted:
        stream.settle(actual_cost(schema, document, operation_name, data))


def event_actual_cost(info: Any) -> Callable[[Any], int]:
    """What one event's answer `data` of the subscription `info` resolves cost."""
    raw = raw_info(info)
    root = cast(GraphQLObjectType, raw.schema.subscription_type)  # a subscription's info
    return lambda data: Actual(raw.schema, raw.fragments).objects([raw.operation.selection_set], root, data)


def event_cost(info: Any) -> int:
    """What one event of the subscription `info` resolves costs: its selection,
    estimated with the operation's coerced variables (at least 1)."""
    raw = raw_info(info)
    root = cast(GraphQLObjectType, raw.schema.subscription_type)  # a subscription's info
    found = Estimate(raw.schema, raw.fragments, raw.variable_values)
    return max(1, found.selection(raw.operation.selection_set, root, 1, None))


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


@dataclass(frozen=True)
class Admission:
    """An operation let run: what it could cost, and, with a budget, the
    viewer's bucket after taking that."""

    requested: int
    subject: str | None = None
    state: BudgetState | None = None


def _root_fields(document: Any, operation_name: str | None) -> set[str]:
    operation = get_operation_ast(document, operation_name)
    if operation is None:
        return set()
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    names: set[str] = set()
    pending = [operation.selection_set]
    while pending:
        for selection in pending.pop().selections:
            if isinstance(selection, FieldNode):
                names.add(selection.name.value)
            elif isinstance(selection, InlineFragmentNode):
                pending.append(selection.selection_set)
            elif isinstance(selection, FragmentSpreadNode) and selection.name.value in fragments:
                pending.append(fragments.pop(selection.name.value).selection_set)
    return names


async def admit(
    context: Context,
    schema: GraphQLSchema,
    document: Any,
    operation_name: str | None,
    variables: Mapping[str, Any] | None,
    operation_type: OperationType,
) -> Admission | GraphQLError:
    """The operation's admission, or why it may not run (too long a list in its
    variables, a cost over the limit, the viewer's bucket short of its cost).
    A query or mutation takes its requested cost from the bucket now (`settle`
    gives back what it does not use); a subscription pays per event delivered."""
    variables = variables or {}
    for name, value in variables.items():
        for path, length in _lists(value, f"${name}"):
            bound = LONG_LISTS.get(path.rsplit(".", 1)[-1].lstrip("$"), MAX_LIST_ITEMS)
            if length > bound:
                error = BadInput(f"{path} holds {length} items; at most {bound} are accepted")
                return GraphQLError(error.message, original_error=error)
    sizes: dict[str, int] = {}
    signed_in = context.signed_in_error() is None
    if (
        signed_in
        and operation_type is OperationType.QUERY
        and "myFamilies" in _root_fields(document, operation_name)
    ):
        sizes[MY_FAMILIES] = await families.my_family_count(context)
    found = estimate(schema, document, operation_name, variables, sizes)
    requested = 0 if found is None else found.total
    limit = context.services.settings.max_query_cost
    if found is not None and requested > limit:
        costliest, its_cost = found.lists.most_common(1)[0] if found.lists else ("", 0)
        message = f"this operation could cost {requested}, over the limit of {limit}"
        if costliest:
            message += f"; the list that costs most is {costliest} ({its_cost} with what it holds)"
        message += ": ask for smaller pages (first) or fewer nested lists"
        extensions = {
            "code": "BAD_USER_INPUT",
            "cost": {
                "estimated": requested,
                "limit": limit,
                "requestedQueryCost": requested,
                "costliestList": costliest or None,
            },
        }
        return GraphQLError(message, extensions=extensions)
    if not signed_in or operation_type is OperationType.SUBSCRIPTION:
        return Admission(requested)
    return await _charge(context, requested)


async def _charge(context: Context, requested: int) -> Admission | GraphQLError:
    """Takes the operation's requested cost from the viewer's bucket."""
    budget = context.services.rates.budget
    if not budget.enabled:
        return Admission(requested)
    # The token's subject: making the person's profile is the operation's work, not its admission's.
    subject = f"user:{context.signed_in_id()}"
    try:
        state = await budget.charge(subject, max(1, requested), context.services.now())
    except ApiError as error:
        return GraphQLError(error.message, extensions={"code": error.code, **error.extensions})
    except StoreError as error:
        # A budget the store cannot keep now lets the operation through: it
        # meets the same store, and its own error says what became of it.
        log.warning("the cost budget could not be charged: %s", error)
        return Admission(requested)
    charged.set(state)
    return Admission(requested, subject, state)


def settle(
    context: Context,
    admission: Admission,
    schema: GraphQLSchema,
    document: Any,
    operation_name: str | None,
    data: Any,
) -> dict[str, Any]:
    """Once the operation has run: its actual cost, counted from its answer,
    and what it did not use given back to the bucket. Shopify's
    `extensions.cost`."""
    actual = actual_cost(schema, document, operation_name, data)
    cost: dict[str, Any] = {"requestedQueryCost": admission.requested, "actualQueryCost": actual}
    state = admission.state
    if state is not None and admission.subject is not None:
        unused = max(1, admission.requested) - max(1, actual)
        state = context.services.rates.budget.refund(admission.subject, state, unused, context.services.now())
        cost["throttleStatus"] = state.throttle_status()
    return {"cost": cost}


class QueryCost(SchemaExtension):
    admission: Admission | None = None
    results: dict[str, Any] | None = None

    async def on_execute(self) -> AsyncIterator[None]:
        execution_context = self.execution_context
        context = execution_context.context
        document = execution_context.graphql_document
        graphql_schema = core_schema(execution_context.schema)
        if isinstance(context, Context) and document is not None and execution_context.result is None:
            admitted = await admit(
                context,
                graphql_schema,
                document,
                execution_context.operation_name,
                execution_context.variables,
                execution_context.operation_type,
            )
            if isinstance(admitted, GraphQLError):
                refuse(execution_context, admitted)
            else:
                self.admission = admitted
        yield
        result = execution_context.result
        if (
            self.admission is not None
            and isinstance(context, Context)
            and execution_context.operation_type is not OperationType.SUBSCRIPTION
            and result is not None
            and not isinstance(result, AsyncIterator)
        ):
            self.results = settle(
                context,
                self.admission,
                graphql_schema,
                document,
                execution_context.operation_name,
                getattr(result, "data", None),
            )

    def on_stream_result(self, result: Any) -> Iterator[None]:
        execution_context = self.execution_context
        if execution_context.graphql_document is not None:
            settle_event(
                core_schema(execution_context.schema),
                execution_context.graphql_document,
                execution_context.operation_name,
                getattr(result, "data", None),
            )
        yield None

    def get_results(self) -> dict[str, Any]:
        return self.results or {}
