"""How errors reach clients: the contract's `extensions.code`, a readable
message, and never a stack trace."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from resolvers.core.errors import ApiError, unavailable
from schema.strawberry_internals import REQUEST_ERRORS
from store.port import StoreUnavailable

log = logging.getLogger("mifamilias.errors")


def _relabel(error: GraphQLError, message: str, extensions: dict[str, Any]) -> GraphQLError:
    """The same place in the query, with what the client may know of it."""
    return GraphQLError(
        message,
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        extensions=extensions,
    )


CODES = {
    "UNAUTHENTICATED",
    "FORBIDDEN",
    "NOT_FOUND",
    "BAD_USER_INPUT",
    "CONFLICT",
    "RATE_LIMITED",
    "INTERNAL_SERVER_ERROR",
    # Beside the contract's: the service cannot answer now (retry later).
    "UNAVAILABLE",
    # Persisted operations: Apollo's codes, beside the contract's, so Apollo clients recognise them.
    "PERSISTED_QUERY_NOT_FOUND",
    "PERSISTED_QUERY_NOT_IN_LIST",
}


def to_client_error(error: GraphQLError, request_id: str) -> GraphQLError:
    original = error.original_error
    if original is None and (error.extensions or {}).get("code") in CODES:
        return error  # relabelled already (a subscription event, then its operation)
    if isinstance(original, ApiError):
        return _relabel(error, original.message, {"code": original.code, **original.extensions})
    if isinstance(original, StoreUnavailable):
        # The store did not answer: the details in the log, the client told to retry.
        log.warning("the store did not answer: %s", original)
        found = unavailable(
            "the service's store did not answer in time", outcome_known=original.outcome_known
        )
        return _relabel(error, found.message, {"code": found.code, **found.extensions})
    if isinstance(original, REQUEST_ERRORS):
        # An operation this transport does not carry (a query over multipart
        # subscriptions, a mutation over GET), or an unknown operation name.
        return _relabel(error, error.message, {"code": "BAD_USER_INPUT"})
    if original is None or (isinstance(original, GraphQLError) and original.original_error is None):
        # Parse and validation errors, and variables that do not coerce (an
        # unknown enum value, a wrong type): the request itself is wrong.
        return _relabel(error, error.message, {"code": "BAD_USER_INPUT"})
    # The request id is on the line already (resolvers.core.logs), not in the message.
    log.error("unexpected error", exc_info=original)
    return _relabel(
        error,
        f"Internal server error (request id {request_id})",
        {"code": "INTERNAL_SERVER_ERROR", "requestId": request_id},
    )


def relabel_all(result: Any, request_id: str) -> None:
    """Every error of `result` as the client may see it."""
    errors = getattr(result, "errors", None)
    if errors:
        result.errors = [to_client_error(error, request_id) for error in errors]


class ContractErrors(SchemaExtension):
    def _relabel_all(self, result: Any) -> None:
        relabel_all(result, getattr(self.execution_context.context, "request_id", "-"))

    def on_operation(self) -> Iterator[None]:
        yield
        self._relabel_all(self.execution_context.result)

    def on_stream_result(self, result: Any) -> Iterator[None]:
        # Each subscription event leaves through here, before the operation ends.
        self._relabel_all(result)
        yield None
