"""How operations reach the schema: Strawberry's ASGI view, with our context,
our refusals and our limits.

- A request body is counted while it is read, whatever Content-Length says, and
  a body over `MIFAMILIAS_MAX_BODY_BYTES` is answered 413 before it is parsed.
- Every refusal of the transport is a JSON GraphQL error with a contract code:
  a body that is not a JSON object, a subscription without a streaming Accept,
  an unsupported content type. No refusal is a plain-text page or a 500.
- Subscriptions stream over both WebSocket protocols, Server-Sent Events and
  multipart HTTP (`schema/streams.py`); queries and mutations run over any of
  them too.
- On both WebSocket protocols, a frame that is not a well-formed message closes
  the socket with 4400; the socket signs in with the token wherever its client
  puts it (`schema/socket_auth.py`), a refusal's close says why, the server
  keeps an idle socket alive (`ping` or `ka`), and the connection closes when
  its token expires.
- Persisted operations (`resolvers/core/persisted.py`): a request's
  `extensions.persistedQuery` is turned into the document it names before
  anything else sees it, over POST, GET and both WebSocket protocols; a
  refusal is a GraphQL error with its code (PERSISTED_QUERY_NOT_FOUND with
  HTTP 200, as Apollo answers it, so clients send the query again).
- GraphQL over HTTP (the GraphQL foundation's spec, audited by graphql-http):
  a client that accepts `application/graphql-response+json` (by its `Accept`,
  q-values honoured) is answered with it, and a request error (the document
  does not parse or validate, the variables do not coerce, or a check refuses
  the operation before it runs) is then 4xx with no `data`. A client accepting
  `application/json` alone (or sending no `Accept`) keeps the legacy answer: 200.
- The view knows its open sockets: when the server shuts down, `going_away`
  closes them with 1001 "going away", so clients reconnect to another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import orjson
from cross_web import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLRequestData
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL

from resolvers.core import idempotency, logs
from resolvers.core.context import Context
from resolvers.core.errors import ApiError, PersistedQueryNotFound
from resolvers.services import Services
from schema import backpressure, frames, socket_auth, streams
from schema.strawberry_internals import BaseGraphQLTransportWSHandler, BaseGraphQLWSHandler, OperationType

log = logging.getLogger("mifamilias.transport")

GOING_AWAY = 1001  # RFC 6455: the server is going down; reconnect elsewhere

SUBSCRIBE_OVER_HTTP = (
    "subscriptions need a WebSocket (graphql-transport-ws or the legacy graphql-ws, with the token in "
    "connection_init), Server-Sent Events (Accept: text/event-stream) or multipart HTTP "
    '(Accept: multipart/mixed; subscriptionSpec="1.0")'
)


def error_body(message: str, code: str = "BAD_USER_INPUT", **extensions: Any) -> dict[str, Any]:
    return {"data": None, "errors": [{"message": message, "extensions": {"code": code, **extensions}}]}


JSON = "application/json"
GRAPHQL_RESPONSE = "application/graphql-response+json"
_MEDIA_TYPES = {GRAPHQL_RESPONSE: GRAPHQL_RESPONSE, JSON: JSON, "application/*": JSON, "*/*": JSON}


def response_media_type(accept: str | None) -> str:
    """The media type a GraphQL-over-HTTP answer takes: the one the `Accept`
    header prefers (highest q, then first listed) of the two the spec names;
    `application/json` without a header, or when it names neither (GraphiQL
    and the streaming transports are chosen before this)."""
    best, best_q = JSON, -1.0
    for entry in (accept or "").split(","):
        name, *parameters = entry.split(";")
        media_type = _MEDIA_TYPES.get(name.strip().lower())
        if media_type is None:
            continue
        q = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > best_q and q > 0:
            best, best_q = media_type, q
    return best


def is_request_error(result: Any) -> bool:
    """Whether a result never reached execution: no data, and errors that name
    no path (a field's error always names one, even when a non-null root field
    failing leaves `data` null)."""
    errors = result.errors
    return result.data is None and bool(errors) and all(error.path is None for error in errors)


def _request_error_status(errors: list[Any]) -> int:
    codes = {(error.extensions or {}).get("code") for error in errors}
    return 401 if codes == {"UNAUTHENTICATED"} else 400


class BodyTooLarge(Exception):
    pass


class Refused(Exception):
    """An operation answered with `error` before it runs."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error

    @property
    def status_code(self) -> int:
        if isinstance(self.error, PersistedQueryNotFound):
            return 200  # as Apollo answers it: its clients then send the query
        return 500 if self.error.code == "INTERNAL_SERVER_ERROR" else 400

    def body(self) -> dict[str, Any]:
        return error_body(self.error.message, self.error.code, **self.error.extensions)


def _hash_sent(extensions: object) -> bool:
    return isinstance(extensions, dict) and extensions.get("persistedQuery") is not None


async def persisted_query(
    context: Context, query: str | None, extensions: object, operation_name: str | None
) -> str:
    """The document an operation runs: its `query`, or the persisted document
    its `extensions.persistedQuery` names (ApiError when there is none, or the
    trusted documents do not list it). A document sent with its hash is stored
    once its operation has passed every check (schema.persisted.RegisterPersisted)."""
    persisted = context.services.persisted
    if persisted.trusted is None and query and not _hash_sent(extensions):
        return query  # the common case: no hashing, no lookup
    refusal = context.signed_in_error()
    if not query and _hash_sent(extensions) and refusal is not None:
        # A hash alone reads the store: without a token it tells nothing, not
        # even whether anyone has run that document.
        raise refusal
    settings = context.services.settings

    def unlisted_allowed(text: str) -> bool:
        from schema.persisted import introspection_only

        return settings.introspection_allowed and introspection_only(text, operation_name)

    try:
        resolved = await persisted.resolve(query, extensions, unlisted_allowed)
    except ApiError:
        raise
    except Exception as error:  # the store is down: a clean answer, and the details in the log
        request_id = context.request_id
        log.exception("could not look up a persisted query (request %s)", request_id)
        raise ApiError(f"Internal server error (request id {request_id})", requestId=request_id) from error
    if resolved.register is not None:
        context.register_later(resolved.query, resolved.register)
    return resolved.query


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


# Work a connection's timer started (a ping, the close of an expired token),
# kept until it is done so that it is not collected mid-way.
_timed: set[asyncio.Future[None]] = set()


def _after(seconds: float, work: Callable[[], Awaitable[None]]) -> asyncio.TimerHandle:
    """`work` in a task of its own after `seconds`: a connection idle for
    hours holds a timer (a few hundred bytes), not a sleeping task."""

    def start() -> None:
        task = asyncio.ensure_future(work())
        _timed.add(task)
        task.add_done_callback(_timed.discard)

    return asyncio.get_running_loop().call_later(seconds, start)


def _close_when_expired(context: Context, close: Callable[[], Awaitable[None]]) -> asyncio.TimerHandle | None:
    """Closes the socket once the connection's token expires."""
    expires_at = context.claims.expires_at if context.claims else None
    if expires_at is None:
        return None
    return _after(max(0.0, expires_at - time.time()), close)


def _well_formed(message: object) -> bool:
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        return False
    payload = message.get("payload")
    if message["type"] in ("subscribe", "start"):
        return (
            isinstance(message.get("id"), str)
            and isinstance(payload, dict)
            # A persisted query may come as its hash alone.
            and (
                isinstance(payload.get("query"), str)
                or (payload.get("query") is None and _hash_sent(payload.get("extensions")))
            )
            and isinstance(payload.get("variables"), dict | None)
            and isinstance(payload.get("operationName"), str | None)
            and isinstance(payload.get("extensions"), dict | None)
        )
    if message["type"] in ("complete", "stop"):
        return isinstance(message.get("id"), str)
    return True


def _idempotency_key(extensions: object) -> object:
    """The key as sent, whatever its type: a key that is not a string is refused
    when the mutation runs (`idempotency.check_key`), never run without one."""
    return extensions.get("idempotencyKey") if isinstance(extensions, dict) else None


@contextlib.contextmanager
def _keyed(message: Any) -> Iterator[None]:
    """The operation's Idempotency-Key (`extensions.idempotencyKey`), for the
    task the protocol's handler creates for it (which copies it), and no other."""
    token = idempotency.requested_key.set(_idempotency_key(message["payload"].get("extensions")))
    try:
        yield
    finally:
        idempotency.requested_key.reset(token)


@contextlib.contextmanager
def _framed(handler: _Guarded, message: Any, message_type: str) -> Iterator[None]:
    """The operation's socket, for the task the protocol's handler creates for
    it: its shared events may leave as encoded frames (`schema.frames`)."""
    token = frames.target.set(frames.Target(handler, message["id"], message_type))
    try:
        yield
    finally:
        frames.target.reset(token)


class _Guarded:
    """What both WebSocket protocols share: a malformed frame closes the socket
    with 4400; `connection_init` signs in with the token wherever the client
    put it, and a refusal closes the socket saying why (`_refuse`, per
    protocol); the connection ends when its token expires, with nothing run on
    it after that."""

    context: Context
    websocket: Any
    view: Any
    connection_acknowledged: bool
    expiry: asyncio.TimerHandle | None = None
    protocol: str = ""

    async def _refuse(self, reason: str) -> None:
        raise NotImplementedError

    def _may_sign_in(self, message: Any) -> bool:
        """Whether this `connection_init` is the protocol's to refuse first
        (a payload of the wrong shape, a second init)."""
        raise NotImplementedError

    async def _expire(self) -> None:
        await self._refuse(socket_auth.EXPIRED)

    async def handle(self) -> None:
        view: MiFamiliasGraphQL = self.view
        if view.closing:
            await self.websocket.close(code=GOING_AWAY, reason="going away")
            return
        settings = self.context.services.settings
        metrics = self.context.services.metrics
        protocol = self.protocol

        def let_go(why: str) -> None:
            metrics.slow_client_closed(protocol, why)
            log.warning("let a slow %s client go (%s)", protocol, why)

        self.websocket = queued = backpressure.QueuedSocket(
            self.websocket,
            backpressure.drop_of(self.websocket.ws.scope),
            let_go,
            self._drop_operations,
            frames=settings.send_queue_frames,
            slow_seconds=settings.slow_client_seconds,
            buffered=backpressure.buffered_of(self.websocket.ws.scope),
        )
        view.sockets.add(self)
        try:
            with self.context.services.metrics.websocket(self.protocol):
                await super().handle()  # type: ignore[misc]
        finally:
            view.sockets.discard(self)
            await queued.finish()

    async def _refuse_operation(self, operation_id: str, error: dict[str, Any]) -> None:
        """Answers one operation with an error; the socket stays open."""
        raise NotImplementedError

    def _operation_ids(self) -> list[str]:
        raise NotImplementedError

    async def _drop_operations(self) -> None:
        """Stops every operation of a client let go for reading too slowly."""
        for operation_id in self._operation_ids():
            await self.cleanup_operation(operation_id)  # type: ignore[attr-defined]

    def _running(self) -> int:
        """The operations this connection carries now."""
        raise NotImplementedError

    async def _over_connection_limit(self, operation_id: str) -> bool:
        """Whether the connection carries as many operations as it may
        (`MIFAMILIAS_MAX_SUBSCRIPTIONS_PER_CONNECTION`); if so the new one is
        refused with RATE_LIMITED and the socket stays open."""
        limit = self.context.services.settings.max_subscriptions_per_connection
        if self._running() < limit:
            return False
        message = (
            f"this connection already carries {limit} operations, the most there may be; "
            "end one before starting another"
        )
        await self._refuse_operation(
            operation_id, {"message": message, "extensions": {"code": "RATE_LIMITED", "limit": limit}}
        )
        return True

    async def _persisted(self, message: Any) -> Any | None:
        """The subscribe (or start) message with the document it names in
        `payload.query`; None when it was refused (the refusal is sent)."""
        if not self.connection_acknowledged:
            return message  # the protocol's handler closes with 4401
        payload = message["payload"]
        try:
            query = await persisted_query(
                self.context, payload.get("query"), payload.get("extensions"), payload.get("operationName")
            )
        except ApiError as error:
            extensions = {"code": error.code, **error.extensions}
            await self._refuse_operation(message["id"], {"message": error.message, "extensions": extensions})
            return None
        if query == payload.get("query"):
            return message
        return {**message, "payload": {**payload, "query": query}}

    # Both protocols' handlers name these two hooks alike; `super()` reaches the
    # protocol's own handler, which comes after this class in the MRO.

    async def handle_message(self, message: Any) -> None:
        if not _well_formed(message):
            await self.websocket.close(code=4400, reason="malformed message")
            return
        await super().handle_message(message)  # type: ignore[misc]

    async def handle_connection_init(self, message: Any) -> None:
        if self._may_sign_in(message):
            reason = await socket_auth.sign_in(self.context, message.get("payload") or {})
            if reason is not None:
                await self._refuse(reason)
                return
        await super().handle_connection_init(message)  # type: ignore[misc]
        if self.connection_acknowledged and self.expiry is None:
            self.expiry = _close_when_expired(self.context, self._expire)

    async def _expired(self) -> bool:
        if self.connection_acknowledged and self.context.signed_in_error() is not None:
            await self._expire()
            return True
        return False

    def _stop_watching(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()

    # schema.frames.Socket: shared events' frames, in order with every other message.

    def live(self, operation_id: str) -> bool:
        raise NotImplementedError

    async def send_frame(self, frame: str) -> None:
        queued: backpressure.QueuedSocket = self.websocket
        await queued.send_now(frame)

    async def send_frame_at_once(self, frame: str) -> None:
        queued: backpressure.QueuedSocket = self.websocket
        await queued.send_at_once(frame)

    def backed_up(self) -> bool:
        queued: backpressure.QueuedSocket = self.websocket
        return queued.backed_up()

    async def room(self) -> bool:
        queued: backpressure.QueuedSocket = self.websocket
        return await queued.room()


class TransportWSHandler(_Guarded, BaseGraphQLTransportWSHandler[Context, None]):
    """graphql-transport-ws: a refused sign-in, or an expired token, closes with
    4403 and the reason; the server sends a `ping` every keep-alive interval."""

    protocol = GRAPHQL_TRANSPORT_WS_PROTOCOL
    pinger: asyncio.TimerHandle | None = None

    def _may_sign_in(self, message: Any) -> bool:
        return (
            isinstance(message.get("payload", {}), dict)
            and not self.connection_init_received
            and not self.connection_timed_out
        )

    async def _refuse(self, reason: str) -> None:
        await self.websocket.close(code=socket_auth.close_code(reason), reason=reason)

    async def handle_connection_init(self, message: Any) -> None:
        await super().handle_connection_init(message)
        if self.connection_acknowledged and self.pinger is None:
            self._ping_every(float(self.view.keep_alive_interval or 12))

    def _ping_every(self, interval: float) -> None:
        """Strawberry answers pings but sends none; proxies close sockets that
        stay silent, so the server speaks first."""

        async def ping() -> None:
            try:
                await self.send_message({"type": "ping"})
            except Exception:
                return  # the socket went away: nothing to keep alive
            if self.pinger is not None:  # not shut down meanwhile
                self.pinger = _after(interval, ping)

        self.pinger = _after(interval, ping)

    async def _refuse_operation(self, operation_id: str, error: dict[str, Any]) -> None:
        message: Any = {"id": operation_id, "type": "error", "payload": [error]}
        await self.send_message(message)

    def _operation_ids(self) -> list[str]:
        return list(self.operations)

    def _running(self) -> int:
        return len(self.operations)

    def live(self, operation_id: str) -> bool:
        operation = self.operations.get(operation_id)
        return operation is not None and not operation.completed

    async def handle_subscribe(self, message: Any) -> None:
        if await self._expired() or (
            self.connection_acknowledged and await self._over_connection_limit(message["id"])
        ):
            return
        if (message := await self._persisted(message)) is not None:
            with _keyed(message), _framed(self, message, "next"):
                await super().handle_subscribe(message)

    async def shutdown(self) -> None:
        self._stop_watching()
        pinger, self.pinger = self.pinger, None
        if pinger is not None:
            pinger.cancel()
        await super().shutdown()


class _AnyOperation:
    """The schema as the legacy handler sees it: its `subscribe` runs queries
    and mutations too (one `data`, then `complete`), where Strawberry's allows
    subscriptions only."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema

    async def subscribe(self, query: str | None, **kwargs: Any) -> Any:
        return await self.schema.stream(
            query,
            **kwargs,
            allowed_operation_types=(OperationType.QUERY, OperationType.MUTATION, OperationType.SUBSCRIPTION),
        )


class LegacyWSHandler(_Guarded, BaseGraphQLWSHandler[Context, None]):
    """subscriptions-transport-ws (graphql-ws): a refused sign-in, or an expired
    token, gets `connection_error` with the reason, then a close with it; the
    server sends `ka` every keep-alive interval (Strawberry's `keep_alive`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schema = _AnyOperation(self.schema)  # type: ignore[assignment]

    protocol = GRAPHQL_WS_PROTOCOL

    def _may_sign_in(self, message: Any) -> bool:
        return isinstance(message.get("payload"), dict | None)

    async def _refuse(self, reason: str) -> None:
        await self.send_message({"type": "connection_error", "payload": {"message": reason}})
        await self.websocket.close(code=socket_auth.close_code(reason), reason=reason)

    async def handle_connection_init(self, message: Any) -> None:
        if self.connection_acknowledged:
            # Strawberry would sign in again (another person on the same
            # subscriptions) and start a second keep-alive: one init per socket.
            await self.websocket.close(code=4429, reason="Too many initialisation requests")
            return
        await super().handle_connection_init(message)

    async def _refuse_operation(self, operation_id: str, error: dict[str, Any]) -> None:
        message: Any = {"type": "error", "id": operation_id, "payload": error}
        await self.send_message(message)

    def _operation_ids(self) -> list[str]:
        return list(self.tasks)

    def _running(self) -> int:
        return len(self.tasks)

    def live(self, operation_id: str) -> bool:
        return operation_id in self.tasks

    async def handle_start(self, message: Any) -> None:
        if await self._expired() or (
            self.connection_acknowledged and await self._over_connection_limit(message["id"])
        ):
            return
        if (message := await self._persisted(message)) is not None:
            with _keyed(message), _framed(self, message, "data"):
                await super().handle_start(message)

    async def cleanup(self) -> None:
        self._stop_watching()
        await super().cleanup()


def _is_subscription(request_data: Any) -> bool:
    """Whether the operation a plain HTTP request names is a subscription."""
    from schema import names_subscription

    return names_subscription(request_data.query, request_data.operation_name)


class SocketsToTheView:
    """The view's WebSockets taken to it straight, past Starlette's middleware
    and router. A connection holds each ASGI layer's coroutine frame for its
    whole life (about 2.5 KB in all, measured with tracemalloc), and none of
    those layers acts on a WebSocket: the error middleware re-raises, CORS
    lets it through, the exception middleware and the router only find the
    view. `sockets` is the view inside what the request middleware does for a
    socket (its log context: `RequestObservability`). This only picks which
    app a connection goes to: it returns that app's coroutine rather than
    awaiting it, so it holds no frame of its own either."""

    def __init__(self, app: ASGIApp, sockets: ASGIApp, path: str = "/graphql") -> None:
        self.app = app
        self.sockets = sockets
        self.path = path

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] == "websocket" and scope.get("path") == self.path:
            scope["app"] = self.app  # as Starlette sets it for what it serves
            return self.sockets(scope, receive, send)
        return self.app(scope, receive, send)


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
        keepalive_seconds: float = 12.0,
        schema: Any = None,
        **kwargs: Any,
    ) -> None:
        if schema is None:
            from schema import schema

        super().__init__(
            schema,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL, *streams.PROTOCOLS),
            keep_alive=True,
            keep_alive_interval=keepalive_seconds,
            connection_init_wait_timeout=timedelta(seconds=10),
            **kwargs,
        )
        self.stream_transport_classes_by_protocol = streams.transports(keepalive_seconds)
        self._services = services_ref
        self.max_body_bytes = max_body_bytes
        # Open WebSocket connections (their protocol handlers), for `going_away`.
        self.sockets: set[_Guarded] = set()
        self.closing = False

    async def going_away(self) -> None:
        """Closes every open WebSocket with 1001 "going away", and any that
        opens from now on, so clients reconnect to another process."""
        self.closing = True
        sockets = list(self.sockets)
        results = await asyncio.gather(
            *(socket.websocket.close(code=GOING_AWAY, reason="going away") for socket in sockets),
            return_exceptions=True,
        )
        closed = sum(1 for result in results if not isinstance(result, BaseException))
        if sockets:
            log.info("closed %d of %d WebSocket connections with 1001 going away", closed, len(sockets))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        response = await self._http(scope, receive)
        # A client let go for reading too slowly was counted and logged then.
        with contextlib.suppress(backpressure.SlowClientLetGo):
            await response(scope, receive, send)

    async def create_streaming_response(
        self,
        request: Request | WebSocket,
        stream: Callable[[], AsyncIterator[str]],
        sub_response: Response,
        headers: Mapping[str, str],
    ) -> Response:
        """A streamed subscription whose client must keep reading (`backpressure`)."""
        services = self._services()
        kind = "sse" if "text/event-stream" in headers.get("Content-Type", "") else "multipart"

        def let_go(why: str) -> None:
            services.metrics.slow_client_closed(kind, why)
            log.warning("let a slow %s client go (%s)", kind, why)

        return backpressure.PacedStreamingResponse(
            stream(),
            status_code=sub_response.status_code or 200,
            headers={**sub_response.headers, **headers},
            slow_seconds=services.settings.slow_client_seconds,
            drop=backpressure.drop_of(request.scope),
            let_go=let_go,
        )

    async def _http(self, scope: Scope, receive: Receive) -> Response:
        limit = self.max_body_bytes
        request = Request(scope, receive=limited(receive, limit))
        media_type = request.state.media_type = response_media_type(request.headers.get("accept"))

        def refused(body: dict[str, Any], status_code: int) -> Response:
            if media_type == GRAPHQL_RESPONSE:
                body.pop("data", None)  # a request error has no `data` entry in this media type
            return JSONResponse(body, status_code=status_code)

        def too_large() -> Response:
            return refused(error_body(f"the request body is larger than {limit} bytes", maxBytes=limit), 413)

        declared = dict(scope.get("headers") or {}).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            response = too_large()
        else:
            try:
                response = await self.run(request)
            except BodyTooLarge:
                response = too_large()
            except Refused as refusal:
                response = refused(refusal.body(), refusal.status_code)
            except HTTPException as error:
                response = refused(error_body(error.reason), error.status_code)
        if media_type != JSON and response.media_type == JSON:
            # Strawberry's answer and our refusals are JSON: the same bytes, under
            # the media type asked for (a request error's status is set by
            # process_result).
            response.headers["content-type"] = media_type
            status = getattr(request.state, "status", None)
            if status is not None:
                response.status_code = status
        return response

    async def process_result(self, request: Any, result: Any) -> Any:
        processed = await super().process_result(request, result)
        if getattr(request.state, "media_type", JSON) == GRAPHQL_RESPONSE and is_request_error(result):
            request.state.status = _request_error_status(result.errors)
            processed.pop("data", None)
        return processed

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
        if not isinstance(data, list) and not data.query and not _hash_sent(data.extensions):
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
        if isinstance(request_data, list):  # (batches are off; were they on, each would be checked)
            request_data = [await self._persisted(context, data) for data in request_data]
        else:
            request_data = await self._persisted(context, request_data)
            # This request's own task: the key is this operation's alone.
            header = request.headers.get("idempotency-key") if hasattr(request, "headers") else None
            idempotency.requested_key.set(header or _idempotency_key(request_data.extensions))
        protocol = getattr(request_data, "protocol", None)
        if protocol == "http" and _is_subscription(request_data):
            raise HTTPException(400, SUBSCRIBE_OVER_HTTP)
        result = await super().execute_operation(
            request, request_adapter, request_data, context, root_value, sub_response
        )
        expires_at = context.claims.expires_at if context.claims else None
        if protocol in streams.STREAMED and expires_at is not None and isinstance(result, AsyncGenerator):
            return streams.until_expiry(result, expires_at)
        return result

    @staticmethod
    async def _persisted(context: Context, request_data: GraphQLRequestData) -> GraphQLRequestData:
        try:
            query = await persisted_query(
                context, request_data.query, request_data.extensions, request_data.operation_name
            )
        except ApiError as error:
            raise Refused(error) from None
        if query == request_data.query:
            return request_data
        return dataclasses.replace(request_data, query=query)

    def encode_json(self, data: object) -> str:
        # orjson is several times faster than json on results; a str keeps
        # WebSocket frames textual, as graphql-ws clients expect.
        return orjson.dumps(data).decode()

    def decode_json(self, data: str | bytes) -> object:
        return orjson.loads(data)

    def should_render_graphql_ide(self, request: Any) -> bool:
        """A browser opening /graphql gets GraphiQL, also with a `query` parameter (the
        page's own, as in GraphiQL's classic links); other GETs with one run it. A GET
        holding a persisted query's hash is an operation. With GraphiQL off (trusted
        documents), Strawberry answers a browser 404."""
        if request.query_params.get("extensions"):
            return False
        if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
            return True
        return bool(super().should_render_graphql_ide(request))

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
        # The handlers signed the socket in before this (`_Guarded`), where
        # they can say why they refuse; this only makes sure of it.
        if context.signed_in_error() is not None:
            raise ConnectionRejectionError({"message": socket_auth.NOT_VALID})
        return None
