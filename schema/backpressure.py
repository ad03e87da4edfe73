"""Slow clients never hold anyone else.

A phone in a tunnel stops reading its socket; once the kernel's buffers are
full, every send to it waits. Nothing shared may wait with it, so:

- every WebSocket connection sends through its own bounded queue
  (`QueuedSocket`): an operation hands a frame over without waiting, and one
  writer task per connection takes frames to the socket;
- an SSE or multipart stream's sends are timed (`PacedStreamingResponse`): the
  stream's own generator waits for its socket, and holds nothing shared while
  it does (`resolvers.processes.live` takes its read slots for the reads only);
- a client that is not taking what it was sent is not executed for: an
  operation's next event waits until its socket takes what is ahead of it
  (`QueuedSocket.room`), before it is executed or encoded, so a subscriber
  that stops reading costs nothing more than the one event it waits with
  (an SSE or multipart stream waits at its send the same way);
- a client whose queue is full, or whose socket has taken nothing for
  `MIFAMILIAS_SLOW_CLIENT_SECONDS`, is let go: a WebSocket is closed with 4408
  "slow client", a stream ends. Its events are not lost: it resumes with
  `after`. `mifamilias_slow_clients_closed` counts them.

A socket that takes nothing cannot take a close frame either, nor the FIN
of an ordinary close: both wait behind what the kernel holds for the client.
So a let-go connection is dropped at the TCP level (`ConnectionHandles`): from
its letting go, any close of it resets the connection and discards what is
queued for the client, and it is aborted at the latest `slow_seconds` later.
A let-go WebSocket's operations stop at once and its close is written when the
socket takes it, so a client that reads again within that time learns why; a
let-go stream is dropped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import struct
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, cast

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from schema.strawberry_internals import AsyncWebSocketAdapter, WebSocketDisconnected

log = logging.getLogger("mifamilias.transport")

SLOW_CLOSE_CODE = 4408
SLOW_REASON = "slow client: it read nothing for too long; reconnect and resume with `after`"

DROP_KEY = "mifamilias.drop"
BUFFERED_KEY = "mifamilias.buffered"
# Drops a let-go connection: now (0), or at the latest this many seconds from now.
Drop = Callable[[float], None]
LetGo = Callable[[str], None]  # called with why: "queue_full" or "stalled"
# The messages that carry an operation's result, in either protocol: what
# waits for the client's room (`QueuedSocket.room`).
RESULT_TYPES = frozenset({"next", "data"})


class ConnectionHandles:
    """Puts the server connection's handles in the scope: how to drop it
    (`drop_of`) when its client will not even take a close frame, and how
    much its transport holds unsent (`buffered_of`).

    The outermost middleware sees the server's own `send`, from which
    `server_transport` finds the connection's transport. Under a server where
    it finds none, nothing is added and a slow client is only closed the ASGI
    way."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            transport = server_transport(send)
            if transport is not None:
                scope[DROP_KEY] = functools.partial(drop_connection, transport)
                scope[BUFFERED_KEY] = transport.get_write_buffer_size
        await self.app(scope, receive, send)


def server_transport(send: Send) -> asyncio.Transport | None:
    """The asyncio transport of the connection `send` writes to, or None.

    The one place that relies on uvicorn's internals, which ASGI does not
    expose: uvicorn's `send` is a bound method (of the connection's protocol
    for a WebSocket, of the request's cycle for HTTP) whose object holds the
    connection's transport as `.transport`. `tests/test_slow_clients.py`
    checks it under each of uvicorn's HTTP and WebSocket implementations."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    # Duck-typed: uvloop's transports (uvicorn's loop where uvloop is
    # installed, as here) are not asyncio.Transport subclasses.
    wanted = ("abort", "get_extra_info", "get_write_buffer_size")
    if all(callable(getattr(transport, name, None)) for name in wanted):
        return cast(asyncio.Transport, transport)
    return None


def drop_connection(transport: asyncio.Transport, within: float) -> None:
    """Drops a let-go client's connection without waiting for it to take
    what is queued: from now on any close of the socket resets it (SO_LINGER
    0) and the kernel discards what it held for the client, and the transport
    is aborted `within` seconds from now at the latest (at once for 0).

    asyncio's `abort` alone discards the transport's own buffer but closes
    the socket the ordinary way: the kernel keeps it, with up to its send
    buffer's megabytes and a FIN behind them, for as long as the client
    acknowledges window probes without reading. The reset releases it."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Closed already (the client read as far as the close and went):
        # nothing to drop (asyncio says OSError, uvloop ValueError).
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if within <= 0:
        transport.abort()
    else:
        # A no-op if the connection has ended by then.
        asyncio.get_running_loop().call_later(within, transport.abort)


def drop_of(scope: Mapping[str, Any]) -> Drop:
    drop = scope.get(DROP_KEY)
    return drop if callable(drop) else _keep


def _keep(within: float) -> None:
    return None


def buffered_of(scope: Mapping[str, Any]) -> Callable[[], int]:
    """How many bytes the connection's transport holds unsent (asyncio's
    `get_write_buffer_size`); under a server that does not expose it, always
    some, so every send is timed."""
    buffered = scope.get(BUFFERED_KEY)
    return buffered if callable(buffered) else _some


def _some() -> int:
    return 1


class QueuedSocket(AsyncWebSocketAdapter):
    """A WebSocket whose frames go out through a bounded queue and one writer
    task, so `send_json` never waits for the client."""

    def __init__(
        self,
        inner: AsyncWebSocketAdapter,
        drop: Drop,
        let_go: LetGo,
        drop_operations: Callable[[], Awaitable[None]],
        *,
        frames: int,
        slow_seconds: float,
        buffered: Callable[[], int] = _some,
    ) -> None:
        super().__init__(inner.view)
        self.inner = inner
        self._drop = drop
        self._buffered = buffered
        self._let_go_hook = let_go
        self._drop_operations = drop_operations
        # Made for a burst of frames and dropped with its writer once they are
        # out: an idle socket (most of them, for hours) holds neither.
        self._queue: asyncio.Queue[Mapping[str, object] | str] | None = None
        self._frames = frames
        self._slow_seconds = slow_seconds
        self._writer: asyncio.Task[None] | None = None
        self._sending = False  # a caller's task is writing a frame itself (`send_now`)
        self._room_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self.let_go = False

    def iter_json(self, *, ignore_parsing_errors: bool = False) -> AsyncGenerator[object, None]:
        return self.inner.iter_json(ignore_parsing_errors=ignore_parsing_errors)

    async def send_json(self, message: Mapping[str, object]) -> None:
        if message.get("type") in RESULT_TYPES and not await self.room():
            # The operation's task: it pulls its next event only once this
            # one is handed over, so waiting here paces its executions.
            return
        self.send_frame(message)

    def backed_up(self) -> bool:
        """Whether the client is not taking what was sent: frames are going
        out (queued, or written by a caller) and the transport holds bytes
        the socket did not take."""
        return not self._closed and (self._queue is not None or self._sending) and self._buffered() > 0

    async def room(self) -> bool:
        """Waits while the client is backed up, so that nothing is executed
        or encoded for it until it takes what is ahead; a client that takes
        nothing for `slow_seconds` is let go. Whether frames may still go to
        it (False: it was let go or went away). Only an operation's own task
        waits here, and it holds nothing shared."""
        if self.backed_up():
            try:
                async with asyncio.timeout(self._slow_seconds):
                    while self.backed_up():
                        waiter = asyncio.get_running_loop().create_future()
                        self._room_waiters.append(waiter)
                        await waiter
            except TimeoutError:
                self._give_up("stalled")
        return not self._closed

    def _make_room(self) -> None:
        """Wakes the operations waiting for room: what was ahead went out (or
        the socket closed, and their frames go nowhere)."""
        waiters, self._room_waiters = self._room_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def send_frame(self, message: Mapping[str, object] | str) -> None:
        """Queues a message, or a text frame already encoded (`schema.frames`)."""
        # Never raises: an operation's frame to a closed or let-go socket has
        # nobody to go to, and its operation is being stopped.
        if self._closed:
            return
        if self._queue is None:
            self._queue = asyncio.Queue(self._frames)
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self._give_up("queue_full")
            return
        if self._writer is None and not self._sending:
            self._writer = asyncio.create_task(self._write(self._queue))

    async def send_now(self, frame: str) -> None:
        """Writes a text frame from the caller's own task when nothing else is
        going out (an event's frame, as a rule): no queue and no writer task
        for it. Otherwise it is queued behind what is. A client that takes
        nothing for `slow_seconds` is let go as the writer would; the caller
        holds nothing shared meanwhile (the operation's own task)."""
        if self._closed:
            return
        if self._queue is not None or self._sending:
            self.send_frame(frame)
            return
        self._sending = True
        try:
            if self._buffered() == 0:
                # The client has taken everything so far: the transport is not
                # paused, so the send writes at once and cannot wait.
                await self._send_text(frame)
            else:
                async with asyncio.timeout(self._slow_seconds):
                    await self._send_text(frame)
        except TimeoutError:
            self._give_up("stalled")
        except WebSocketDisconnected:
            self._closed = True
        finally:
            self._sending = False
            # What was queued meanwhile goes out after this frame.
            if self._queue is not None and self._writer is None and not self._closed:
                self._writer = asyncio.create_task(self._write(self._queue))
            elif self._queue is None:
                self._make_room()

    async def send_at_once(self, frame: str) -> None:
        """`send_now` when the client has taken everything so far, so the
        frame is written at once; queued for the writer otherwise. For a
        caller that sends many sockets' frames in turn: it never waits for
        one client, even for `slow_seconds`."""
        if self._queue is None and not self._sending and self._buffered() == 0:
            await self.send_now(frame)
        else:
            self.send_frame(frame)

    async def _write(self, queue: asyncio.Queue[Mapping[str, object] | str]) -> None:
        while True:
            if queue.empty():
                # Everything queued is out: the next frame starts another writer.
                self._queue = self._writer = None
                self._make_room()
                return
            message = queue.get_nowait()
            try:
                async with asyncio.timeout(self._slow_seconds):
                    if isinstance(message, str):
                        await self._send_text(message)
                    else:
                        await self.inner.send_json(message)
            except TimeoutError:
                self._give_up("stalled")
                return
            except WebSocketDisconnected:
                self._closed = True
                self._make_room()
                return
            finally:
                queue.task_done()

    async def _send_text(self, frame: str) -> None:
        try:
            await self.inner.ws.send_text(frame)  # type: ignore[attr-defined]
        except WebSocketDisconnect as error:
            raise WebSocketDisconnected from error

    async def close(self, code: int, reason: str) -> None:
        """Closes after the frames queued before the close have gone out (a
        refusal's message, then its close)."""
        if self._closed:
            return
        if self._writer is not None and self._queue is not None:
            try:
                async with asyncio.timeout(self._slow_seconds):
                    await self._queue.join()
            except TimeoutError:
                self._give_up("stalled")
                return
        self._closed = True
        self._stop_writer()
        try:
            await self.inner.close(code, reason)
        except WebSocketDisconnect:
            # The client closed first (a graphql-ws client sends
            # connection_terminate and its close frame at once): the close was
            # answered already, and nothing is left to close.
            return

    def _stop_writer(self) -> None:
        self._make_room()
        if self._writer is not None and self._writer is not asyncio.current_task():
            self._writer.cancel()

    async def finish(self) -> None:
        """Stops the writer once the connection's handler is done with it."""
        self._closed = True
        self._make_room()
        writer, self._writer = self._writer, None
        if writer is not None and writer is not asyncio.current_task():
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    def _give_up(self, why: str) -> None:
        """Lets a slow client go: counted, its queue dropped, its socket closed,
        and its connection dropped within `slow_seconds` whatever else happens."""
        if self._closed:
            return
        self._closed = self.let_go = True
        self._let_go_hook(why)
        self._stop_writer()
        self._queue = None  # what it held goes nowhere now
        # From now: the bound holds even if stopping its operations or writing
        # its close waits, and whoever closes the socket (the close handshake,
        # the WebSocket library's own timeouts) releases what it queues.
        self._drop(self._slow_seconds)
        deadline = asyncio.get_running_loop().time() + self._slow_seconds
        task = asyncio.create_task(self._close_slow(deadline))
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    async def _close_slow(self, deadline: float) -> None:
        # Its operations stop now (their subscriptions and channels with them);
        # the close frame goes out once the socket takes it, which it does
        # when the client reads again: it then learns why. By the deadline
        # the connection is dropped (`_give_up`), and its handler ends too:
        # its read sees the disconnect.
        await self._drop_operations()
        with contextlib.suppress(Exception):
            async with asyncio.timeout_at(deadline):
                await self.inner.close(SLOW_CLOSE_CODE, SLOW_REASON)


# Let-go closes still running; kept so that they are not collected mid-way.
_closing: set[asyncio.Task[None]] = set()


class SlowClientLetGo(Exception):
    """A stream's client was let go: its response ends here."""


class PacedStreamingResponse(StreamingResponse):
    """A streamed subscription (SSE or multipart) whose every send must be
    taken within `slow_seconds`; a client that takes nothing for that long is
    let go and its stream ends (the connection is dropped at once: it cannot
    take even the stream's last bytes, and HTTP has no close reason to wait
    for)."""

    def __init__(self, *args: Any, slow_seconds: float, drop: Drop, let_go: LetGo, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slow_seconds = slow_seconds
        self._drop = drop
        self._let_go_hook = let_go
        self.let_go = False

    async def stream_response(self, send: Send) -> None:
        async def paced(message: Message) -> None:
            try:
                async with asyncio.timeout(self._slow_seconds):
                    await send(message)
            except TimeoutError:
                self.let_go = True
                self._let_go_hook("stalled")
                self._drop(0)
                await asyncio.sleep(0)  # the server sees the connection lost first
                raise SlowClientLetGo from None

        try:
            await super().stream_response(paced)
        finally:
            # Let go while the stream waited at a yield: nothing else closes it
            # (its subscription and channel with it).
            close = getattr(self.body_iterator, "aclose", None)
            if self.let_go and close is not None:
                await close()
