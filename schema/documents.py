"""Parsed and validated documents, cached for signed-in requests only.

Clients send a few fixed documents, so parsing and validating each once per
process is most of what a cache can save. But a cache is memory anyone can
fill with unique texts: so only a request with a valid token may add to it,
a document longer than `MAX_CACHED_CHARS` is never kept, and the cache is
bounded in entries and in the characters of the texts it holds (a parsed
document is a multiple of its text, so the text is the measure). Anything
else is parsed and validated by Strawberry as if there were no cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cachetools import LRUCache
from graphql import DocumentNode, GraphQLError, SelectionSetNode, Visitor, parse, visit
from strawberry.extensions import SchemaExtension

from resolvers.core.caches import weighed_lru
from resolvers.core.context import Context

MAX_ENTRIES = 256
MAX_CHARS = 1 << 20
MAX_CACHED_CHARS = 16 * 1024

# A parsed document, its validation errors by rules, and its text's length.
_Parsed = tuple[DocumentNode, dict[Any, list[GraphQLError]], int]


class Documents:
    """An LRU of (document, validation errors by rules), keyed by the text and
    the parse options, bounded in entries and in characters."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        # Each entry keeps its text's length, the weight the character bound counts.
        self._entries: LRUCache[tuple[str, str], _Parsed] = weighed_lru(
            max_entries, max_chars, lambda parsed: parsed[2]
        )

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._entries))

    @property
    def weight(self) -> int:
        """What the character bound counts now (at most `max_chars`)."""
        return int(self._entries.currsize)

    def get(self, key: tuple[str, str]) -> tuple[DocumentNode, dict[Any, list[GraphQLError]]] | None:
        found = self._entries.get(key)
        return None if found is None else (found[0], found[1])

    def put(self, key: tuple[str, str], document: DocumentNode) -> dict[Any, list[GraphQLError]]:
        validated: dict[Any, list[GraphQLError]] = {}
        if len(key[0]) <= self.max_chars:
            self._entries[key] = (document, validated, len(key[0]))
        return validated

    def clear(self) -> None:
        self._entries.clear()


# One per process, shared by every request (as Strawberry's caches are).
documents = Documents()


def _key(execution_context: Any) -> tuple[str, str] | None:
    """The cache key of a signed-in request's document; None when it may not
    use the cache."""
    context = execution_context.context
    query = execution_context.query
    if (
        isinstance(context, Context)
        and context.signed_in_error() is None
        and isinstance(query, str)
        and len(query) <= MAX_CACHED_CHARS
    ):
        return query, repr(sorted(execution_context.parse_options.items()))
    return None


class _EmptySelections(Visitor):
    def enter_selection_set(self, node: SelectionSetNode, *_: Any) -> None:
        if not node.selections:
            raise GraphQLError(
                "a selection set must ask for at least one field; `{ }` is empty",
                nodes=[node],
                extensions={"code": "BAD_USER_INPUT"},
            )


def refuse_empty_selections(document: DocumentNode) -> None:
    """graphql-core parses `{ }`, which the grammar does not allow (a selection
    set holds one selection or more), and the depth limit then fails on it:
    it is refused as the syntax error it is, before validation."""
    visit(document, _EmptySelections())


class DocumentCache(SchemaExtension):
    """Parse and validation, from `documents` for signed-in requests."""

    def on_parse(self) -> Iterator[None]:
        execution_context = self.execution_context
        key = _key(execution_context)
        if key is not None:
            found = documents.get(key)
            if found is None:
                try:
                    document = parse(key[0], **execution_context.parse_options)
                    refuse_empty_selections(document)
                except GraphQLError as error:
                    # Raised from a hook, it leaves before the operation has a
                    # result to relabel: it gets its code here.
                    if not (error.extensions or {}).get("code"):
                        error.extensions = {**(error.extensions or {}), "code": "BAD_USER_INPUT"}
                    raise
                documents.put(key, document)
            else:
                document = found[0]
            execution_context.graphql_document = document
        yield
        if key is None and execution_context.graphql_document is not None:
            refuse_empty_selections(execution_context.graphql_document)

    def on_validate(self) -> Iterator[None]:
        execution_context = self.execution_context
        key = _key(execution_context)
        found = documents.get(key) if key is not None else None
        if found is not None and found[0] is execution_context.graphql_document:
            from schema.strawberry_internals import core_schema, validate_document

            document, validated = found
            rules = (id(execution_context.schema), tuple(execution_context.validation_rules))
            if rules not in validated:
                if len(validated) >= 4:
                    validated.clear()  # the rules are fixed per schema: a few at most
                validated[rules] = validate_document(
                    core_schema(execution_context.schema), document, execution_context.validation_rules
                )
            execution_context.pre_execution_errors = validated[rules]
        yield
