"""How operations reach the schema: Strawberry's ASGI view, with our context,
our refusals and our limits.

- A request body is counted while it is read, whatever Content-Length says, and
  a body over `MIFAMILIAS_MAX_BODY_BYTES` is answered 413 before it is parsed.
- Every refusal of the transport is a JSON GraphQL error with a contract code:
  a body that is not a JSON object, a subscription without a streaming Accept,
  an unsupported content type. No refusal is a plain-text page or a 500.
- On both WebSocket protocols, a frame that is not a well-formed message closes
  the socket with 4400, and the connection closes when its token expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import orjson
from cross_web import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler

from resolvers.core import logs
from resolvers.core.context import Context, Services

log = logging.getLogger("mifamilias.transport")

SUBSCRIBE_OVER_HTTP = (
    "subscriptions are streamed over a WebSocket: connect to /graphql with the graphql-transport-ws "
    "(or the legacy graphql-ws) protocol and send the token in connection_init"
)


def error_body(message: str, code: str = "BAD_USER_INPUT", **extensions: Any) -> dict[str, Any]:
    return {"data": None, "errors": [{"message": message, "extensions": {"code": code, **extensions}}]}


class BodyTooLarge(Exception):
    pass


def limited(receive: Receive, limit: int) -> Receive:
    """`receive`, counting the body's bytes as they arrive."""
    seen = 0

    async def receive_counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge
        return message

    return receive_counted


# WebSockets --------------------------------------------------------------------------


async def _close_when_expired(context: Context, close: Callable[[], Awaitable[None]]) -> None:
    """Sleeps until the connection's token expires, then closes the socket."""
    expires_at = context.claims.expires_at if context.claims else None
    if expires_at is None:
        return
    await asyncio.sleep(max(0.0, expires_at - time.time()))
    await close()


def _well_formed(message: object) -> bool:
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        return False
    payload = message.get("payload")
    if message["type"] in ("subscribe", "start"):
        return (
            isinstance(message.get("id"), str)
            and isinstance(payload, dict)
            and isinstance(payload.get("query"), str)
            and isinstance(payload.get("variables"), dict | None)
            and isinstance(payload.get("operationName"), str | None)
            and isinstance(payload.get("extensions"), dict | None)
        )
    if message["type"] in ("complete", "stop"):
        return isinstance(message.get("id"), str)
    return True


class _Guarded:
    """What both WebSocket protocols share: a malformed frame closes the socket
    with 4400, and the connection ends when its token expires (`_expire`, per
    protocol), with nothing run on it after that."""

    context: Context
    websocket: Any
    connection_acknowledged: bool
    expiry: asyncio.Task[None] | None = None
    protocol: str = ""

    async def handle(self) -> None:
        with self.context.services.metrics.websocket(self.protocol):
            await super().handle()  # type: ignore[misc]

    async def _expire(self) -> None:
        raise NotImplementedError

    # Both protocols' handlers name these two hooks alike; `super()` reaches the
    # protocol's own handler, which comes after this class in the MRO.

    async def handle_message(self, message: Any) -> None:
        if not _well_formed(message):
            await self.websocket.close(code=4400, reason="malformed message")
            return
        await super().handle_message(message)  # type: ignore[misc]

    async def handle_connection_init(self, message: Any) -> None:
        await super().handle_connection_init(message)  # type: ignore[misc]
        if self.connection_acknowledged and self.expiry is None:
            self.expiry = asyncio.create_task(_close_when_expired(self.context, self._expire))

    async def _expired(self) -> bool:
        if self.connection_acknowledged and self.context.signed_in_error() is not None:
            await self._expire()
            return True
        return False

    def _stop_watching(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()


class TransportWSHandler(_Guarded, BaseGraphQLTransportWSHandler[Context, None]):
    """graphql-transport-ws: an expired token closes with 4403 "token expired"."""

    protocol = GRAPHQL_TRANSPORT_WS_PROTOCOL

    async def _expire(self) -> None:
        await self.websocket.close(code=4403, reason="token expired")

    async def handle_subscribe(self, message: Any) -> None:
        if not await self._expired():
            await super().handle_subscribe(message)

    async def shutdown(self) -> None:
        self._stop_watching()
        await super().shutdown()


class LegacyWSHandler(_Guarded, BaseGraphQLWSHandler[Context, None]):
    """subscriptions-transport-ws (graphql-ws): an expired token gets
    `connection_error`, then the close."""

    protocol = GRAPHQL_WS_PROTOCOL

    async def _expire(self) -> None:
        await self.send_message({"type": "connection_error", "payload": {"message": "token expired"}})
        await self.websocket.close(code=4403, reason="token expired")

    async def handle_start(self, message: Any) -> None:
        if not await self._expired():
            await super().handle_start(message)

    async def cleanup(self) -> None:
        self._stop_watching()
        await super().cleanup()


def _is_subscription(request_data: Any) -> bool:
    """Whether the operation a plain HTTP request names is a subscription."""
    from graphql import GraphQLError, OperationType, parse
    from graphql.utilities import get_operation_ast

    from schema import MAX_TOKENS

    if "subscription" not in (request_data.query or ""):
        return False  # no second parse for the queries and mutations that make up the traffic
    try:
        document = parse(request_data.query, no_location=True, max_tokens=MAX_TOKENS)
    except GraphQLError:
        return False  # the schema answers the syntax error
    operation = get_operation_ast(document, request_data.operation_name)
    return operation is not None and operation.operation == OperationType.SUBSCRIPTION


# The view -------------------------------------------------------------------------------


class MiFamiliasGraphQL(GraphQL[Context, None]):
    """Strawberry's ASGI view with our context: a fresh one (and fresh loaders)
    per HTTP request and per WebSocket connection."""

    graphql_transport_ws_handler_class = TransportWSHandler
    graphql_ws_handler_class = LegacyWSHandler

    def __init__(
        self,
        services_ref: Callable[[], Services],
        *,
        max_body_bytes: int,
        schema: Any = None,
        **kwargs: Any,
    ) -> None:
        if schema is None:
            from schema import schema

        super().__init__(
            schema,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL),
            keep_alive=True,
            keep_alive_interval=15,
            connection_init_wait_timeout=timedelta(seconds=10),
            **kwargs,
        )
        self._services = services_ref
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        response = await self._http(scope, receive)
        await response(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive) -> Response:
        limit = self.max_body_bytes
        too_large = JSONResponse(
            error_body(f"the request body is larger than {limit} bytes", maxBytes=limit), status_code=413
        )
        declared = dict(scope.get("headers") or {}).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return too_large
        try:
            response: Response = await self.run(Request(scope, receive=limited(receive, limit)))
        except BodyTooLarge:
            return too_large
        except HTTPException as error:
            return JSONResponse(error_body(error.reason), status_code=error.status_code)
        return response

    async def parse_http_body(self, request: Any) -> Any:
        if request.method == "POST" and "application/json" in (request.content_type or ""):
            try:
                decoded = orjson.loads(await request.get_body())
            except orjson.JSONDecodeError as error:
                raise HTTPException(400, "the request body is not valid JSON") from error
            if not isinstance(decoded, dict):
                raise HTTPException(
                    400, 'the request body must be a JSON object such as {"query": "{ me { id } }"}'
                )
        data = await super().parse_http_body(request)
        if not isinstance(data, list) and not data.query:
            raise HTTPException(400, "no GraphQL query in the request: send a 'query'")
        return data

    async def execute_operation(
        self,
        request: Any,
        request_adapter: Any,
        request_data: Any,
        context: Context,
        root_value: Any,
        sub_response: Any,
    ) -> Any:
        if getattr(request_data, "protocol", None) == "http" and _is_subscription(request_data):
            raise HTTPException(400, SUBSCRIBE_OVER_HTTP)
        return await super().execute_operation(
            request, request_adapter, request_data, context, root_value, sub_response
        )

    def encode_json(self, data: object) -> str:
        # orjson is several times faster than json on results; a str keeps
        # WebSocket frames textual, as graphql-ws clients expect.
        return orjson.dumps(data).decode()

    def decode_json(self, data: str | bytes) -> object:
        return orjson.loads(data)

    @property
    def graphql_ide_html(self) -> str:
        from schema.graphiql import GRAPHIQL_HTML

        return GRAPHIQL_HTML

    async def get_context(self, request: Request | WebSocket, response: Any = None) -> Context:
        # The id the request's (or the connection's) log lines carry.
        found = logs.current.get()
        context = (
            Context(services=self._services(), request=request, response=response)
            if found is None
            else Context(
                services=self._services(), request=request, response=response, request_id=found.request_id
            )
        )
        if isinstance(request, Request):
            await context.authenticate(request.headers.get("authorization"))
        return context

    async def on_ws_connect(self, context: Context) -> Any:
        params = context.connection_params or {}
        authorization = params.get("Authorization") or params.get("authorization")
        if not isinstance(authorization, str):
            raise ConnectionRejectionError({"message": "sign in: send Authorization in connection_init"})
        await context.authenticate(authorization)
        if context.claims is None:
            message = context.auth_error.message if context.auth_error else "not signed in"
            raise ConnectionRejectionError({"message": message})
        try:
            await context.viewer_id()
        except Exception as error:  # the store is down: refuse rather than half-open
            log.exception("could not load the viewer for a WebSocket")
            raise ConnectionRejectionError({"message": "try again later"}) from error
        return None
