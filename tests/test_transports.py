"""Every way to subscribe, against a real server process over real sockets:
Server-Sent Events and multipart HTTP beside the two WebSocket protocols, the
server's keep-alives on each, and how a socket signs in (each place clients put
the token) or is refused (and why).

The server shares live events through Redis, so that a test can see from
outside when a subscription lets go of its channel (PUBSUB NUMSUB), and beats
every half second, so that keep-alives are seen without waiting long."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as redis
import websockets
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport
from websockets.typing import Subprotocol

from resolvers.core.auth import mint_token
from tests.servers import SECRET, ServerProcess, metric_total, token, until, without_cost
from tests.test_live import make_family, upload

TRANSPORT_WS = Subprotocol("graphql-transport-ws")
LEGACY_WS = Subprotocol("graphql-ws")
STATUS = "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }"
SSE = {"Accept": "text/event-stream"}
MULTIPART = {"Accept": 'multipart/mixed; subscriptionSpec="1.0", application/json'}
WAIT = 30  # seconds; bounds a failure only


def bearer(user: str, **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(user, **claims)}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("transports"),
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_REDIS_URL": redis_url,
            "MIFAMILIAS_KEEPALIVE_SECONDS": "0.5",
        },
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


async def test_a_graphql_ws_client_that_terminates_and_closes_at_once_is_let_go_quietly(
    server: ServerProcess,
) -> None:
    socket = await connect(server, LEGACY_WS, bearer("kai"))
    assert (await socket.receive())["type"] == "connection_ack"
    # As gql's client leaves: connection_terminate, then its close frame at once.
    # Written together, the server has read the close (and answered it) before
    # it handles the terminate, whose own close then finds the socket closed.
    protocol = socket.connection.protocol
    protocol.send_text(json.dumps({"type": "connection_terminate"}).encode())
    protocol.send_close(1000)
    socket.connection.transport.write(b"".join(protocol.data_to_send()))

    async def ended() -> bool:
        return await metric_total(server, "mifamilias_websocket_connections", protocol=LEGACY_WS) == 0

    # The handler's count drops after its last step; a traceback would be logged by then.
    await until(ended, "the socket's handler to end")
    no_traceback(server)


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

    assert without_cost(await run("1", "{ me { id } }")) == [
        {"type": "data", "id": "1", "payload": {"data": {"me": {"id": "fer"}}}},
        {"type": "complete", "id": "1"},
    ]
    assert without_cost(
        await run("2", 'mutation { updateProfile(input: {givenName: "Fernanda"}) { givenName } }')
    ) == [
        {"type": "data", "id": "2", "payload": {"data": {"updateProfile": {"givenName": "Fernanda"}}}},
        {"type": "complete", "id": "2"},
    ]
    # The same limits as everywhere: an operation over the cost budget runs nothing.
    costly = (
        '{ family(id: "any") { feed(first: 100) { edges { node {'
        " comments(first: 100) { edges { node { id } } } } } } } }"
    )
    refused = await run("3", costly)
    assert [message["type"] for message in refused] == ["data", "complete"]
    assert refused[0]["payload"]["data"] is None
    error = refused[0]["payload"]["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and error["extensions"]["cost"]["limit"] == 10_000
    await socket.connection.close()
    no_traceback(server)


# Server-Sent Events and multipart HTTP ----------------------------------------------------


@pytest.fixture
async def subscribers(redis_url: str) -> AsyncIterator[Any]:
    """How many server processes listen on a content's channel, as Redis counts them."""
    client = redis.Redis.from_url(redis_url)

    async def count(content_id: str) -> int:
        found = await client.pubsub_numsub(f"mifamilias:content:{content_id}")
        return int(found[0][1])

    yield count
    await client.aclose()


async def until_subscribers(count: Any, content_id: str, expected: int) -> None:
    async def reached() -> bool:
        return bool(await count(content_id) == expected)

    await until(reached, f"{expected} subscribers on {content_id}", WAIT, interval=0.05)


async def an_uploading_note(server: ServerProcess, admin: str) -> str:
    family_id = await make_family(server, admin, [])
    return await upload(server, admin, family_id, "TEXT", b"hola", "text/plain", complete=False)


async def complete_upload(server: ServerProcess, user: str, content_id: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        response = await client.post(
            f"{server.url}/graphql",
            json={
                "query": "mutation($id: ID!) { completeUpload(contentId: $id) { status } }",
                "variables": {"id": content_id},
            },
            headers=bearer(user),
        )
    assert response.status_code == 200 and "errors" not in response.json(), response.text


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) for each event of a text/event-stream, and ("comment", text)
    for each comment line (the heartbeat)."""
    event, data = "", list[str]()
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line == "":
            if event or data:
                yield event or "message", "\n".join(data)
            event, data = "", list[str]()
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


async def multipart_parts(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON body of each part of a multipart/mixed response with the
    boundary "graphql", read as Apollo Client reads it: split at each
    CRLF-dash-dash-boundary, headers, a blank line, the body."""
    assert response.headers["content-type"].startswith("multipart/mixed")
    assert "boundary=graphql" in response.headers["content-type"].replace('"', "")
    delimiter = "\r\n--graphql"
    buffer = ""
    async for chunk in response.aiter_text():
        buffer += chunk
        while (at := buffer.find(delimiter)) != -1:
            part, buffer = buffer[:at], buffer[at + len(delimiter) :]
            headers, blank, body = part.partition("\r\n\r\n")
            if blank and body.strip():
                assert "application/json" in headers.lower(), part
                yield json.loads(body)
    assert buffer.startswith("--"), f"the stream did not end with the closing delimiter: {buffer!r}"


HEARTBEAT = "heartbeat"


async def sse_results(response: httpx.Response) -> AsyncIterator[Any]:
    """The ExecutionResults of an SSE stream, with HEARTBEAT for each
    heartbeat; the stream must end with `complete` if it ends."""
    assert response.headers["content-type"].startswith("text/event-stream")
    async for event, data in sse_events(response):
        if event == "comment":
            assert data == "ping", data
            yield HEARTBEAT
        elif event == "next":
            yield json.loads(data)
        else:
            assert event == "complete", (event, data)
            return
    raise AssertionError("the stream ended without a complete event")


async def multipart_results(response: httpx.Response) -> AsyncIterator[Any]:
    """The ExecutionResults of a multipart subscription, with HEARTBEAT for each `{}` part."""
    async for part in multipart_parts(response):
        if part == {}:
            yield HEARTBEAT
        else:
            assert set(part) == {"payload"}, part
            yield part["payload"]


async def next_result(results: AsyncIterator[Any]) -> Any:
    """The next result, past any heartbeats."""
    while (found := await anext(results)) == HEARTBEAT:
        pass
    return found


async def all_results(results: AsyncIterator[Any]) -> list[Any]:
    return [result async for result in results if result != HEARTBEAT]


def stream_request(
    client: httpx.AsyncClient,
    server: ServerProcess,
    method: str,
    accept: dict[str, str],
    auth: dict[str, str],
) -> Any:
    def open_stream(query: str, variables: dict[str, Any]) -> Any:
        url = f"{server.url}/graphql"
        headers = {**accept, **auth}
        if method == "GET":
            params = {"query": query, "variables": json.dumps(variables)}
            return client.stream("GET", url, params=params, headers=headers)
        return client.stream("POST", url, json={"query": query, "variables": variables}, headers=headers)

    return open_stream


STREAMS = [
    pytest.param("POST", SSE, sse_results, id="sse-post"),
    pytest.param("GET", SSE, sse_results, id="sse-get"),
    pytest.param("POST", MULTIPART, multipart_results, id="multipart"),
]


@pytest.mark.parametrize(("method", "accept", "results"), STREAMS)
async def test_a_subscription_streams_over_http_and_lets_go_when_the_client_leaves(
    server: ServerProcess, subscribers: Any, method: str, accept: dict[str, str], results: Any
) -> None:
    content_id = await an_uploading_note(server, "ana")
    statuses: list[str] = []
    async with httpx.AsyncClient(timeout=WAIT) as client:
        open_stream = stream_request(client, server, method, accept, bearer("ana"))
        async with open_stream(STATUS, {"id": content_id}) as response:
            assert response.status_code == 200, await response.aread()
            events = results(response)
            # The status now, then the live changes.
            assert await next_result(events) == {"data": {"contentStatusChanged": {"status": "UPLOADING"}}}
            await until_subscribers(subscribers, content_id, 1)
            await complete_upload(server, "ana", content_id)
            while not statuses or statuses[-1] != "READY":
                result = await next_result(events)
                assert "errors" not in result, result
                statuses.append(result["data"]["contentStatusChanged"]["status"])
            # Idle now: nothing comes but heartbeats, which keep proxies from closing the stream.
            for _ in range(2):
                assert await anext(events) == HEARTBEAT
            await events.aclose()
        # The client has gone: the server lets go of the subscription and its channel.
        await until_subscribers(subscribers, content_id, 0)
    assert statuses == ["PROCESSING", "READY"]
    no_traceback(server)


@pytest.mark.parametrize(("method", "accept", "results"), STREAMS)
async def test_a_subscription_over_http_needs_a_valid_token(
    server: ServerProcess, subscribers: Any, method: str, accept: dict[str, str], results: Any
) -> None:
    content_id = await an_uploading_note(server, "bea")
    for auth, message in [
        ({}, "sign in: send a Bearer token"),
        ({"Authorization": "Bearer not-a-token"}, "the token is not valid"),
        (bearer("bea", ttl_seconds=-5), "the token has expired"),
    ]:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            open_stream = stream_request(client, server, method, accept, auth)
            async with open_stream(STATUS, {"id": content_id}) as response:
                assert response.status_code == 200
                answers = await all_results(results(response))
        assert answers == [
            {"data": None, "errors": [{"message": message, "extensions": {"code": "UNAUTHENTICATED"}}]}
        ], auth
    assert await subscribers(content_id) == 0


@pytest.mark.parametrize(("method", "accept", "results"), STREAMS)
async def test_a_stream_ends_when_its_token_expires(
    server: ServerProcess, subscribers: Any, method: str, accept: dict[str, str], results: Any
) -> None:
    content_id = await an_uploading_note(server, "cai")
    async with httpx.AsyncClient(timeout=WAIT) as client:
        open_stream = stream_request(client, server, method, accept, bearer("cai", ttl_seconds=4))
        async with open_stream(STATUS, {"id": content_id}) as response:
            answers = await all_results(results(response))
    expired = {"message": "the token has expired", "extensions": {"code": "UNAUTHENTICATED"}}
    assert answers == [
        {"data": {"contentStatusChanged": {"status": "UPLOADING"}}},
        {"data": None, "errors": [expired]},
    ]
    await until_subscribers(subscribers, content_id, 0)


async def test_a_query_streams_over_sse_and_is_refused_over_multipart_subscriptions(
    server: ServerProcess,
) -> None:
    me = "{ me { id } }"
    async with httpx.AsyncClient(timeout=WAIT) as client:
        async with stream_request(client, server, "POST", SSE, bearer("dan"))(me, {}) as response:
            assert without_cost(await all_results(sse_results(response))) == [{"data": {"me": {"id": "dan"}}}]
        async with stream_request(client, server, "POST", MULTIPART, bearer("dan"))(me, {}) as response:
            answers = await all_results(multipart_results(response))
        refused = {"message": "queries are not allowed", "extensions": {"code": "BAD_USER_INPUT"}}
        assert answers == [{"data": None, "errors": [refused]}]
        # Without a streaming Accept, a subscription says where it can go.
        response = await client.post(
            f"{server.url}/graphql", json={"query": STATUS, "variables": {"id": "x"}}, headers=bearer("dan")
        )
        assert response.status_code == 400
        error = response.json()["errors"][0]
        assert error["extensions"] == {"code": "BAD_USER_INPUT"}
        for way in (
            "WebSocket",
            "Accept: text/event-stream",
            'Accept: multipart/mixed; subscriptionSpec="1.0"',
        ):
            assert way in error["message"]
    no_traceback(server)


# Documentation ---------------------------------------------------------------------------


def test_the_guide_names_every_token_place_and_close_reason() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    section = guide[
        guide.index("## Subscriptions") : guide.index("\n## ", guide.index("## Subscriptions") + 1)
    ]
    for place in ("`Authorization`", "`authorization`", "`authToken`", "`headers.Authorization`"):
        assert place in section
    for reason in ("send Authorization in\nconnection_init", "token expired", "token not valid"):
        assert reason.replace("\n", " ") in section.replace("\n", " ")
