"""A slow subscriber never holds anyone else, against a real server process
on each engine (DynamoDB with Redis beside it): 60 subscribers that stop
reading their sockets, with large selections, beside 30 of another family that
read; the 30 get their capsule's opening, the 60 cost nothing more once they
stopped reading (nothing is executed for them but the event each waits with)
and are let go (4408 on WebSockets, the end of the stream on SSE) and
counted. Then a let-go client that reads nothing at all, on each of uvicorn's
WebSocket implementations and on SSE and multipart: its connection is dropped
all the same, and the server's kernel holds nothing more for it."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import uvicorn
import websockets

from resolvers.core.config import Settings
from schema.backpressure import SLOW_CLOSE_CODE, ConnectionHandles, drop_of, server_transport
from tests.factories import capsule_rows, family_rows
from tests.servers import (
    SECRET,
    ServerProcess,
    engine_env,
    free_port,
    metric_total,
    server_table,
    subscriptions_running,
    token,
    until,
)

SLOW_SECONDS = 3.0
SLOW, NORMAL = 60, 30
FLOOD = 24  # capsules opening for the slow ones, before the normal ones' capsule
BIG = 20_000  # characters of each flood capsule's content transcription
ALIASES = 25  # `transcription` asked this many times per event: 500 kB an event
EVENT_BYTES = ALIASES * BIG


def processed_when_stopped() -> int:
    """What a connection that stopped reading is processed for, at most: the
    events its socket's buffers hold (the kernel's send buffer grows to
    tcp_wmem's largest; the client's receive buffer is 4 kB), the one that
    found them full, two the client read ahead before it stopped (the frame
    in its queue of one and the one it was reading), and the one each of its
    two subscriptions waits with."""
    largest_send_buffer = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return largest_send_buffer // EVENT_BYTES + 1 + 2 + 2


SLOW_DOCUMENT = (
    "subscription { capsuleUnlocked { id capsule { id "
    + " ".join(f"t{n}: content {{ transcription }}" for n in range(ALIASES))
    + " } } }"
)
NORMAL_DOCUMENT = "subscription { capsuleUnlocked { id capsule { id title } } }"


@pytest.fixture(params=["sqlite", "dynamodb"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ServerProcess]:
    async with engine_env(request.param, request) as engine:
        if engine:
            engine = {**engine, "MIFAMILIAS_REDIS_URL": request.getfixturevalue("redis_url")}
        process = ServerProcess(
            tmp_path / "server",
            {
                **engine,
                "MIFAMILIAS_AUTH_SECRET": SECRET,
                "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5",
                "MIFAMILIAS_SLOW_CLIENT_SECONDS": str(SLOW_SECONDS),
            },
        ).start()
        try:
            yield process
        finally:
            process.stop()


def shards(server: ServerProcess) -> int:
    default = Settings(data_dir=Path(server.env["MIFAMILIAS_DATA_DIR"])).unlock_shards
    return int(server.env.get("MIFAMILIAS_UNLOCK_SHARDS", default))


async def write_flood(
    table: Any, server: ServerProcess, family_id: str, creator: str, slow: list[str]
) -> None:
    """`FLOOD` capsules of large transcriptions for `slow`, due now."""
    now = datetime.now(UTC)
    for n in range(FLOOD):
        _, rows = capsule_rows(family_id, creator, slow, now, shards(server), tag=f"f{n:02d}")
        for row in rows:
            if row.get("type") == "Content":
                row["transcription"] = f"{n:02d}" + "x" * BIG
        await table.batch_write(rows)


async def processed(server: ServerProcess) -> float:
    """The capsuleUnlocked events the server executed or encoded for one subscriber."""
    executed = await metric_total(
        server, "mifamilias_subscription_events_executed_total", subscription="capsuleUnlocked"
    )
    shared = await metric_total(
        server, "mifamilias_events_shared_frames_total", subscription="capsuleUnlocked"
    )
    return executed + shared


async def slow_socket(server: ServerProcess, user: str) -> Any:
    """A graphql-transport-ws socket that will stop reading: a small receive
    buffer, and a client that reads one frame ahead at most."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", server.port))
    connection = await websockets.connect(
        server.ws_url,
        sock=raw,
        subprotocols=[websockets.Subprotocol("graphql-transport-ws")],
        max_queue=1,
        max_size=None,
        ping_interval=None,
    )
    await connection.send(
        json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token(user)}"}})
    )
    assert json.loads(await connection.recv())["type"] == "connection_ack"
    # Two subscriptions each: more stuck streams than the process has read slots.
    for operation in ("1", "2"):
        subscribe = {"id": operation, "type": "subscribe", "payload": {"query": SLOW_DOCUMENT}}
        await connection.send(json.dumps(subscribe))
    return connection


async def close_code(connection: Any) -> int | None:
    """Reads what the server left on the socket, up to its close."""
    try:
        while True:
            await asyncio.wait_for(connection.recv(), 60)
    except websockets.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


async def slow_clients_closed(server: ServerProcess) -> float:
    return await metric_total(server, "mifamilias_slow_clients_closed_total")


@dataclass
class Outcome:
    """What a run of slow and normal subscribers saw."""

    late: list[float]  # for each normal subscriber, seconds from the capsule's date to its event
    # How each slow socket was closed: 4408, or None when it was dropped
    # without a close frame (it read again too late, see below).
    codes: list[int | None]
    let_go: float  # the server's count of clients let go
    processed: float  # events executed or encoded for one subscriber, slow or normal


async def slow_and_normal(
    server: ServerProcess, slow_count: int = SLOW, normal_count: int = NORMAL
) -> Outcome:
    """`slow_count` subscribers that stop reading (two subscriptions each) and
    `normal_count` that read; a flood of large events for the slow ones, then
    one capsule opening for the normal ones."""
    run = f"{time.time_ns() % 10**8:08d}"
    slow = [f"slow{n}x{run}" for n in range(slow_count)]
    normal = [f"norm{n}x{run}" for n in range(normal_count)]
    slow_family, normal_family = f"fam{run}", f"other{run}"
    async with server_table(server) as table:
        await table.batch_write(family_rows(slow_family, slow[0], slow))
        await table.batch_write(family_rows(normal_family, normal[0], normal))

        slow_sockets = [await slow_socket(server, person) for person in slow]
        received: dict[str, float] = {}

        async def listen(person: str) -> None:
            async with websockets.connect(
                server.ws_url, subprotocols=[websockets.Subprotocol("graphql-transport-ws")]
            ) as connection:
                init = {"type": "connection_init", "payload": {"Authorization": f"Bearer {token(person)}"}}
                await connection.send(json.dumps(init))
                assert json.loads(await connection.recv())["type"] == "connection_ack"
                subscribe = {"id": "1", "type": "subscribe", "payload": {"query": NORMAL_DOCUMENT}}
                await connection.send(json.dumps(subscribe))
                async for frame in connection:
                    message = json.loads(frame)
                    if message["type"] == "next":
                        event = message["payload"]["data"]["capsuleUnlocked"]
                        assert event["capsule"]["id"] == awaited, message
                        received[person] = time.time()
                        return

        listeners = [asyncio.create_task(listen(person)) for person in normal]
        try:
            wanted = 2 * slow_count + normal_count
            await until(
                lambda: subscriptions_running([server], "capsuleUnlocked", wanted), "the subscriptions"
            )
            # The flood for the slow ones; once it has opened (the slow sockets
            # fill meanwhile), the other family's capsule, due a second later.
            await write_flood(table, server, slow_family, slow[0], slow)
            await until(lambda: _opened(server, FLOOD), "the flood's openings", seconds=60)
            opening_at = datetime.now(UTC) + timedelta(seconds=1)
            awaited, rows = capsule_rows(
                normal_family, normal[0], normal, opening_at, shards(server), tag="normal"
            )
            await table.batch_write(rows)
            # Every normal subscriber hears its capsule open, slow sockets or not.
            await asyncio.wait_for(asyncio.gather(*listeners), 60)
            late = sorted(at - opening_at.timestamp() for at in received.values())
            # Every slow one is let go and counted; told why if it reads again
            # within MIFAMILIAS_SLOW_CLIENT_SECONDS of its letting go, dropped otherwise.
            await until(lambda: _at_least(server, slow_count), "the slow clients let go", seconds=60)
            codes = await asyncio.gather(*(close_code(connection) for connection in slow_sockets))
            return Outcome(late, list(codes), await slow_clients_closed(server), await processed(server))
        finally:
            for listener in listeners:
                listener.cancel()
            for connection in slow_sockets:
                connection.transport.abort()


async def test_slow_readers_are_let_go_and_hold_nobody_else(server: ServerProcess) -> None:
    outcome = await slow_and_normal(server)
    print(
        f"normal subscribers: opening received {outcome.late[0]:.2f} s to {outcome.late[-1]:.2f} s after its date"
    )
    assert len(outcome.late) == NORMAL
    # The sockets are read once the last one is let go, which may be past the
    # first ones' time to read their close (see the tests further down).
    assert set(outcome.codes) <= {SLOW_CLOSE_CODE, None}, outcome.codes
    assert outcome.let_go == SLOW
    # Each slow connection is processed for until its socket backs up, and for
    # the event each subscription then waits with: not for the flood's 24
    # to each of its two subscriptions.
    slow_processed = outcome.processed - NORMAL
    print(f"events processed for the {SLOW} slow connections: {slow_processed:.0f}")
    assert slow_processed <= SLOW * processed_when_stopped() < SLOW * 2 * FLOOD
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{server.url}/healthz")).status_code == 200
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert log.count("let a slow graphql-transport-ws client go") == SLOW


async def _opened(server: ServerProcess, count: int) -> bool:
    return await metric_total(server, "mifamilias_capsules_unlocked_total") >= count


async def _at_least(server: ServerProcess, count: int) -> bool:
    return await slow_clients_closed(server) >= count


async def slow_stream(server: ServerProcess, user: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An SSE subscription whose client then stops reading."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", server.port))
    reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 16)
    body = json.dumps({"query": SLOW_DOCUMENT}).encode()
    writer.write(
        b"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: text/event-stream\r\n"
        + f"Authorization: Bearer {token(user)}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    return reader, writer


async def read_to_the_end(reader: asyncio.StreamReader) -> bool:
    """Whether the server ended the stream (EOF, or the connection dropped)."""
    try:
        while await asyncio.wait_for(reader.read(1 << 16), 60):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


async def test_a_slow_sse_reader_is_let_go(server: ServerProcess) -> None:
    run = f"{time.time_ns() % 10**8:08d}"
    slow = [f"slow{n}x{run}" for n in range(6)]
    family_id = f"fam{run}"
    async with server_table(server) as table:
        await table.batch_write(family_rows(family_id, slow[0], slow))
        streams = [await slow_stream(server, person) for person in slow]
        try:
            await until(lambda: subscriptions_running([server], "capsuleUnlocked", len(slow)), "the streams")
            await write_flood(table, server, family_id, slow[0], slow)
            await until(lambda: _at_least(server, len(slow)), "the slow streams let go", seconds=60)
            assert all(await asyncio.gather(*(read_to_the_end(reader) for reader, _ in streams)))
            await until(lambda: _no_subscriptions(server), "the streams' subscriptions to stop")
        finally:
            for _, writer in streams:
                writer.transport.abort()
    # A stream waits at its send: it is processed for no more than a socket.
    assert await processed(server) <= len(slow) * processed_when_stopped()
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert log.count("let a slow sse client go (stalled)") == len(slow)


async def _no_subscriptions(server: ServerProcess) -> bool:
    return not await subscriptions_running([server], "capsuleUnlocked", 1)


# A client let go that reads nothing at all -------------------------------------------

# MIFAMILIAS_SLOW_CLIENT_SECONDS for the tests below: a let-go client's
# connection is dropped within this long of its letting go (and a client that
# reads again within it learns why).
DROP_SECONDS = 4.0
# How long the tests wait for that drop before they fail: generous, for a loaded
# machine, and still less than the fixed 30 s a let-go socket used to be given.
DROP_BOUND = 20.0


@pytest.fixture(params=["websockets", "websockets-sansio", "wsproto"])
async def dropping_server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ServerProcess]:
    """A server on the embedded store with a short slow-client time, on one of
    uvicorn's WebSocket implementations."""
    process = ServerProcess(
        tmp_path / "server",
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5",
            "MIFAMILIAS_SLOW_CLIENT_SECONDS": str(DROP_SECONDS),
            "MIFAMILIAS_WS_IMPLEMENTATION": request.param,
        },
    ).start()
    try:
        yield process
    finally:
        process.stop()


async def stalled_connection(server: ServerProcess, *exchanges: tuple[bytes, bytes]) -> socket.socket:
    """A raw TCP connection with a 4 kB receive buffer that sends each
    exchange's request and reads until its answer has come, then reads
    nothing more."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(raw, ("127.0.0.1", server.port))
    for request, answered in exchanges:
        await loop.sock_sendall(raw, request)
        seen = b""
        while answered not in seen:
            chunk = await asyncio.wait_for(loop.sock_recv(raw, 4096), 30)
            assert chunk, seen
            seen += chunk
    return raw


def client_frame(message: dict[str, Any]) -> bytes:
    """A masked text frame (RFC 6455 5.2), as a client sends it."""
    payload = json.dumps(message).encode()
    mask = b"\x01\x02\x03\x04"
    if len(payload) < 126:
        header = bytes([0x81, 0x80 | len(payload)])
    else:
        header = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2)
    return header + mask + bytes(b ^ mask[n % 4] for n, b in enumerate(payload))


async def stalled_websocket(server: ServerProcess, user: str) -> socket.socket:
    """A graphql-transport-ws subscriber that reads nothing once acknowledged."""
    handshake = (
        b"GET /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Protocol: graphql-transport-ws\r\n\r\n"
    )
    init = client_frame({"type": "connection_init", "payload": {"Authorization": f"Bearer {token(user)}"}})
    subscribe = client_frame({"id": "1", "type": "subscribe", "payload": {"query": SLOW_DOCUMENT}})
    return await stalled_connection(
        server, (handshake, b"\r\n\r\n"), (init, b"connection_ack"), (subscribe, b"")
    )


async def stalled_stream(server: ServerProcess, user: str, accept: str) -> socket.socket:
    """An SSE or multipart subscriber that reads nothing once its response has begun."""
    body = json.dumps({"query": SLOW_DOCUMENT}).encode()
    request = (
        f"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: {accept}\r\nAuthorization: Bearer {token(user)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return await stalled_connection(server, (request + body, b"HTTP/1.1 200"))


def reset(raw: socket.socket) -> bool:
    """Whether the server has dropped the connection, seen without reading:
    its reset is an error (and a hang-up) on the socket."""
    poller = select.poll()
    poller.register(raw, select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


TCP_STATES = {
    "01": "ESTABLISHED",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "08": "CLOSE_WAIT",
}


def held_by_server(server: ServerProcess, raw: socket.socket) -> str | None:
    """The server's kernel socket for this connection, if it still holds one
    (its state and how many bytes it queues for the client), from /proc/net/tcp."""
    client_port = raw.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state, queues = line.split()[1:5]
        if int(local.split(":")[1], 16) == server.port and int(remote.split(":")[1], 16) == client_port:
            return f"{TCP_STATES.get(state, state)}, {int(queues.split(':')[0], 16)} bytes queued"
    return None


def dropped(server: ServerProcess, raw: socket.socket) -> Callable[[], str]:
    """What `until` says when the connection was not dropped."""
    return lambda: f"the connection dropped; the server's socket: {held_by_server(server, raw)}"


async def test_a_websocket_let_go_that_reads_nothing_is_dropped(dropping_server: ServerProcess) -> None:
    server = dropping_server
    run = f"{time.time_ns() % 10**8:08d}"
    back, silent = f"back{run}", f"silent{run}"
    family_id = f"fam{run}"
    async with server_table(server) as table:
        await table.batch_write(family_rows(family_id, back, [back, silent]))
        # One at a time, so that the test knows which one the server let go.
        # The first reads again as soon as it is let go: it reads up to its
        # 4408 close, and learns why.
        returning = await stalled_websocket(server, back)
        try:
            await until(lambda: subscriptions_running([server], "capsuleUnlocked", 1), "the subscription")
            await write_flood(table, server, family_id, back, [back])
            await until(lambda: _at_least(server, 1), "the first client let go", seconds=60)
            assert await close_frame_code(returning) == SLOW_CLOSE_CODE
        finally:
            returning.close()
        await until(lambda: _no_subscriptions(server), "its subscription to stop")
        # The second never reads: its connection is dropped all the same, and
        # the server's kernel holds nothing more for it.
        raw = await stalled_websocket(server, silent)
        try:
            await flooded_until_dropped(table, server, raw, family_id, back, silent, let_go=2)
        finally:
            raw.close()
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


async def flooded_until_dropped(
    table: Any,
    server: ServerProcess,
    raw: socket.socket,
    family_id: str,
    author: str,
    silent: str,
    let_go: int,
) -> None:
    """Once `silent`'s subscription runs, floods it with openings until the
    server has let `let_go` clients go; then waits for `raw`, its socket, to
    be reset and gone from the server's kernel."""
    await until(lambda: subscriptions_running([server], "capsuleUnlocked", 1), "the subscription")
    await write_flood(table, server, family_id, author, [silent])
    await until(lambda: _at_least(server, let_go), f"{let_go} clients let go", seconds=60)
    await until(lambda: reset(raw), dropped(server, raw), DROP_BOUND)
    await until(lambda: held_by_server(server, raw) is None, dropped(server, raw), DROP_BOUND)


async def close_frame_code(raw: socket.socket) -> int | None:
    """Reads the server's frames (RFC 6455 5.2, unmasked) up to a close frame: its code."""
    loop = asyncio.get_running_loop()
    buffer = bytearray()

    async def take(count: int) -> bytes:
        while len(buffer) < count:
            chunk = await asyncio.wait_for(loop.sock_recv(raw, 1 << 16), 30)
            if not chunk:
                raise EOFError
            buffer.extend(chunk)
        taken = bytes(buffer[:count])
        del buffer[:count]
        return taken

    # The handshake's answer and the acknowledgement were read already, frame by frame from here.
    while True:
        first, second = await take(2)
        length = second & 0x7F
        if length == 126:
            length = int.from_bytes(await take(2))
        elif length == 127:
            length = int.from_bytes(await take(8))
        payload = await take(length)
        if first & 0x0F == 0x8:
            return int.from_bytes(payload[:2]) if len(payload) >= 2 else None


@pytest.mark.parametrize("accept", ["text/event-stream", 'multipart/mixed; subscriptionSpec="1.0"'])
async def test_a_stream_let_go_that_reads_nothing_is_dropped(accept: str, tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "server",
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5",
            "MIFAMILIAS_SLOW_CLIENT_SECONDS": str(DROP_SECONDS),
        },
    ).start()
    try:
        run = f"{time.time_ns() % 10**8:08d}"
        silent, family_id = f"silent{run}", f"fam{run}"
        async with server_table(server) as table:
            await table.batch_write(family_rows(family_id, silent, [silent]))
            raw = await stalled_stream(server, silent, accept)
            try:
                await flooded_until_dropped(table, server, raw, family_id, silent, silent, let_go=1)
            finally:
                raw.close()
        log = server.log()
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    finally:
        server.stop()


# Checked while uvicorn still ships it: the setting may name it.
@pytest.mark.filterwarnings("ignore:The `websockets` implementation is deprecated")
@pytest.mark.parametrize(
    ("kind", "implementation"),
    [
        ("http", "h11"),
        ("http", "httptools"),
        ("ws", "websockets"),
        ("ws", "websockets-sansio"),
        ("ws", "wsproto"),
    ],
)
async def test_uvicorns_send_is_a_method_of_what_holds_the_connections_transport(
    kind: str, implementation: str
) -> None:
    """What `backpressure.server_transport` relies on, which ASGI does not
    promise: under each of uvicorn's HTTP and WebSocket implementations, the
    `send` an app is given is a bound method of an object whose `.transport`
    is the connection's transport. Dropping the connection through it resets
    the client's socket (not an ordinary close, which waits behind what is
    queued)."""
    peers: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        transport = server_transport(send)
        peers.append(transport.get_extra_info("peername") if transport is not None else None)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"begun", "more_body": True})
        else:
            await receive()
            await send({"type": "websocket.accept"})
        drop_of(scope)(0)

    port = free_port()
    config = uvicorn.Config(
        ConnectionHandles(app),  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
        http=cast(Any, implementation if kind == "http" else "auto"),
        ws=cast(Any, implementation if kind == "ws" else "auto"),
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or serving.done(), "the server to start", 30, interval=0.01)
        if kind == "http":
            request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        else:
            request = (
                b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as raw:
            raw.setblocking(False)
            loop = asyncio.get_running_loop()
            await loop.sock_connect(raw, ("127.0.0.1", port))
            await loop.sock_sendall(raw, request)
            with pytest.raises(ConnectionResetError):
                while await asyncio.wait_for(loop.sock_recv(raw, 4096), 30):
                    pass
            assert peers == [raw.getsockname()]
    finally:
        server.should_exit = True
        await serving
