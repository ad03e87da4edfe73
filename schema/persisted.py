"""Where persisted operations meet the schema (`resolvers/core/persisted.py`
holds the rules): a persisted document is stored only once its operation has
passed validation, sign-in and the cost limit; introspection can be turned off;
and a trusted-documents manifest can be checked against the schema."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence

from graphql import (
    GraphQLError,
    NoSchemaIntrospectionCustomRule,
    OperationDefinitionNode,
    parse,
    specified_rules,
    validate,
)
from strawberry.extensions import SchemaExtension

from resolvers.core.context import Context
from resolvers.core.errors import BadInput
from resolvers.core.persisted import ManifestEntry, sha256_hex
from schema.guard import document_is_introspection, refuse
from schema.strawberry_internals import aliases_rule, core_schema, depth_rule

INTROSPECTION_OFF = "introspection is turned off on this server (MIFAMILIAS_ALLOW_INTROSPECTION)"


def introspection_only(query: str, operation_name: str | None) -> bool:
    """Whether a document is introspection alone (what trusted-documents mode
    lets through unlisted when introspection is allowed)."""
    from schema import MAX_TOKENS

    try:
        document = parse(query, no_location=True, max_tokens=MAX_TOKENS)
    except GraphQLError:
        return False
    return document_is_introspection(document, operation_name)


class RegisterPersisted(SchemaExtension):
    """Stores a document sent with its hash (APQ) once its operation got this
    far: it parsed and validated, and the extensions before this one (sign-in,
    cost) let it run. Only a signed-in person's documents are stored, so an
    anonymous client cannot fill the table."""

    async def on_execute(self) -> AsyncIterator[None]:
        execution_context = self.execution_context
        context = execution_context.context
        if isinstance(context, Context) and context.documents_to_register:
            query = execution_context.query or ""
            sha256 = context.documents_to_register.pop(query, None)
            if sha256 is not None and execution_context.result is None and context.signed_in_error() is None:
                by = (context.services.rates, f"user:{await context.viewer_id()}")
                await context.services.persisted.register(sha256, query, by)
        yield


class IntrospectionGate(SchemaExtension):
    """Refuses `__schema` and `__type` anywhere in an operation when
    introspection is off (trusted documents, or MIFAMILIAS_ALLOW_INTROSPECTION=0).
    `__typename` stays allowed."""

    def on_execute(self) -> Iterator[None]:
        execution_context = self.execution_context
        context = execution_context.context
        document = execution_context.graphql_document
        if (
            isinstance(context, Context)
            and document is not None
            and execution_context.result is None
            and not context.services.settings.introspection_allowed
            and validate(core_schema(execution_context.schema), document, [NoSchemaIntrospectionCustomRule])
        ):
            error = BadInput(INTROSPECTION_OFF)
            refuse(execution_context, GraphQLError(error.message, original_error=error))
        yield


# Checking a manifest --------------------------------------------------------------------


def _label(entry: ManifestEntry) -> str:
    return f"{entry.id} ({entry.name})" if entry.name else entry.id


def _problems(entry: ManifestEntry, max_cost: int) -> list[str]:
    from schema import MAX_ALIASES, MAX_DEPTH, MAX_TOKENS, schema
    from schema.cost import estimate_cost

    graphql_schema = core_schema(schema)
    found = []
    if (
        len(entry.id) == 64
        and all(c in "0123456789abcdef" for c in entry.id)
        and entry.id != sha256_hex(entry.body)
    ):
        found.append("its id looks like a SHA-256 but is not the SHA-256 of its body")
    try:
        document = parse(entry.body, max_tokens=MAX_TOKENS)
    except GraphQLError as error:
        return [*found, error.message]
    rules = [*specified_rules, depth_rule(MAX_DEPTH), aliases_rule(MAX_ALIASES)]
    errors = validate(graphql_schema, document, rules)
    if errors:
        return [*found, *(error.message for error in errors)]
    for definition in document.definitions:
        if isinstance(definition, OperationDefinitionNode):
            name = definition.name.value if definition.name else None
            cost = estimate_cost(graphql_schema, document, name, None)
            if cost > max_cost:
                found.append(
                    f"operation {name or '(anonymous)'} could cost {cost}, over the limit of {max_cost}"
                )
    return found


def check_manifest(entries: Sequence[ManifestEntry], max_cost: int) -> dict[str, list[str]]:
    """The listed documents that could never run here, by id (and name), with
    why: they do not parse, do not validate against the schema, break a depth,
    alias, token or cost limit, or carry a SHA-256 id that is not their body's."""
    found: dict[str, list[str]] = {}
    for entry in entries:
        problems = _problems(entry, max_cost)
        if problems:
            found[_label(entry)] = problems
    return found
