"""Server processes pinned to a core, and their memory."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import ROOT

LOAD_CPU = "1"
SERVER_CPU = "0"


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


def pinned(cpu: str, argv: list[str]) -> list[str]:
    """`taskset -c CPU argv` when there are two cores or more (taskset execs, so the pid is the program's)."""
    import shutil

    if cpu_count() >= 2 and shutil.which("taskset"):
        return ["taskset", "-c", cpu, *argv]
    return argv


class Server:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.argv = argv
        self.env = {**env, "MIFAMILIAS_PORT": str(self.port)}
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> Server:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            pinned(SERVER_CPU, self.argv), cwd=ROOT, env=self.env, stdout=log, stderr=log
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
        raise RuntimeError(f"{self.name} did not answer:\n{self.log_path.read_text()}")

    def rss_kb(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def graphql_server(env: dict[str, str], log_dir: Path) -> Server:
    """Our server exactly as `./dev serve` runs it."""
    return Server("graphql", [sys.executable, str(ROOT / "app.py"), "serve"], env, log_dir)


def bench_server(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Server:
    return Server(name, [sys.executable, "-m", "bench.serve_app", *args], env, log_dir)
