"""How many live subscriptions one person may hold, against a real server
process over real sockets: at most PER_PERSON across every connection and
transport, at most PER_CONNECTION on one WebSocket. The next one is refused
with RATE_LIMITED, on graphql-transport-ws as an `error` message for its id,
and the connection stays open; a subscription that ends gives its place back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.servers import SECRET, ServerProcess, token
from tests.test_transports import (
    LEGACY_WS,
    MULTIPART,
    SSE,
    STATUS,
    TRANSPORT_WS,
    WAIT,
    Socket,
    an_uploading_note,
    bearer,
    connect,
    multipart_results,
    next_result,
    no_traceback,
    sse_results,
)

PER_PERSON = 4
PER_CONNECTION = 2
UPLOADING = {"data": {"contentStatusChanged": {"status": "UPLOADING"}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("stream-limits"),
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_MAX_SUBSCRIPTIONS_PER_PERSON": str(PER_PERSON),
            "MIFAMILIAS_MAX_SUBSCRIPTIONS_PER_CONNECTION": str(PER_CONNECTION),
        },
    ).start()
    try:
        yield process
    finally:
        process.stop()


def refused(result: Any) -> bool:
    errors: Any = result.get("errors") if isinstance(result, dict) else result
    return bool(errors) and errors[0]["extensions"]["code"] == "RATE_LIMITED"


class Subscriber:
    """One person's subscriptions on one transport: `open` starts one more and
    answers its first result (the content's status now, or the refusal)."""

    def __init__(self, server: ServerProcess, user: str, transport: str, content_id: str) -> None:
        self.server = server
        self.user = user
        self.transport = transport
        self.content_id = content_id
        self.stack = contextlib.AsyncExitStack()
        self.sockets: list[tuple[Socket, int]] = []
        self.streams: list[contextlib.AsyncExitStack] = []
        self.readers: list[Any] = []
        self.count = 0

    async def __aenter__(self) -> Subscriber:
        self.client = await self.stack.enter_async_context(httpx.AsyncClient(timeout=WAIT))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for stream in self.streams:
            await stream.aclose()
        for socket, _ in self.sockets:
            await socket.connection.close()
        await self.stack.aclose()

    async def socket(self) -> Socket:
        """A socket with room on it, opened when none has."""
        for index, (socket, carried) in enumerate(self.sockets):
            if carried < PER_CONNECTION:
                self.sockets[index] = (socket, carried + 1)
                return socket
        socket = await self.new_socket()
        self.sockets[-1] = (socket, 1)
        return socket

    async def new_socket(self) -> Socket:
        protocol = TRANSPORT_WS if self.transport == "graphql-transport-ws" else LEGACY_WS
        socket = await connect(self.server, protocol, {"Authorization": f"Bearer {token(self.user)}"})
        assert (await socket.receive())["type"] == "connection_ack"
        self.sockets.append((socket, 0))
        return socket

    async def open(self, socket: Socket | None = None) -> Any:
        self.count += 1
        if self.transport in ("graphql-transport-ws", "graphql-ws"):
            return await self.subscribe(socket or await self.socket(), f"s{self.count}")
        accept, read = (SSE, sse_results) if self.transport == "sse" else (MULTIPART, multipart_results)
        stream = contextlib.AsyncExitStack()
        response = await stream.enter_async_context(
            self.client.stream(
                "POST",
                f"{self.server.url}/graphql",
                json={"query": STATUS, "variables": {"id": self.content_id}},
                headers={**accept, **bearer(self.user)},
            )
        )
        self.streams.append(stream)
        results = read(response)
        self.readers.append(results)  # a reader let go of closes its response
        return await next_result(results)

    async def subscribe(self, socket: Socket, operation_id: str) -> Any:
        legacy = self.transport == "graphql-ws"
        payload = {"query": STATUS, "variables": {"id": self.content_id}}
        await socket.send(
            {"id": operation_id, "type": "start" if legacy else "subscribe", "payload": payload}
        )
        while (message := await socket.receive())["type"] in ("ka", "ping") or (
            message["type"] == "complete" and message.get("id") != operation_id
        ):
            pass  # keep-alives, and the ends of operations that went before
        assert message["id"] == operation_id, message
        if message["type"] == "error":
            # graphql-transport-ws: a list of errors; graphql-ws: one error.
            errors = message["payload"] if isinstance(message["payload"], list) else [message["payload"]]
            return {"errors": errors, "type": "error"}
        assert message["type"] in ("next", "data"), message
        return message["payload"]

    async def end_one(self) -> None:
        """Ends the first subscription opened."""
        if self.streams:
            await self.readers.pop(0).aclose()
            await self.streams.pop(0).aclose()
            return
        socket, _ = self.sockets[0]
        legacy = self.transport == "graphql-ws"
        await socket.send({"id": "s1", "type": "stop" if legacy else "complete"})


TRANSPORTS = ["graphql-transport-ws", "graphql-ws", "sse", "multipart"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_next_subscription_past_the_person_limit_is_refused(
    server: ServerProcess, transport: str
) -> None:
    user = f"many-{transport}"
    content_id = await an_uploading_note(server, user)
    async with Subscriber(server, user, transport, content_id) as subscriber:
        for _ in range(PER_PERSON):
            assert await subscriber.open() == UPLOADING
        over = await subscriber.open()
        assert refused(over), over
        assert f"{PER_PERSON} live subscriptions" in over["errors"][0]["message"]
        if transport == "graphql-transport-ws":
            assert over["type"] == "error"  # an `error` message for that id
        # The connection that carried the refusal is open: it still answers.
        if transport in ("graphql-transport-ws", "graphql-ws"):
            socket = subscriber.sockets[-1][0]
            start = "subscribe" if transport == "graphql-transport-ws" else "start"
            await socket.send({"id": "me", "type": start, "payload": {"query": "{ me { id } }"}})
            while (message := await socket.receive())["type"] in ("ka", "ping"):
                pass
            assert message["payload"]["data"] == {"me": {"id": user}}, message
        # One ends: its place is given back (once the server has seen it end).
        await subscriber.end_one()
        result = await subscriber.open()
        for _ in range(WAIT * 10):
            if not refused(result):
                break
            result = await subscriber.open()
        assert result == UPLOADING
    no_traceback(server)


async def test_the_person_limit_holds_across_transports(server: ServerProcess) -> None:
    user = "everywhere"
    content_id = await an_uploading_note(server, user)
    async with contextlib.AsyncExitStack() as stack:
        subscribers = [
            await stack.enter_async_context(Subscriber(server, user, transport, content_id))
            for transport in TRANSPORTS
        ]
        for subscriber in subscribers:
            assert await subscriber.open() == UPLOADING
        for subscriber in subscribers:
            result = await subscriber.open()
            assert refused(result), (subscriber.transport, result)


@pytest.mark.parametrize("transport", ["graphql-transport-ws", "graphql-ws"])
async def test_the_next_operation_past_the_connection_limit_is_refused(
    server: ServerProcess, transport: str
) -> None:
    user = f"one-socket-{transport}"
    content_id = await an_uploading_note(server, user)
    async with Subscriber(server, user, transport, content_id) as subscriber:
        socket = await subscriber.new_socket()
        for _ in range(PER_CONNECTION):
            assert await subscriber.open(socket) == UPLOADING
        over = await subscriber.open(socket)
        assert over["type"] == "error" and refused(over), over
        assert "this connection" in over["errors"][0]["message"]
        # Another connection of the same person still has room.
        assert await subscriber.open(await subscriber.new_socket()) == UPLOADING
