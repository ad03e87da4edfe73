"""No process started by the run outlives what started it.

Each test process (pytest, and each xdist worker) makes itself a child
subreaper: a process whose parent dies is handed to the nearest subreaper above
it instead of to init, so a forkserver, a resource tracker or a speech worker
left by a SIGKILLed server stays in view as a descendant of the run.

Two checks use that:

- when a module's tests are done and its fixtures torn down, every descendant
  must be gone, but those of the session's own fixtures (moto_server, Redis),
  registered with :func:`lives_for_the_session`; the module's last test fails
  with the leftovers' command lines;
- when the whole run ends (the xdist controller, after its workers), nothing is
  left at all; leftovers fail the run.

Leftovers are killed either way, so a failing run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

_PR_SET_CHILD_SUBREAPER = 36
# A process given SIGTERM by a fixture may take a while to go on a loaded machine;
# the bound only limits how long a real leftover delays its report.
_SETTLE_SECONDS = 30.0

_session_pids: set[int] = set()


def lives_for_the_session(pid: int) -> None:
    """`pid` (and what it starts) belongs to a session fixture that stops it at the end."""
    _session_pids.add(pid)


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


@dataclass(frozen=True)
class Process:
    pid: int
    parent: int
    state: str
    command: str

    def __str__(self) -> str:
        return f"{self.pid} (parent {self.parent}): {self.command[:200]}"


def _processes() -> Iterator[Process]:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # it ended while we looked
        yield Process(int(entry.name), int(fields[1]), fields[0], command)


def own_helpers() -> set[int]:
    """This process's multiprocessing forkserver and resource tracker, if started:
    they serve it (its in-process apps make photos) for as long as it lives."""
    from multiprocessing import forkserver, resource_tracker

    pids = {
        getattr(forkserver._forkserver, "_forkserver_pid", None),
        getattr(resource_tracker._resource_tracker, "_pid", None),
    }
    return {pid for pid in pids if pid is not None}


def descendants(root: int | None = None, *, spared: set[int] | frozenset[int] = frozenset()) -> list[Process]:
    """The live (not zombie) processes below `root` (this process), less `spared`
    and theirs, and less this process's own helpers (but not what they started)."""
    helpers = own_helpers() if root is None else set()
    children: dict[int, list[Process]] = {}
    for process in _processes():
        children.setdefault(process.parent, []).append(process)
    found: list[Process] = []
    below = [os.getpid() if root is None else root]
    while below:
        for child in children.get(below.pop(), []):
            if child.pid in spared:
                continue
            if child.state != "Z" and child.pid not in helpers:
                found.append(child)
            below.append(child.pid)
    return found


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie has: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def settled(spared: set[int] | frozenset[int] = frozenset()) -> list[Process]:
    """What is still running once processes that are on their way out have gone."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    while (left := descendants(spared=spared)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill(processes: list[Process]) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


def reap_orphans() -> None:
    """Zombies handed to this subreaper have no one else to wait for them."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def pytest_configure(config: pytest.Config) -> None:
    become_subreaper()


def _module(item: pytest.Item | None) -> str:
    return item.module.__name__ if isinstance(item, pytest.Function) and item.module else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    outcome: Any = yield
    if nextitem is not None and _module(nextitem) == _module(item):
        return
    left = settled(spared=_session_pids if nextitem is not None else frozenset())
    if left:
        kill(left)
        listing = "\n".join(f"  {process}" for process in left)
        outcome.force_exception(
            AssertionError(f"{_module(item)} left processes running (now killed):\n{listing}")
        )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    left = settled()
    if left:
        kill(left)
        listing = "\n".join(f"  {process}" for process in left)
        session.config.get_terminal_writer().line(
            f"processes left running when the run ended (now killed):\n{listing}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    reap_orphans()
