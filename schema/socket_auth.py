"""Signing a WebSocket in, wherever its client puts the token, and saying why
a socket is refused.

The token comes from the `connection_init` payload, under the first of
`Authorization`, `authorization`, `authToken`, `headers.Authorization` or
`headers.authorization` that is present, or else from the handshake's own
Authorization header (gql-cli sends it there); `Bearer ` in front is optional.
"""

from __future__ import annotations

import logging
from typing import Any

from resolvers.core.auth import TokenExpired
from resolvers.core.context import Context

log = logging.getLogger("mifamilias.transport")

# Close reasons, the same on both protocols.
NO_TOKEN = "send Authorization in connection_init"
EXPIRED = "token expired"
NOT_VALID = "token not valid"
TRY_LATER = "try again later"

REFUSED = 4403  # the close code of a refused sign-in (graphql-transport-ws's Forbidden)
UNAVAILABLE = 1013  # RFC 6455 "try again later": the store did not answer

PLACES: tuple[tuple[str, ...], ...] = (
    ("Authorization",),
    ("authorization",),
    ("authToken",),
    ("headers", "Authorization"),
    ("headers", "authorization"),
)


def given_authorization(params: dict[str, Any], handshake: str | None) -> object:
    """What the client sent as its token, or None when it sent nothing."""
    for path in PLACES:
        found: object = params
        for step in path:
            found = found.get(step) if isinstance(found, dict) else None
        if found is not None and found != "":
            return found
    return handshake or None


def as_bearer(value: str) -> str:
    """`Bearer <token>` from a token given with or without its scheme."""
    value = value.strip()
    if value.partition(" ")[0].lower() == "bearer":
        return value
    return f"Bearer {value}"


def close_code(reason: str) -> int:
    return UNAVAILABLE if reason == TRY_LATER else REFUSED


async def sign_in(context: Context, params: dict[str, Any]) -> str | None:
    """Authenticates the connection's context; the close reason when it may not
    go on, None when it may."""
    headers = getattr(context.request, "headers", None)
    handshake = headers.get("authorization") if headers is not None else None
    given = given_authorization(params, handshake)
    if given is None:
        return NO_TOKEN
    if not isinstance(given, str):
        return NOT_VALID
    await context.authenticate(as_bearer(given))
    refusal = context.signed_in_error()
    if refusal is not None:
        return EXPIRED if isinstance(refusal, TokenExpired) else NOT_VALID
    try:
        await context.viewer_id()
    except Exception:  # the store is down: refuse rather than half-open
        log.exception("could not load the viewer for a WebSocket (request %s)", context.request_id)
        return TRY_LATER
    return None
