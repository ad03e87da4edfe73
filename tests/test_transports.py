"""Every way to subscribe, against a real server process over real sockets:
the server's keep-alives on both WebSocket protocols, queries and mutations
over the legacy one, and how a socket signs in (each place clients put the
token) or is refused (and why).

The server beats every half second, so that keep-alives are seen without
waiting long."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport
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


async def whoami(socket: Socket, protocol: Subprotocol) -> str:
    start = "subscribe" if protocol == TRANSPORT_WS else "start"
    await socket.send({"id": "me", "type": start, "payload": {"query": "{ me { id } }"}})
    while (message := await socket.receive())["type"] in ("ka", "ping"):
        pass
    assert message["type"] in ("next", "data"), message
    found: str = message["payload"]["data"]["me"]["id"]
    return found


# Socket sign-in ---------------------------------------------------------------------------

SHAPES = [
    pytest.param(lambda t: {"Authorization": f"Bearer {t}"}, id="Authorization"),
    pytest.param(lambda t: {"Authorization": t}, id="Authorization-without-Bearer"),
    pytest.param(lambda t: {"authorization": f"Bearer {t}"}, id="authorization"),
    pytest.param(lambda t: {"authToken": t}, id="authToken"),
    pytest.param(lambda t: {"authToken": f"Bearer {t}"}, id="authToken-with-Bearer"),
    pytest.param(lambda t: {"headers": {"Authorization": f"Bearer {t}"}}, id="headers.Authorization"),
    pytest.param(lambda t: {"headers": {"authorization": t}}, id="headers.authorization"),
]


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
@pytest.mark.parametrize("shape", SHAPES)
async def test_a_socket_signs_in_with_the_token_where_its_client_puts_it(
    server: ServerProcess, protocol: Subprotocol, shape: Any
) -> None:
    socket = await connect(server, protocol, shape(token("gil")))
    assert (await socket.receive())["type"] == "connection_ack"
    assert await whoami(socket, protocol) == "gil"
    await socket.connection.close()


@pytest.mark.parametrize("protocol", [TRANSPORT_WS, LEGACY_WS])
async def test_a_socket_signs_in_with_the_handshake_authorization_header(
    server: ServerProcess, protocol: Subprotocol
) -> None:
    # As gql-cli sends it: the header on the upgrade request, an empty payload.
    transport = WebsocketsTransport(
        url=server.ws_url,
        headers=bearer("hal"),
        subprotocols=[protocol],
    )
    async with Client(transport=transport) as session:
        assert await session.execute(GraphQLRequest("{ me { id } }")) == {"me": {"id": "hal"}}
    # The payload's token comes first.
    socket = await connect(server, protocol, bearer("ivo"), headers=bearer("hal"))
    assert (await socket.receive())["type"] == "connection_ack"
    assert await whoami(socket, protocol) == "ivo"
    await socket.connection.close()


REFUSALS = [
    pytest.param(None, "send Authorization in connection_init", id="missing"),
    pytest.param({}, "send Authorization in connection_init", id="empty"),
    pytest.param({"Authorization": ""}, "send Authorization in connection_init", id="blank"),
    pytest.param(bearer("jon", ttl_seconds=-5), "token expired", id="expired"),
    pytest.param({"Authorization": "Bearer not-a-token"}, "token not valid", id="garbage"),
    pytest.param(
        {"authToken": mint_token("another-secret-" + "y" * 32, "jon")}, "token not valid", id="foreign"
    ),
    pytest.param({"Authorization": 42}, "token not valid", id="not-text"),
]


@pytest.mark.parametrize(("payload", "reason"), REFUSALS)
async def test_a_refused_graphql_transport_ws_socket_closes_with_the_reason(
    server: ServerProcess, payload: dict[str, Any] | None, reason: str
) -> None:
    socket = await connect(server, TRANSPORT_WS, payload)
    assert await socket.closed() == (4403, reason)


@pytest.mark.parametrize(("payload", "reason"), REFUSALS)
async def test_a_refused_graphql_ws_socket_gets_connection_error_with_the_reason(
    server: ServerProcess, payload: dict[str, Any] | None, reason: str
) -> None:
    socket = await connect(server, LEGACY_WS, payload)
    assert await socket.receive() == {"type": "connection_error", "payload": {"message": reason}}
    assert await socket.closed() == (4403, reason)
    no_traceback(server)


async def test_a_second_connection_init_on_graphql_ws_closes_the_socket(server: ServerProcess) -> None:
    socket = await connect(server, LEGACY_WS, bearer("kim"))
    assert (await socket.receive())["type"] == "connection_ack"
    await socket.send({"type": "connection_init", "payload": bearer("lia")})
    assert await socket.closed() == (4429, "Too many initialisation requests")


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
