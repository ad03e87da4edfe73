"""How errors reach clients: the contract's `extensions.code`, a readable
message, and never a stack trace."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from graphql import GraphQLError
from strawberry.extensions import SchemaExtension

from resolvers.errors import ApiError

log = logging.getLogger("mifamilias.errors")


def to_client_error(error: GraphQLError, request_id: str) -> GraphQLError:
    original = error.original_error
    if isinstance(original, ApiError):
        return GraphQLError(
            original.message,
            nodes=error.nodes,
            source=error.source,
            positions=error.positions,
            path=error.path,
            extensions={"code": original.code},
        )
    if original is None:
        # Parse and validation errors: the request itself is wrong.
        code = (error.extensions or {}).get("code") or "BAD_USER_INPUT"
        if code not in ("RATE_LIMITED", "UNAUTHENTICATED"):
            code = "BAD_USER_INPUT"
        return GraphQLError(
            error.message,
            nodes=error.nodes,
            source=error.source,
            positions=error.positions,
            path=error.path,
            extensions={"code": code},
        )
    if isinstance(original, GraphQLError) and original.original_error is None:
        # Variable coercion failures (an unknown enum value, a wrong type) land here.
        return GraphQLError(
            error.message,
            nodes=error.nodes,
            source=error.source,
            positions=error.positions,
            path=error.path,
            extensions={"code": "BAD_USER_INPUT"},
        )
    log.error("unexpected error (request %s)", request_id, exc_info=original)
    return GraphQLError(
        f"Internal server error (request id {request_id})",
        nodes=error.nodes,
        source=error.source,
        positions=error.positions,
        path=error.path,
        extensions={"code": "INTERNAL_SERVER_ERROR", "requestId": request_id},
    )


class ContractErrors(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        result = self.execution_context.result
        errors = getattr(result, "errors", None)
        if not errors:
            return
        context = self.execution_context.context
        request_id = getattr(context, "request_id", "-")
        result.errors = [to_client_error(error, request_id) for error in errors]  # type: ignore[union-attr]
