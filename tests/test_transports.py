"""Every way to subscribe, against a real server process over real sockets:
the server's keep-alives on both WebSocket protocols, and queries and
mutations over the legacy one.

The server beats every half second, so that keep-alives are seen without
waiting long."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from websockets.typing import Subprotocol

from resolvers.core.auth import mint_token
from tests.servers import SECRET, ServerProcess

TRANSPORT_WS = Subprotocol("graphql-transport-ws")
LEGACY_WS = Subprotocol("graphql-ws")
WAIT = 30  # seconds; bounds a failure only


def token(user: str, **claims: Any) -> str:
    claims.setdefault("given_name", user.capitalize())
    return mint_token(SECRET, user, **claims)


def bearer(user: str, **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(user, **claims)}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("transports"),
        {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_KEEPALIVE_SECONDS": "0.5"},
    ).start()
    try:
        yield process
    finally:
        process.stop()


def no_traceback(server: ServerProcess) -> None:
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


# WebSockets ------------------------------------------------------------------------------


class Socket:
    """A raw WebSocket speaking JSON frames."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    async def receive(self) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(await asyncio.wait_for(self.connection.recv(), WAIT))
        return message

    async def closed(self) -> tuple[int, str]:
        """The close frame's code and reason, once the server closes."""
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                message = await self.receive()
                assert message["type"] in ("ka", "ping"), message
        assert closed.value.rcvd is not None
        return closed.value.rcvd.code, closed.value.rcvd.reason


async def connect(
    server: ServerProcess,
    protocol: Subprotocol,
    payload: dict[str, Any] | None,
    headers: dict[str, str] | None = None,
) -> Socket:
    connection = await websockets.connect(server.ws_url, subprotocols=[protocol], additional_headers=headers)
    socket = Socket(connection)
    await socket.send({"type": "connection_init"} | ({} if payload is None else {"payload": payload}))
    return socket


# WebSockets: keep-alives and queries over the legacy protocol -----------------------------


async def test_the_server_pings_an_idle_graphql_transport_ws_socket(server: ServerProcess) -> None:
    socket = await connect(server, TRANSPORT_WS, bearer("eva"))
    assert (await socket.receive())["type"] == "connection_ack"
    for _ in range(2):
        assert await socket.receive() == {"type": "ping"}
        await socket.send({"type": "pong"})
    await socket.connection.close()


async def test_the_server_sends_ka_on_an_idle_graphql_ws_socket(server: ServerProcess) -> None:
    socket = await connect(server, LEGACY_WS, bearer("eva"))
    assert (await socket.receive())["type"] == "connection_ack"
    for _ in range(3):  # the first right after the ack, then one each interval
        assert await socket.receive() == {"type": "ka"}
    await socket.connection.close()


async def test_queries_and_mutations_run_over_graphql_ws_with_data_then_complete(
    server: ServerProcess,
) -> None:
    socket = await connect(server, LEGACY_WS, bearer("fer"))
    assert (await socket.receive())["type"] == "connection_ack"

    async def run(operation_id: str, query: str) -> list[dict[str, Any]]:
        await socket.send({"id": operation_id, "type": "start", "payload": {"query": query}})
        answers: list[dict[str, Any]] = []
        while not answers or answers[-1]["type"] not in ("complete", "error"):
            message = await socket.receive()
            if message["type"] != "ka":
                answers.append(message)
        return answers

    assert await run("1", "{ me { id } }") == [
        {"type": "data", "id": "1", "payload": {"data": {"me": {"id": "fer"}}}},
        {"type": "complete", "id": "1"},
    ]
    assert await run("2", 'mutation { updateProfile(input: {givenName: "Fernanda"}) { givenName } }') == [
        {"type": "data", "id": "2", "payload": {"data": {"updateProfile": {"givenName": "Fernanda"}}}},
        {"type": "complete", "id": "2"},
    ]
    # The same limits as everywhere: an operation over the cost budget runs nothing.
    costly = (
        "{ myFamilies { family { feed(first: 100) { edges { node {"
        " comments(first: 100) { edges { node { id } } } } } } } } }"
    )
    refused = await run("3", costly)
    assert [message["type"] for message in refused] == ["data", "complete"]
    assert refused[0]["payload"]["data"] is None
    error = refused[0]["payload"]["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and error["extensions"]["cost"]["limit"] == 5000
    await socket.connection.close()
    no_traceback(server)
