"""Shared fixtures. pytest-asyncio runs in auto mode on one session loop."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.servers import SECRET, ServerProcess, running_moto_server

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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def moto_server(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One moto_server for the whole session."""
    with running_moto_server(tmp_path_factory.mktemp("moto")) as url:
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


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis: the configured one when it answers, else one started here."""
    import os
    import shutil

    configured = os.environ.get("MIFAMILIAS_REDIS_URL") or "redis://127.0.0.1:6379/0"
    if _redis_answers(configured):
        yield configured
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("no Redis answers and redis-server is not installed (./dev test installs it)")
    port = _free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while not _redis_answers(url):
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
