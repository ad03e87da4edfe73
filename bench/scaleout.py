"""Section 8: scale-out. 1, then N, `python app.py serve` processes sharing one
SQLite file (WAL; writes take the lock with BEGIN IMMEDIATE, so conditions
hold across processes) and one Redis. A family of M members subscribed to
capsuleUnlocked over graphql-transport-ws, spread over the processes; each
round seeds C capsules due at the same moment a little ahead, every member a
recipient of exactly one, their recipients spread over the processes. Per
round: which process opened each capsule (its mifamilias_capsules_unlocked
counter on /metrics), the unlock date to the last client receipt (same
machine clock), and each process's CPU seconds (its threads' schedstat)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import profiled as profile
from bench.common import Row, Sizes, Stats, server_env, token, verdict
from bench.fanout import Clients
from bench.processes import Server, cpu_seconds, graphql_server
from tests.factories import capsule_rows, family_rows

SECTION = "8. Scale-out"
SHARDS = 8  # the server's default MIFAMILIAS_UNLOCK_SHARDS
# A pass reads one poll ahead, so a capsule seeded more than a poll before its
# date is seen by every process's last pass before it, and each of them wakes
# at the date itself: the burst the section is about.
POLL_SECONDS = 1.0
LEAD_SECONDS = 2.5
# Deliveries that have not arrived this long after the date count as missed.
DEADLINE_SECONDS = 60.0
REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Round:
    due: float  # the unlock date, as time.time()
    capsules: list[str]
    opened: list[int]  # per process, from its counter
    cpu: list[float]  # per process, seconds
    timed_out: bool = False


@dataclass
class Result:
    processes: int
    rounds: list[Round] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)  # date -> last receipt, per round
    first: list[float] = field(default_factory=list)  # date -> first receipt, per round
    missed: int = 0
    extra: int = 0


def thread_cpu(pid: int) -> dict[str, float]:
    """Each thread's time on a CPU, in seconds, to the nanosecond (the
    scheduler's own count, /proc/<pid>/task/<tid>/schedstat). A round is a
    few tenths of a second of CPU, and the 10 ms clock ticks of
    /proc/<pid>/stat moved a ratio of three processes' sums by about 0.07 a
    tick; that count is the fallback where schedstat is not kept."""
    spent: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile, or no schedstat
            spent[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
    return spent or {"all": cpu_seconds(pid)}


def cpu_between(before: dict[str, float], after: dict[str, float]) -> float:
    """The CPU a process spent between two readings: its threads' times then
    (a thread started meanwhile counts whole; the server's threads live as
    long as it does)."""
    return sum(seconds - before.get(tid, 0.0) for tid, seconds in after.items())


def unlocked_counter(server: Server) -> int:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("mifamilias_capsules_unlocked_total "):
                return int(float(line.split()[1]))
    raise RuntimeError(f"{server.name} has no mifamilias_capsules_unlocked_total on /metrics")


@contextlib.contextmanager
def shared_redis(tmp: Path) -> Iterator[str]:
    """The machine's Redis when it answers (ids of this run's own keep its
    channels apart), else one of our own."""
    from tests.servers import RedisProcess, redis_answers

    if redis_answers(REDIS_URL):
        yield REDIS_URL
        return
    redis = RedisProcess(tmp / "redis").start()
    try:
        yield redis.url
    finally:
        redis.stop()


async def seed_family(data_dir: Path, family: str, creator: str, people: list[str]) -> None:
    from store.sqlite import SqliteTable

    table = SqliteTable(data_dir / "mifamilias.sqlite3")
    try:
        await table.batch_write(family_rows(family, creator, people))
    finally:
        await table.close()


async def seed_round(
    data_dir: Path, family: str, creator: str, people: list[str], capsules: int, due: datetime, tag: str
) -> list[str]:
    """`capsules` LOCKED capsules with READY content, all due at `due`; member k
    is a recipient of capsule k mod `capsules` only."""
    from store.sqlite import SqliteTable

    table = SqliteTable(data_dir / "mifamilias.sqlite3")
    ids = []
    rows: list[dict[str, Any]] = []
    for c in range(capsules):
        capsule_id, more = capsule_rows(family, creator, people[c::capsules], due, SHARDS, tag=f"{tag}x{c}")
        ids.append(capsule_id)
        rows += more
    try:
        await table.batch_write(rows)
    finally:
        await table.close()
    return ids


def wait_for(clients: list[Clients], total: int, deadline: float) -> bool:
    """Polls the clients until they hold `total` events; False past the deadline."""
    while sum(c.count() for c in clients) < total:
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_config(sizes: Sizes, tmp: Path, processes: int, redis_url: str) -> Result:
    run_id = uuid.uuid4().hex[:6]  # fresh user ids: no other run's subscribers on these channels
    family, creator = f"sofam{run_id}", f"socreator{run_id}"
    members, capsules = sizes.scaleout_members, sizes.scaleout_capsules
    people = [f"so{run_id}m{k:04d}" for k in range(members)]
    data_dir = tmp / f"scaleout-{processes}"
    data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(seed_family(data_dir, family, creator, people))
    env = server_env(
        data_dir, MIFAMILIAS_REDIS_URL=redis_url, MIFAMILIAS_UNLOCK_POLL_SECONDS=str(POLL_SECONDS)
    )
    # Under the profiler, the counted rounds' windows alone: neither the
    # start-up and the subscribing, nor the probes between rounds.
    profiled = bool(os.environ.get("MIFAMILIAS_BENCH_PROFILE"))
    if profiled:
        env[profile.WINDOWS] = "1"
    servers = [graphql_server(env, tmp) for _ in range(processes)]
    result = Result(processes)
    clients: list[Clients] = []
    received: list[tuple[float, str]] = []
    try:
        for server in servers:
            server.start()
        # Member k listens on process (k // capsules) mod N: every capsule's
        # recipients are spread over the processes, so most of them hear of it
        # from a process other than the one that opened it (through Redis).
        shares: list[list[str]] = [[] for _ in servers]
        for k, person in enumerate(people):
            shares[(k // capsules) % processes].append(token(person))
        # The same number of client processes for 1 and N servers.
        per_server = max(1, sizes.scaleout_processes // processes)
        clients = [
            Clients(server.ws_url, share, per_server)
            for server, share in zip(servers, shares, strict=True)
            if share
        ]
        for group in clients:
            group.wait_ready()
        pids = [server.process.pid for server in servers if server.process is not None]
        delivered = 0
        # A first round that is not counted: the first unlock after start-up pays
        # for imports, caches and the first Redis round trips.
        for r in range(sizes.scaleout_rounds + 1):
            counters = [unlocked_counter(server) for server in servers]
            cpu = [thread_cpu(pid) for pid in pids]
            if profiled and r > 0:
                for pid in pids:
                    profile.resume(pid)
            due = datetime.now(UTC) + timedelta(seconds=LEAD_SECONDS)
            ids = asyncio.run(seed_round(data_dir, family, creator, people, capsules, due, f"r{r}"))
            delivered += members
            arrived = wait_for(clients, delivered, due.timestamp() + DEADLINE_SECONDS)
            # The CPU before the counters: a /metrics page is the bench's probe,
            # not the round's work (the opening read is taken before the CPU, too).
            if profiled:
                for pid in pids:
                    profile.pause(pid)
            spent = [cpu_between(before, thread_cpu(pid)) for pid, before in zip(pids, cpu, strict=True)]
            opened = [unlocked_counter(s) - before for s, before in zip(servers, counters, strict=True)]
            if r > 0:
                result.rounds.append(Round(due.timestamp(), ids, opened, spent, not arrived))
            if not arrived:
                break  # counted as missed below; late events would blur the next round's count
            time.sleep(0.3)  # the outbox deletes after the last publish
    finally:
        for group in clients:
            received += group.stop()
        for server in servers:
            server.stop()
    for rnd in result.rounds:
        mine = set(rnd.capsules)
        got = [stamp for stamp, capsule in received if capsule in mine]
        result.missed += max(0, members - len(got))
        result.extra += max(0, len(got) - members)
        if got:
            result.latency.append(max(got) - rnd.due)
            result.first.append(min(got) - rnd.due)
    return result


def run(sizes: Sizes, tmp: Path) -> list[Row]:
    with shared_redis(tmp) as redis_url:
        results = [run_config(sizes, tmp, n, redis_url) for n in (1, sizes.scaleout_processes)]
    return rows_of(sizes, results)


def rows_of(sizes: Sizes, results: list[Result]) -> list[Row]:
    members, capsules = sizes.scaleout_members, sizes.scaleout_capsules
    rows: list[Row] = []
    many = results[-1]
    n = many.processes
    bound = 2 / n
    max_shares = [max(r.opened) / sum(r.opened) for r in many.rounds if sum(r.opened)]
    stats = Stats.of(max_shares)
    median, spread = stats.fmt("%", 0, 100)
    per_round = "; ".join("/".join(str(k) for k in r.opened) for r in many.rounds)
    rows.append(
        Row(
            SECTION,
            f"unlocks per process, {n} processes, {capsules} capsules due at once: "
            f"largest share of a round (opened per process: {per_round})",
            median,
            spread,
            "",
            f"worst round ≤ {bound:.0%} (2/N)",
            verdict(bool(max_shares) and stats.high <= bound + 1e-9),
        )
    )
    twice = [r for res in results for r in res.rounds if sum(r.opened) != len(r.capsules)]
    rows.append(
        Row(
            SECTION,
            "  capsules opened exactly once (counters sum to the capsules, every round, 1 and N processes)",
            "yes" if not twice else f"**no** ({len(twice)} rounds)",
        )
    )
    for res in results:
        label = "1 process" if res.processes == 1 else f"{res.processes} processes"
        late = sum(1 for r in res.rounds if r.timed_out)
        past = f", {late} rounds past the deadline" if late else ""
        stats = Stats.of(res.latency)
        median, spread = stats.fmt(" ms", 0, 1000)
        rows.append(
            Row(
                SECTION,
                f"unlock date → last delivery, {label}, {members} subscribers; "
                f"missed {res.missed}, repeated {res.extra}{past}",
                median,
                spread,
                "",
                "median ≤ 1 s",
                verdict(bool(res.latency) and stats.median <= 1.0),
            )
        )
        rows.append(Row(SECTION, "  worst round", f"{stats.high * 1000:,.0f} ms"))
        median, spread = Stats.of(res.first).fmt(" ms", 0, 1000)
        rows.append(Row(SECTION, "  of which: date → first delivery", median, spread))
        per_process = [cpu for r in res.rounds for cpu in r.cpu]
        totals = Stats.of([sum(r.cpu) for r in res.rounds])
        median, spread = Stats.of(per_process).fmt(" s", 3)
        rows.append(
            Row(
                SECTION,
                f"CPU per process per round, {label} (all processes: median {totals.median:.3f} s a round)",
                median,
                spread,
            )
        )
    rows.append(cpu_ratio_row(results))
    return rows


def cpu_ratio_row(results: list[Result]) -> Row:
    """The CPU all N processes spend on a round over what one process spends on
    the same round: what scale-out costs beyond the work itself."""
    one, many = results[0], results[-1]
    totals = [Stats.of([sum(r.cpu) for r in res.rounds]) for res in (one, many)]
    ratio = totals[1].median / totals[0].median if totals[0].median > 0 else float("nan")
    return Row(
        SECTION,
        f"scale-out: CPU of {many.processes} processes / {one.processes} process",
        f"{ratio:.2f}",
        f"medians of all processes' CPU a round: {totals[1].median:.3f} s / {totals[0].median:.3f} s",
        "",
        "≤ 1.2",
        verdict(ratio == ratio and ratio <= 1.2),
    )
