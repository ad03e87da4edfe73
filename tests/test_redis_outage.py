"""Redis killed and started again on the same port, under two server processes
on one table: writes made meanwhile are answered as committed, the events they
made reach a connected stream once each when Redis is back, and a subscription
opened during the outage starts and then hears them too."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.servers import RedisProcess, ServerProcess, engine_env, redis_answers, subscriptions_running, until
from tests.test_live import http, make_family, token, upload

COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id } }"
NOTIFICATIONS = "subscription { notificationAdded { id type } }"
DURING = 5  # comments made while Redis is down


@pytest.fixture(params=["sqlite", "dynamodb"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    async with engine_env(request.param, request) as env:
        yield env


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisProcess]:
    process = RedisProcess(tmp_path / "redis").start()
    try:
        yield process
    finally:
        process.stop()


class Stream:
    """A graphql-transport-ws subscription that keeps what it hears."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.ids: list[str] = []
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, server: ServerProcess, user: str) -> Stream:
        connection = await websockets.connect(
            server.ws_url, subprotocols=[websockets.Subprotocol("graphql-transport-ws")]
        )
        init = {"type": "connection_init", "payload": {"Authorization": f"Bearer {token(user)}"}}
        await connection.send(json.dumps(init))
        assert json.loads(await connection.recv())["type"] == "connection_ack"
        await connection.send(
            json.dumps({"id": "1", "type": "subscribe", "payload": {"query": NOTIFICATIONS}})
        )
        return cls(connection)

    async def _read(self) -> None:
        async for frame in self.connection:
            message = json.loads(frame)
            if message["type"] == "next":
                assert "errors" not in message["payload"], message
                self.ids.append(message["payload"]["data"]["notificationAdded"]["id"])
            elif message["type"] not in ("ping", "pong"):
                raise AssertionError(message)

    async def close(self) -> None:
        self.reader.cancel()
        await self.connection.close()


async def test_redis_going_away_loses_nothing_and_fails_no_write(
    engine: dict[str, str], redis: RedisProcess, tmp_path: Path
) -> None:
    env = {
        **engine,
        "MIFAMILIAS_AUTH_SECRET": "test-secret-" + "x" * 32,
        "MIFAMILIAS_REDIS_URL": redis.url,
    }
    a = ServerProcess(tmp_path / "a", env, name="a")
    b = ServerProcess(tmp_path / "b", env, name="b")
    if not engine:
        # Both on one embedded store: the same data directory.
        b = ServerProcess(tmp_path / "a", env, name="b")
    servers = [a.start(), b.start()]
    streams: list[Stream] = []
    try:
        family_id = await make_family(a, "ana", ["ben"])
        post = await upload(a, "ben", family_id, "TEXT", b"hola", "text/plain")
        await until(lambda: _ready(a, post), "the post to be READY")
        first = await Stream.open(b, "ben")
        streams.append(first)
        await until(lambda: subscriptions_running([b], "notificationAdded", 1), "ben's stream")
        await http(a, "ana", COMMENT, {"id": post, "b": "antes"})
        await until(lambda: len(first.ids) == 1, "the comment made before the outage")

        redis.process.kill()  # type: ignore[union-attr]
        redis.process.wait()  # type: ignore[union-attr]
        assert not redis_answers(redis.url)
        # A subscription opened now starts (on the other process).
        during = await Stream.open(a, "ben")
        streams.append(during)
        await until(
            lambda: subscriptions_running([a], "notificationAdded", 1), "the stream opened during the outage"
        )
        for n in range(DURING):
            # Answered as committed: no error, an id.
            done = await http(a if n % 2 else b, "ana", COMMENT, {"id": post, "b": f"durante {n}"})
            assert done["addComment"]["id"]
        redis.start()

        expected = 1 + DURING
        await until(lambda: len(first.ids) >= expected, "the stream connected throughout to catch up", 60)
        await until(lambda: len(during.ids) >= DURING, "the stream opened during the outage to catch up", 60)
        # One more after the return: it comes live, and nothing comes twice.
        await http(b, "ana", COMMENT, {"id": post, "b": "después"})
        await until(lambda: len(first.ids) >= expected + 1 and len(during.ids) >= DURING + 1, "the last one")
        for stream in streams:
            assert max(Counter(stream.ids).values()) == 1, stream.ids
        assert len(first.ids) == expected + 1 and len(during.ids) == DURING + 1
        listed = await http(a, "ben", "{ notifications { edges { node { id type } } } }")
        comments = [
            e["node"]["id"] for e in listed["notifications"]["edges"] if e["node"]["type"] == "NEW_COMMENT"
        ]
        assert sorted(first.ids) == sorted(comments)
    finally:
        for stream in streams:
            await stream.close()
        for server in servers:
            server.stop()
    for server in servers:
        log = server.log()
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
        assert log.count("Redis is not answering") == 1, server.name
        assert log.count("Redis answers again") == 1, server.name


async def _ready(server: ServerProcess, content_id: str) -> bool:
    found = await http(server, "ben", "query($id: ID!) { content(id: $id) { status } }", {"id": content_id})
    return bool(found["content"]["status"] == "READY")
