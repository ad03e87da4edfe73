"""A slow subscriber never holds anyone else, against a real server process:
60 subscribers that stop reading their sockets, with large selections, beside
30 that read; the 30 get their capsule's opening, the 60 are let go (4408 on
WebSockets, the end of the stream on SSE) and counted."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from resolvers.core.auth import mint_token
from resolvers.core.config import Settings
from store.sqlite import SqliteTable
from tests.factories import capsule_rows, family_rows
from tests.servers import SECRET, ServerProcess, metric_total, subscriptions_running, until

SLOW_SECONDS = 3.0
SLOW, NORMAL = 60, 30
FLOOD = 16  # capsules opening for the slow ones, before the normal ones' capsule
BIG = 20_000  # characters of each flood capsule's content transcription
ALIASES = 25  # `transcription` asked this many times per event: 500 kB an event

SLOW_DOCUMENT = (
    "subscription { capsuleUnlocked { id capsule { id "
    + " ".join(f"t{n}: content {{ transcription }}" for n in range(ALIASES))
    + " } } }"
)
NORMAL_DOCUMENT = "subscription { capsuleUnlocked { id capsule { id title } } }"


def token(user: str) -> str:
    return mint_token(SECRET, user, given_name=user)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path / "server",
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5",
            "MIFAMILIAS_SLOW_CLIENT_SECONDS": str(SLOW_SECONDS),
        },
    ).start()
    try:
        yield process
    finally:
        process.stop()


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
    codes: list[int | None]  # how each slow socket was closed
    let_go: float  # the server's count of clients let go


async def slow_and_normal(
    server: ServerProcess, slow_count: int = SLOW, normal_count: int = NORMAL
) -> Outcome:
    """`slow_count` subscribers that stop reading (two subscriptions each) and
    `normal_count` that read; a flood of large events for the slow ones, then
    one capsule opening for the normal ones."""
    run = f"{time.time_ns() % 10**8:08d}"
    creator = f"ana{run}"
    slow = [f"slow{n}x{run}" for n in range(slow_count)]
    normal = [f"norm{n}x{run}" for n in range(normal_count)]
    family_id = f"fam{run}"
    settings = Settings(data_dir=Path(server.env["MIFAMILIAS_DATA_DIR"]))  # the server's own store
    table = SqliteTable(settings.sqlite_path)
    await table.batch_write(family_rows(family_id, creator, [*slow, *normal]))
    flood_at = datetime.now(UTC) + timedelta(seconds=12)
    opening_at = flood_at + timedelta(seconds=4)
    for n in range(FLOOD):
        _, rows = capsule_rows(family_id, creator, slow, flood_at, settings.unlock_shards, tag=f"f{n:02d}")
        for row in rows:
            if row.get("type") == "Content":
                row["transcription"] = f"{n:02d}" + "x" * BIG
        await table.batch_write(rows)
    awaited, rows = capsule_rows(family_id, creator, normal, opening_at, settings.unlock_shards, tag="normal")
    await table.batch_write(rows)

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
        await until(lambda: subscriptions_running([server], "capsuleUnlocked", wanted), "the subscriptions")
        assert datetime.now(UTC) < flood_at, "the set-up took longer than the time before the flood"
        # Every normal subscriber hears its capsule open, slow sockets or not.
        await asyncio.wait_for(asyncio.gather(*listeners), 60)
        late = sorted(at - opening_at.timestamp() for at in received.values())
        # Every slow one is let go, counted, and told why when it reads again.
        await until(lambda: _at_least(server, slow_count), "the slow clients let go", seconds=60)
        codes = await asyncio.gather(*(close_code(connection) for connection in slow_sockets))
        return Outcome(late, list(codes), await slow_clients_closed(server))
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
    assert outcome.codes == [4408] * SLOW
    assert outcome.let_go == SLOW
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{server.url}/healthz")).status_code == 200
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert log.count("let a slow graphql-transport-ws client go") == SLOW


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
    creator, slow = f"ana{run}", [f"slow{n}x{run}" for n in range(6)]
    family_id = f"fam{run}"
    settings = Settings(data_dir=server.data_dir)
    table = SqliteTable(settings.sqlite_path)
    await table.batch_write(family_rows(family_id, creator, slow))
    flood_at = datetime.now(UTC) + timedelta(seconds=6)
    for n in range(FLOOD):
        _, rows = capsule_rows(family_id, creator, slow, flood_at, settings.unlock_shards, tag=f"f{n:02d}")
        for row in rows:
            if row.get("type") == "Content":
                row["transcription"] = f"{n:02d}" + "x" * BIG
        await table.batch_write(rows)
    streams = [await slow_stream(server, person) for person in slow]
    try:
        await until(lambda: subscriptions_running([server], "capsuleUnlocked", len(slow)), "the streams")
        await until(lambda: _at_least(server, len(slow)), "the slow streams let go", seconds=60)
        assert all(await asyncio.gather(*(read_to_the_end(reader) for reader, _ in streams)))
        await until(lambda: _no_subscriptions(server), "the streams' subscriptions to stop")
    finally:
        for _, writer in streams:
            writer.transport.abort()
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert log.count("let a slow sse client go (stalled)") == len(slow)


async def _no_subscriptions(server: ServerProcess) -> bool:
    return not await subscriptions_running([server], "capsuleUnlocked", 1)
