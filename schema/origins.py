"""Which web pages may call the API: CORS for HTTP, the `Origin` check for WebSockets.

The API signs a caller in by the bearer token a request carries and never by a
cookie, so a page on another origin can do nothing with it that the page's own
user could not: there is no ambient credential for a hostile page to ride on.
That is what makes an open policy safe, and it is the default: any origin may
call `/graphql` and the media routes, with the headers frontends send (Apollo's
among them) and the trace headers that join the caller's trace.

`MIFAMILIAS_ALLOWED_ORIGINS` narrows it to the origins it names; WebSockets, to
which browsers apply no CORS, are checked against the same list by Strawberry's
view, so a page elsewhere cannot open a subscription either. A client that sends
no `Origin` (not a browser) is not a page on another origin and is let in.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

# The request headers a page may send: the token, the body's type, the
# idempotency key, W3C trace context and baggage, and the two headers Apollo
# Client adds (`apollo-require-preflight` for uploads, the operation's name).
ALLOWED_HEADERS = (
    "authorization",
    "content-type",
    "idempotency-key",
    "traceparent",
    "tracestate",
    "baggage",
    "apollo-require-preflight",
    "x-apollo-operation-name",
)
# What a page may read of an answer besides the simple headers: when to retry.
EXPOSED_HEADERS = ("retry-after",)
# How long a browser may keep a preflight's answer (Chromium keeps at most two hours).
PREFLIGHT_MAX_AGE_SECONDS = 7200


def cors_middleware(allowed_origins: Sequence[str]) -> Middleware:
    """CORS for every HTTP route: `/graphql`, and the media a page loads."""
    return Middleware(
        CORSMiddleware,
        allow_origins=list(allowed_origins) or ["*"],
        allow_methods=["GET", "POST", "PUT"],
        allow_headers=list(ALLOWED_HEADERS),
        expose_headers=list(EXPOSED_HEADERS),
        max_age=PREFLIGHT_MAX_AGE_SECONDS,
    )


def websocket_origins(allowed_origins: Sequence[str]) -> tuple[str, ...]:
    """The origins whose pages may open a WebSocket, for Strawberry's own check
    (which always lets in a client that sends no Origin, and the same origin)."""
    return tuple(allowed_origins) or ("*",)
