"""Section 3: subscription fan-out. N graphql-transport-ws clients (raw
`websockets`, in a few processes on core 1) subscribed to capsuleUnlocked on
one server process (core 0); capsules with all of them as recipients unlock.
Then the same over Server-Sent Events (N httpx streams).
The same broadcast from a bare Starlette WebSocket endpoint is the baseline.
Also the server's memory per idle subscription (each WebSocket implementation
and deflate off and on: bench/sockets.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import ROOT, Row, Sizes, Stats, server_env, token, verdict
from bench.processes import LOAD_CPU, Server, bench_server, pinned
from resolvers.domain.capsules import MAX_RECIPIENTS
from tests.factories import capsule_rows, family_rows

SECTION = "3. Subscription fan-out"
FAMILY = "fanoutfam"
CREATOR = "fanoutcreator"
SHARDS = 8  # the server's default MIFAMILIAS_UNLOCK_SHARDS


class Clients:
    """Client processes on the load core, each holding a share of the subscriptions."""

    def __init__(self, url: str, tokens: list[str], processes: int, query: str | None = None) -> None:
        processes = max(1, min(processes, len(tokens)))
        shares = [tokens[n::processes] for n in range(processes)]
        self.procs = []
        for share in shares:
            proc = subprocess.Popen(
                pinned(
                    LOAD_CPU, [sys.executable, "-m", "bench.ws_clients", url, *([query] if query else [])]
                ),
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(",".join(share) + "\n")
            proc.stdin.flush()
            self.procs.append(proc)

    def wait_ready(self) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().split(" ", 3)
            if len(line) < 3 or line[0] != "READY" or line[2] != "0":
                self.stop()
                raise RuntimeError(f"clients failed to subscribe: {line}")

    def started(self) -> int:
        """Once every subscription is sent: how many had ended already (a
        replay the budget refused ends; that is no failure to start)."""
        ended = 0
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().split(" ", 3)
            if len(line) < 3 or line[0] != "READY":
                self.stop()
                raise RuntimeError(f"clients failed to subscribe: {line}")
            ended += int(line[2])
        return ended

    def count(self, label: str = "") -> int:
        """Events the clients have received so far (of `label` alone, when given)."""
        total = 0
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"COUNT {label}".strip() + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline().split()
            if len(line) != 2 or line[0] != "COUNT":
                raise RuntimeError(f"a client process answered {line!r} to COUNT")
            total += int(line[1])
        return total

    def stop(self) -> list[tuple[float, str]]:
        received: list[tuple[float, str]] = []
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write("STOP\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                if line:
                    received += [(float(t), str(c)) for t, c in json.loads(line)["received"]]
            except (BrokenPipeError, ValueError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return received


async def seed_people(data_dir: Path, people: list[str]) -> None:
    from store.sqlite import SqliteTable

    table = SqliteTable(data_dir / "mifamilias.sqlite3")
    try:
        await table.batch_write(family_rows(FAMILY, CREATOR, people))
    finally:
        await table.close()


async def seed_round(data_dir: Path, people: list[str], round_no: int) -> list[str]:
    """ceil(N / MAX_RECIPIENTS) capsules (one, now that a capsule may go to a whole
    family), due now, together addressed to every subscriber once."""
    from store.sqlite import SqliteTable

    table = SqliteTable(data_dir / "mifamilias.sqlite3")
    capsules = []
    rows: list[dict[str, Any]] = []
    due = datetime.now(UTC) - timedelta(seconds=1)
    for start in range(0, len(people), MAX_RECIPIENTS):
        capsule_id, more = capsule_rows(
            FAMILY, CREATOR, people[start : start + MAX_RECIPIENTS], due, SHARDS, tag=f"r{round_no}x"
        )
        capsules.append(capsule_id)
        rows += more
    try:
        await table.batch_write(rows)
    finally:
        await table.close()
    return capsules


def read_log(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        stamp, capsule_id = line.split()
        found[capsule_id] = float(stamp)
    return found


def settle_seconds(clients: int) -> float:
    return 1.0 + clients / 1000


def until_received(clients: Clients, expected: int, bound: float) -> None:
    """Until the client processes hold `expected` events, or `bound` seconds
    have passed (what is still missing then is counted as missed)."""
    deadline = time.monotonic() + bound
    while clients.count() < expected and time.monotonic() < deadline:
        time.sleep(0.02)


def idle_memory(server: Server, tokens: list[str], warm: list[str], processes: int) -> tuple[float, Clients]:
    """KB of server RSS per idle subscription; the clients stay connected."""
    warm_clients = Clients(server.url.replace("http", "ws") + server.ws_path, warm, 1)  # type: ignore[attr-defined]
    warm_clients.wait_ready()
    time.sleep(0.5)
    before = server.rss_kb()
    clients = Clients(server.url.replace("http", "ws") + server.ws_path, tokens, processes)  # type: ignore[attr-defined]
    clients.wait_ready()
    time.sleep(1.0)
    after = server.rss_kb()
    warm_clients.stop()
    return (after - before) / len(tokens), clients


def run(sizes: Sizes, log_dir: Path) -> list[Row]:
    n = sizes.fanout_clients
    people = [f"sub{k:05d}" for k in range(n)]
    tokens = [token(p) for p in people]
    warm = [token(f"warm{k}") for k in range(min(5, n))]
    data_dir = log_dir / "fanout"
    data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(seed_people(data_dir, people))
    env = server_env(data_dir, MIFAMILIAS_UNLOCK_POLL_SECONDS="0.2")
    unlock_log = data_dir / "unlocks.log"
    memory: dict[tuple[str, bool], float] = {}
    latency: dict[str, list[float]] = {"graphql": [], "bare": [], "sse": []}
    spans: list[float] = []
    missing: dict[str, int] = {"graphql": 0, "bare": 0, "sse": 0}

    # Ours, deflate off: memory, then the unlocks.
    server = bench_server("fanout-graphql", ["--unlock-log", str(unlock_log)], env, log_dir)
    server.ws_path = "/graphql"  # type: ignore[attr-defined]
    with server:
        memory["graphql", False], clients = idle_memory(server, tokens, warm, sizes.fanout_processes)
        rounds: list[list[str]] = []
        try:
            for r in range(sizes.fanout_rounds):
                capsules = asyncio.run(seed_round(data_dir, people, r))
                rounds.append(capsules)
                deadline = time.monotonic() + 120
                while not set(capsules) <= set(read_log(unlock_log)):
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the capsules did not unlock:\n{server.log_path.read_text()[-3000:]}"
                        )
                    time.sleep(0.05)
                until_received(clients, n * (r + 1), settle_seconds(n))
        finally:
            received = clients.stop()
    commits = read_log(unlock_log)
    for capsules in rounds:
        mine = set(capsules)
        got = [stamp for stamp, capsule in received if capsule in mine]
        missing["graphql"] += n - len(got)
        first = min(commits[c] for c in capsules)
        spans.append(max(commits[c] for c in capsules) - first)
        if got:
            latency["graphql"].append(max(got) - first)

    # Ours over Server-Sent Events (graphql-sse), the same unlocks, beside the WebSocket.
    sse_log = data_dir / "unlocks-sse.log"
    server = bench_server("fanout-sse", ["--unlock-log", str(sse_log)], env, log_dir)
    with server:
        clients = Clients(f"{server.url}/graphql", tokens, sizes.fanout_processes)
        clients.wait_ready()
        time.sleep(1.0)
        sse_rounds: list[list[str]] = []
        try:
            for r in range(sizes.fanout_rounds):
                capsules = asyncio.run(seed_round(data_dir, people, 100 + r))
                sse_rounds.append(capsules)
                deadline = time.monotonic() + 120
                while not set(capsules) <= set(read_log(sse_log)):
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the capsules did not unlock:\n{server.log_path.read_text()[-3000:]}"
                        )
                    time.sleep(0.05)
                until_received(clients, n * (r + 1), settle_seconds(n))
        finally:
            received = clients.stop()
    sse_commits = read_log(sse_log)
    for capsules in sse_rounds:
        mine = set(capsules)
        got = [stamp for stamp, capsule in received if capsule in mine]
        missing["sse"] += n - len(got)
        if got:
            latency["sse"].append(max(got) - min(sse_commits[c] for c in capsules))

    # The bare endpoint, deflate off: memory, then the broadcasts.
    bare = bench_server("fanout-bare", ["--plain"], env, log_dir)
    bare.ws_path = "/ws"  # type: ignore[attr-defined]
    with bare:
        memory["bare", False], clients = idle_memory(bare, tokens, warm, sizes.fanout_processes)
        starts = []
        try:
            for r in range(sizes.fanout_rounds):
                body = json.dumps(
                    {"capsuleId": f"bare{r}", "unlockedAt": datetime.now(UTC).isoformat()}
                ).encode()
                request = urllib.request.Request(
                    f"{bare.url}/broadcast", data=body, headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=60) as response:
                    starts.append(float(json.loads(response.read())["started"]))
                until_received(clients, n * (r + 1), settle_seconds(n))
        finally:
            received = clients.stop()
    for r, started in enumerate(starts):
        got = [stamp for stamp, capsule in received if capsule == f"bare{r}"]
        missing["bare"] += n - len(got)
        if got:
            latency["bare"].append(max(got) - started)

    return rows_of(n, latency, spans, missing, memory, len(rounds[0]) if rounds else 0)


def rows_of(
    n: int,
    latency: dict[str, list[float]],
    spans: list[float],
    missing: dict[str, int],
    memory: dict[tuple[str, bool], float],
    capsules_per_round: int,
) -> list[Row]:
    ours, bare = Stats.of(latency["graphql"]), Stats.of(latency["bare"])
    m, s = ours.fmt(" ms", 0, 1000)
    rows = [
        Row(
            SECTION,
            f"unlock → last delivery, {n} subscribers ({capsules_per_round} capsules of ≤ {MAX_RECIPIENTS}); "
            f"missed {missing['graphql']}",
            m,
            s,
            "",
            "median ≤ 150 ms",
            verdict(ours.median <= 0.150),
        ),
        Row(
            SECTION,
            "  worst round",
            f"{ours.high * 1000:,.0f} ms",
            "",
            "",
            "≤ 250 ms",
            verdict(ours.high <= 0.250),
        ),
    ]
    m, s = Stats.of(spans).fmt(" ms", 0, 1000)
    rows.append(Row(SECTION, "  of which: first to last unlock commit", m, s))
    m, s = bare.fmt(" ms", 0, 1000)
    rows.append(Row(SECTION, f"bare Starlette broadcast → last delivery; missed {missing['bare']}", m, s))
    if latency["graphql"] and latency["bare"]:
        ratio = ours.median / bare.median if bare.median else float("inf")
        rows.append(
            Row(
                SECTION,
                "ours / bare (medians)",
                f"{ratio:.1f}×",
                "",
                f"{ratio:.1f}×",
                "≤ 3×",
                verdict(ratio <= 3),
            )
        )
    if latency["sse"]:
        sse = Stats.of(latency["sse"])
        m, s = sse.fmt(" ms", 0, 1000)
        rows.append(
            Row(SECTION, f"over SSE (graphql-sse): unlock → last delivery; missed {missing['sse']}", m, s)
        )
        rows.append(Row(SECTION, "  worst round", f"{sse.high * 1000:,.0f} ms", ""))
    ours_kb = memory["graphql", False]
    rows.append(
        Row(
            SECTION,
            f"server RSS per idle subscription, deflate off ({n} clients; each implementation below)",
            f"{ours_kb:.1f} KB",
            f"bare endpoint: {memory['bare', False]:.1f} KB",
            "",
            "≤ 45 KB",
            verdict(ours_kb <= 45),
        )
    )
    return rows
