"""Shared fixtures. pytest-asyncio runs in auto mode on one session loop."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import SECRET, ServerProcess

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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def moto_server(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto_server on a free local port for the whole session; yields its URL."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto_server.log"
    script = Path(sys.executable).parent / "moto_server"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "moto.server"]
    with log_path.open("wb") as log:
        process = subprocess.Popen([*command, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
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
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()



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
