"""Real server processes for end-to-end tests: `python app.py serve` on a free
loopback port, stopped (or killed) by the test."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from resolvers.core.auth import mint_token

ROOT = Path(__file__).resolve().parent.parent
SECRET = "test-secret-" + "x" * 32


def token(user: str, *, email: bool = False, **claims: Any) -> str:
    """A bearer token for `user`, signed with the servers' secret: their given
    name is their id capitalised unless `claims` say otherwise; with `email`,
    an address at example.org."""
    claims.setdefault("given_name", user.capitalize())
    if email:
        claims.setdefault("email", f"{user}@example.org")
    return mint_token(SECRET, user, **claims)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str],
        port: int | None = None,
        *,
        argv: list[str] | None = None,
        name: str = "server",
        launcher: Callable[[list[str]], list[str]] = list,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.name = name
        self.argv = argv or [sys.executable, str(ROOT / "app.py"), "serve"]
        self.launcher = launcher  # e.g. pinning to a core with taskset
        self.env = {
            **os.environ,
            "MIFAMILIAS_HOST": "127.0.0.1",
            "MIFAMILIAS_PORT": str(self.port),
            "MIFAMILIAS_DATA_DIR": str(data_dir),
            **env,
        }
        self.log_path = data_dir / f"{name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/graphql"

    # Start-up bounds only bound a failure: on a machine busy with other work an
    # interpreter importing the app can take most of a minute, and a start that
    # answers returns at once.
    def start(self, timeout: float = 120) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.launcher(self.argv), cwd=ROOT, env=self.env, stdout=log, stderr=log
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()  # a start that failed leaves nothing running
        raise RuntimeError(f"{self.name} did not answer:\n{self.log_path.read_text()}")

    async def started(self) -> ServerProcess:
        """`start` on a thread: the caller's event loop goes on serving its own
        clients meanwhile, whose timers would otherwise run out behind a start
        that takes most of a minute."""
        return await asyncio.to_thread(self.start)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


class RedisProcess:
    """A redis-server of the test's own, on a fixed port so that it can be
    stopped and started again at the same address."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 60) -> RedisProcess:
        import shutil

        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (./dev test installs it)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not redis_answers(self.url):
            if time.monotonic() > deadline or self.process.poll() is not None:
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextlib.contextmanager
def running_moto_server(log_dir: Path) -> Iterator[str]:
    """moto's server (see tests/moto_server.py) on a free local port; yields its URL."""
    with moto_server_process(log_dir) as (url, _):
        yield url


@contextlib.contextmanager
def moto_server_process(log_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """moto's server and its process (to stop it with SIGSTOP, as a stalled table)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = log_dir / "moto_server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.moto_server", "127.0.0.1", str(port)],
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"moto_server exited ({process.returncode}):\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except urllib.error.HTTPError:
                break  # it answered
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not answer on {url}:\n{log_path.read_text()}")
                time.sleep(0.1)
        yield url, process
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def engine_env(engine: str, request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    """The environment that puts a server process on an engine: SQLite (the
    default, in its data directory), or a fresh table on the session's
    moto_server with the VAPID key a deployment gives every host (a server on
    DynamoDB refuses to start without one). Server processes given the same
    environment share the store, and on DynamoDB the key."""
    if engine == "sqlite":
        yield {}
        return
    from resolvers.adapters.webpush import new_private_key
    from store.dynamodb import DynamoTable, create_table, open_dynamo_table

    moto_url = request.getfixturevalue("moto_server")
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    async with open_dynamo_table(name, moto_url, "us-east-1") as table:
        assert isinstance(table, DynamoTable)
        await create_table(table.client, name)
        try:
            yield {
                "MIFAMILIAS_DYNAMODB_ENDPOINT": moto_url,
                "MIFAMILIAS_AWS_REGION": "us-east-1",
                "MIFAMILIAS_TABLE_NAME": name,
                "MIFAMILIAS_UNLOCK_SHARDS": "1",
                "MIFAMILIAS_VAPID_PRIVATE_KEY": new_private_key(),
            }
        finally:
            await table.client.delete_table(TableName=name)


@contextlib.asynccontextmanager
async def server_table(server: ServerProcess) -> AsyncIterator[Any]:
    """The table a server process uses (its environment's engine), opened by
    the test beside it."""
    if "MIFAMILIAS_DYNAMODB_ENDPOINT" in server.env:
        from store.dynamodb import open_dynamo_table

        async with open_dynamo_table(
            server.env["MIFAMILIAS_TABLE_NAME"], server.env["MIFAMILIAS_DYNAMODB_ENDPOINT"], "us-east-1"
        ) as table:
            yield table
        return
    from store.sqlite import SqliteTable

    sqlite = SqliteTable(Path(server.env["MIFAMILIAS_DATA_DIR"]) / "mifamilias.sqlite3")
    try:
        yield sqlite
    finally:
        await sqlite.close()


def pipeline_env(engine: dict[str, str], **more: str) -> dict[str, str]:
    """A server process on `engine` whose pipeline lets go of a killed
    process's content fast: a lease of 3 s, recovery every 0.5 s."""
    return {
        "MIFAMILIAS_AUTH_SECRET": SECRET,
        "MIFAMILIAS_PIPELINE_LEASE_SECONDS": "3",
        "MIFAMILIAS_PIPELINE_RECOVERY_SECONDS": "0.5",
        **engine,
        **more,
    }


async def post_graphql(
    server: ServerProcess, token: str, query: str, variables: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The whole JSON answer of one operation, sent to a server process as the token's person."""
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{server.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def graphql_data(
    server: ServerProcess, token: str, query: str, variables: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The `data` of one operation that must not fail, sent to a server process."""
    body = await post_graphql(server, token, query, variables)
    assert "errors" not in body, body
    data: dict[str, Any] = body["data"]
    return data


async def upload_to(server: ServerProcess, token: str, kind: str, mime: str, body: bytes) -> str:
    """A new family, and an upload of `body` to it (createUpload, the PUT,
    completeUpload) as the token's person: the content's id."""
    family = await graphql_data(server, token, 'mutation { createFamily(input: {name: "Los Ruiz"}) { id } }')
    created = await graphql_data(
        server,
        token,
        "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
        {
            "i": {
                "familyId": family["createFamily"]["id"],
                "type": kind,
                "mimeType": mime,
                "sizeBytes": len(body),
            }
        },
    )
    import httpx

    async with httpx.AsyncClient(timeout=60) as client:
        sent = await client.put(
            created["createUpload"]["uploadUrl"], content=body, headers={"Content-Type": mime}
        )
    assert sent.status_code == 200
    content_id = str(created["createUpload"]["content"]["id"])
    await graphql_data(
        server, token, "mutation($id: ID!) { completeUpload(contentId: $id) { status } }", {"id": content_id}
    )
    return content_id


async def until(
    check: Callable[[], Any],
    what: str | Callable[[], str] = "a condition",
    seconds: float = 120,
    interval: float = 0.1,
) -> Any:
    """Polls `check` (plain or async) until it answers something true, and
    returns that answer; the deadline only bounds a failure. `what` names what
    is awaited in the failure (a callable: the state when it gave up).
    `interval=0` only yields to the event loop, for work in this process."""
    deadline = time.monotonic() + seconds
    while True:
        outcome = check()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return outcome
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        await asyncio.sleep(interval)


async def metric_total(server: ServerProcess, name: str, **labels: str) -> float:
    """The sum of the server's `name` samples (its /metrics) whose labels include `labels`."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient() as client:
        page = (await client.get(f"{server.url}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def subscriptions_running(servers: Sequence[ServerProcess], name: str, count: int) -> bool:
    """Whether at least `count` `name` subscriptions run on these servers (their /metrics)."""
    total = 0.0
    for server in servers:
        total += await metric_total(server, "mifamilias_subscriptions_active", subscription=name)
    return total >= count


def without_cost(value: Any) -> Any:
    """An answer (or a list of them, or protocol messages holding them) without
    `extensions.cost`, which every answer carries, for tests about something else
    (`tests/api/test_budget.py` reads it)."""
    if isinstance(value, list):
        return [without_cost(item) for item in value]
    if not isinstance(value, dict):
        return value
    found = {key: without_cost(item) for key, item in value.items()}
    extensions = found.get("extensions")
    if isinstance(extensions, dict) and "cost" in extensions:
        rest = {key: item for key, item in extensions.items() if key != "cost"}
        if rest:
            found["extensions"] = rest
        else:
            del found["extensions"]
    return found


async def after_the_start_up_pass(app: Any) -> None:
    """Until an in-process app's unlock scheduler has made the pass it makes as
    it starts: a test that counts store calls, breaks the table or opens a
    capsule itself must not meet that pass halfway."""
    scheduler = app.state.services.scheduler
    await until(lambda: scheduler.passes > 0, "the unlock scheduler's start-up pass", interval=0.01)
