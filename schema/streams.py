"""Subscriptions over plain HTTP responses: Server-Sent Events (the graphql-sse
protocol's distinct connections mode, `Accept: text/event-stream`) and Apollo's
multipart subscriptions (`Accept: multipart/mixed; subscriptionSpec="1.0"`).

Strawberry implements both protocols (`strawberry.http.streaming`); what is
ours is the heartbeat's interval, `MIFAMILIAS_KEEPALIVE_SECONDS`, where
Strawberry fixes 15 s for SSE and 5 s for multipart, and the end of a stream
when its token expires, as a socket closes then. Everything else on the way is
the HTTP view's: the body limit, the context built from the Authorization
header, and the schema's extensions (sign-in, cost), which refuse with a first
`next` event (SSE) or part (multipart) holding the error, as graphql-sse asks.
A client that goes away ends its stream: Starlette watches for the disconnect
and cancels the response, which closes the subscription and its broker
channel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from graphql import GraphQLError
from strawberry.subscriptions import GRAPHQL_SSE_PROTOCOL, MULTIPART_SUBSCRIPTION_PROTOCOL
from strawberry.types import ExecutionResult

from resolvers.core.auth import TokenExpired
from schema.strawberry_internals import HTTPStreamTransport, MultipartSubscriptionTransport, SSETransport

# As the view's `subscription_protocols` name them, and as a request's data does.
PROTOCOLS = (GRAPHQL_SSE_PROTOCOL, MULTIPART_SUBSCRIPTION_PROTOCOL)
STREAMED = (SSETransport.protocol, MultipartSubscriptionTransport.protocol)


def transports(heartbeat_seconds: float) -> Mapping[str, type[HTTPStreamTransport]]:
    """Strawberry's SSE and multipart transports, beating every `heartbeat_seconds`
    (an SSE `: ping` comment, an empty `{}` multipart part)."""

    class Sse(SSETransport):
        def __init__(self) -> None:
            super().__init__(heartbeat_interval=heartbeat_seconds)

    class Multipart(MultipartSubscriptionTransport):
        heartbeat_interval = heartbeat_seconds

    return {GRAPHQL_SSE_PROTOCOL: Sse, MULTIPART_SUBSCRIPTION_PROTOCOL: Multipart}


async def until_expiry(results: AsyncGenerator[Any, None], expires_at: float) -> AsyncGenerator[Any, None]:
    """`results` until the token expires (`expires_at`, seconds since the
    epoch); then one last result saying so, and the end of the stream."""
    loop = asyncio.get_running_loop()
    when = loop.time() + (expires_at - time.time())
    async with aclosing(results):
        while True:
            try:
                async with asyncio.timeout_at(when):
                    result = await anext(results)
            except StopAsyncIteration:
                return
            except TimeoutError:
                expired = TokenExpired()
                yield ExecutionResult(
                    data=None, errors=[GraphQLError(expired.message, extensions={"code": expired.code})]
                )
                return
            yield result
