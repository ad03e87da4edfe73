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


class Unavailable(ApiError):
    """The service cannot answer now (its store did not answer, or the
    operation ran out of time); `retryAfter` says when to try again, and
    `outcome: "UNKNOWN"` that a write may or may not have been applied."""

    code = "UNAVAILABLE"


# Seconds a client waits before retrying an UNAVAILABLE answer.
RETRY_AFTER_SECONDS = 2


def unavailable(message: str, *, outcome_known: bool = True) -> Unavailable:
    if outcome_known:
        return Unavailable(message, retryAfter=RETRY_AFTER_SECONDS)
    return Unavailable(
        message + "; it may or may not have been applied: retry it with the same Idempotency-Key",
        retryAfter=RETRY_AFTER_SECONDS,
        outcome="UNKNOWN",
    )


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
