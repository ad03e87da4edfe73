"""Server processes pinned to a core, and their memory."""

from __future__ import annotations

import os
import sys
import uuid
from functools import partial
from pathlib import Path

from bench.common import ROOT
from tests.servers import ServerProcess

LOAD_CPU = "1"
SERVER_CPU = "0"


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, user and system, all its threads: what a
    load cost it, whatever else the machine ran beside it. In clock ticks (10
    ms): enough for a load of seconds; section 8 reads its threads' schedstat
    to the nanosecond (`bench.scaleout.thread_cpu`) and falls back to this."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def pinned(cpu: str, argv: list[str]) -> list[str]:
    """`taskset -c CPU argv` when there are two cores or more (taskset execs, so the pid is the program's)."""
    import shutil

    if cpu_count() >= 2 and shutil.which("taskset"):
        return ["taskset", "-c", cpu, *argv]
    return argv


class Server(ServerProcess):
    """A server process pinned to the server core, whose memory can be read."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        super().__init__(log_dir, env, argv=argv, name=name, launcher=partial(pinned, SERVER_CPU))

    def rss_kb(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def graphql_server(env: dict[str, str], log_dir: Path) -> Server:
    """Our server exactly as `./dev serve` runs it; under cProfile when
    `MIFAMILIAS_BENCH_PROFILE` names a folder (a profile per process, written
    when it stops), to see where a section's CPU goes."""
    argv = [str(ROOT / "app.py"), "serve"]
    profiles = os.environ.get("MIFAMILIAS_BENCH_PROFILE")
    if profiles:
        Path(profiles).mkdir(parents=True, exist_ok=True)
        argv = ["-m", "bench.profiled", str(Path(profiles) / f"graphql-{uuid.uuid4().hex[:8]}.prof"), *argv]
    return Server("graphql", [sys.executable, *argv], env, log_dir)


def bench_server(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Server:
    return Server(name, [sys.executable, "-m", "bench.serve_app", *args], env, log_dir)
