"""A slow subscriber never holds anyone else, against a real server process
on each engine (DynamoDB with Redis beside it): 60 subscribers that stop
reading their sockets, with large selections, beside 30 of another family that
read; the 30 get their capsule's opening, the 60 cost nothing more once they
stopped reading (nothing is executed for them but the event each waits with)
and are let go (4408 on WebSockets, the end of the stream on SSE) and
counted."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from resolvers.core.config import Settings
from tests.factories import capsule_rows, family_rows
from tests.servers import (
    SECRET,
    ServerProcess,
    engine_env,
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
    codes: list[int | None]  # how each slow socket was closed
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
            # Every slow one is let go, counted, and told why when it reads again.
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
    assert outcome.codes == [4408] * SLOW
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
