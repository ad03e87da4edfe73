"""Shared fixtures. pytest-asyncio runs in auto mode on one session loop."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import FrameType

import pytest

from store.dynamodb import create_table, open_dynamo_table
from store.port import Table
from store.sqlite import SqliteTable
from tests.leftovers import lives_for_the_session
from tests.servers import SECRET, RedisProcess, ServerProcess, moto_server_process

AWS_REGION = "us-east-1"


@pytest.fixture(scope="session", autouse=True)
def aws_env() -> Iterator[None]:
    """Dummy credentials and region, so no test can reach a real account."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_DEFAULT_REGION", AWS_REGION)
        patch.setenv("AWS_REGION", AWS_REGION)
        patch.setenv("AWS_CONFIG_FILE", "/dev/null")
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            patch.delenv(name, raising=False)
        yield


class _TokenWatch(logging.Handler):
    """Notes every log record of the run whose text holds a JWT (tokens start
    with "eyJ", the encoded `{"`): no code may log a token."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.leaks: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += logging.Formatter().formatException(record.exc_info)
        except Exception:
            return
        if "eyJ" in text:
            self.leaks.append(f"{record.name}: {text[:300]}")


@pytest.fixture(scope="session", autouse=True)
def no_token_in_logs() -> Iterator[None]:
    """Across the session, in this process: no log record carries a token (what
    reaches the root logger at the levels in force; server processes are checked
    by tests/test_observability.py)."""
    watch = _TokenWatch()
    root = logging.getLogger()
    root.addHandler(watch)
    yield
    root.removeHandler(watch)
    assert not watch.leaks, "tokens in log records:\n" + "\n".join(watch.leaks[:5])


@pytest.fixture(scope="session")
def moto_server(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One moto_server for the whole session (for each parallel worker)."""
    with moto_server_process(tmp_path_factory.mktemp("moto")) as (url, process):
        lives_for_the_session(process.pid)
        yield url


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server (uvicorn, embedded store) per test module."""
    server = ServerProcess(
        tmp_path_factory.mktemp("live"),
        {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5"},
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A real Redis of this test process's own: parallel workers never share a
    channel or a counter (pub/sub channels span every database of one server)."""
    redis = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    assert redis.process is not None
    lives_for_the_session(redis.process.pid)
    try:
        yield redis
    finally:
        redis.stop()


_databases = itertools.count()


@pytest.fixture(scope="module")
def redis_url(redis_server: RedisProcess) -> str:
    """The session's Redis, on an empty database of the module's own: what one
    module's servers keep there (each person's cost bucket) never reaches the
    next module's. Channels still span databases, and one module runs at a
    time in a test process."""
    import redis

    database = 1 + next(_databases) % 15
    url = redis_server.url.rsplit("/", 1)[0] + f"/{database}"
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


ENGINES = ["sqlite", "dynamodb"]


@pytest.fixture(params=ENGINES)
async def table(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Table]:
    """An empty table of its own on each engine: SQLite, and DynamoDB on moto_server."""
    if request.param == "sqlite":
        sqlite = SqliteTable(tmp_path / "store.db")
        yield sqlite
        await sqlite.close()
        return
    endpoint: str = request.getfixturevalue("moto_server")
    name = f"contract-{uuid.uuid4().hex[:12]}"
    async with open_dynamo_table(name, endpoint, "us-east-1") as dynamo:
        assert await create_table(dynamo.client, name) is True
        yield dynamo
        await dynamo.client.delete_table(TableName=name)


def _print_tasks(signum: int, frame: FrameType | None) -> None:
    """`kill -USR1 <pytest pid>` writes every asyncio task's stack to
    /tmp/asyncio-tasks-<pid>.txt: a hung test shows where it waits (pytest
    captures stderr, and faulthandler shows threads only)."""
    loop = asyncio._get_running_loop()
    with open(f"/tmp/asyncio-tasks-{os.getpid()}.txt", "w") as out:
        if loop is None:
            print("no running event loop", file=out)
            return
        for task in asyncio.all_tasks(loop):
            print(f"--- {task.get_name()} {task.get_coro()}", file=out)
            task.print_stack(limit=20, file=out)


signal.signal(signal.SIGUSR1, _print_tasks)
