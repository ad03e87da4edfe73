"""Errors that reach the client with one of the contract's `extensions.code`s."""

from __future__ import annotations


class ApiError(Exception):
    code = "INTERNAL_SERVER_ERROR"

    def __init__(self, message: str, **extensions: object) -> None:
        super().__init__(message)
        self.message = message
        # More for the client beside the code (e.g. `retryAfter`).
        self.extensions = extensions


class Unauthenticated(ApiError):
    code = "UNAUTHENTICATED"


class Forbidden(ApiError):
    code = "FORBIDDEN"


class NotFound(ApiError):
    code = "NOT_FOUND"


class BadInput(ApiError):
    code = "BAD_USER_INPUT"


class Conflict(ApiError):
    code = "CONFLICT"


class RateLimited(ApiError):
    code = "RATE_LIMITED"


class PersistedQueryNotFound(ApiError):
    """Apollo's automatic persisted queries: a hash this server does not know;
    the client sends it again with the query."""

    code = "PERSISTED_QUERY_NOT_FOUND"


class PersistedQueryNotInList(ApiError):
    """Trusted documents: an operation that is not in the list."""

    code = "PERSISTED_QUERY_NOT_IN_LIST"


def not_found(what: str) -> NotFound:
    # One message for "missing" and "not yours", so an answer leaks nothing.
    return NotFound(f"{what} not found")
