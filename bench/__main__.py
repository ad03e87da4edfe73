"""./dev bench [--quick] [--only 1,2,...] [--cases d] [--out PATH]: every section, one table,
written to bench/RESULTS.md with the machine and library versions.

./dev bench observability [--quick]: section 7 alone (what metrics and tracing
cost), printed, and written to bench/RESULTS-observability.md unless --out says
otherwise; ./dev bench scaleout [--quick]: section 8 alone (1 and 3 server
processes sharing the store and Redis), written to bench/RESULTS-scaleout.md;
./dev bench soak [--quick]: section 11 alone (three processes on DynamoDB and
Redis, clients writing and subscribing while one process is killed every two
minutes), written to bench/RESULTS-soak.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.common import FULL, QUICK, Row, Sizes, bench_settings, in_process_app, seed_feed, versions
from bench.processes import cpu_count

HERE = Path(__file__).resolve().parent
SECTIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
# The soak (11) runs only when asked for: ten minutes of its own.
NAMED = {"observability": 7, "scaleout": 8, "push": 10, "soak": 11}


async def _feed_sections(sizes: Sizes, tmp: Path, only: Sequence[int]) -> tuple[list[Row], str]:
    from bench import execution
    from tests.counting import CountingTable

    rows: list[Row] = []
    async with in_process_app(bench_settings(tmp / "data"), wrap_table=CountingTable) as api:
        family_id = await seed_feed(api)
        if 1 in only:
            rows += await execution.run(api.services, family_id, sizes.exec_rounds, sizes.exec_iterations)
    return rows, family_id


def run_sections(
    sizes: Sizes, tmp: Path, only: Sequence[int] = SECTIONS, log: bool = True, cases: str = ""
) -> list[Row]:
    from bench import (
        fanout,
        gc_pauses,
        http,
        media_probe,
        observability,
        push,
        robustness,
        round_trips,
        scaleout,
        soak,
        sockets,
        unlock,
    )

    def say(text: str) -> None:
        if log:
            print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    rows: list[Row] = []
    family_id = ""
    if 1 in only or 2 in only or 7 in only:
        say("seeding the feed; section 1 (execution)" if 1 in only else "seeding the feed")
        more, family_id = asyncio.run(_feed_sections(sizes, tmp, only))
        rows += more
    if 2 in only:
        say("section 2 (HTTP)")
        rows += http.run(tmp / "data", family_id, sizes, tmp)
    if 3 in only:
        say("section 3 (fan-out)")
        rows += fanout.run(sizes, tmp)
        say("section 3: memory per idle subscription, each WebSocket implementation")
        rows += sockets.run(sizes, tmp)
    if 4 in only:
        say("section 4 (unlock)")
        rows += asyncio.run(unlock.run(sizes, tmp))
    if 5 in only:
        say("section 5 (round trips)")
        rows += asyncio.run(round_trips.run(sizes, tmp))
    if 6 in only:
        say("section 6 (robustness)")
        rows += robustness.run(sizes, tmp, cases)
        if not cases:
            say("section 6: the collector's pauses with many subscriptions")
            rows += gc_pauses.run(sizes, tmp)
    if 7 in only:
        say("section 7 (observability cost)")
        rows += observability.run(tmp / "data", family_id, sizes, tmp)
    if 8 in only:
        say("section 8 (scale-out)")
        rows += scaleout.run(sizes, tmp)
    if 9 in only:
        say("section 9 (media probe)")
        rows += media_probe.run(sizes.probe_rounds, sizes.probes_per_round)
    if 10 in only:
        say("section 10 (Web Push)")
        rows += asyncio.run(push.run(sizes, tmp))
    if 11 in only:
        say("section 11 (soak with crashes)")
        rows += soak.run(sizes, tmp)
    return rows


HEADER = ("Section", "Measure", "Median", "Spread (min – max over rounds) / detail", "Target", "Met")


def table(rows: Sequence[Row]) -> str:
    def clean(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    last = None
    for row in rows:
        section = row.section if row.section != last else ""
        last = row.section
        cells = (section, row.measure, row.median, row.spread, row.target, row.met)
        lines.append("| " + " | ".join(clean(c) for c in cells) + " |")
    return "\n".join(lines)


# The pace probe's sizes: under a second each on a 2-CPU machine of 2026.
PACE_ADDITIONS = 20_000_000
PACE_COMMITS, PACE_ROWS_PER_COMMIT = 40, 500


def pace(tmp: Path) -> str:
    """How fast this machine runs what the sections spend most on, timed
    before them: Python (a loop of additions) and SQLite (rows of 400 bytes at
    scattered keys, written in commits to a WAL file), each the best of three.
    The absolute figures (milliseconds, capsules per second) move with the
    machine, even between machines of one name; these say by how much."""
    loops = []
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for n in range(PACE_ADDITIONS):
            total += n
        loops.append(time.perf_counter() - start)
    rows = [
        (hashlib.sha256(str(n).encode()).hexdigest(), "x" * 400)
        for n in range(PACE_COMMITS * PACE_ROWS_PER_COMMIT)
    ]
    writes = []
    for attempt in range(3):
        path = tmp / f"pace-{attempt}.sqlite3"
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE items (key TEXT PRIMARY KEY, body TEXT) WITHOUT ROWID")
            start = time.perf_counter()
            for c in range(0, len(rows), PACE_ROWS_PER_COMMIT):
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT INTO items VALUES (?, ?)", rows[c : c + PACE_ROWS_PER_COMMIT])
                db.execute("COMMIT")
            writes.append(time.perf_counter() - start)
    return (
        f"- Pace of this machine (best of 3, before the sections): Python, {PACE_ADDITIONS:,} additions"
        f" in a loop, {min(loops):.2f} s; SQLite, {len(rows):,} rows of 400 bytes at scattered keys"
        f" in {PACE_COMMITS} commits (WAL), {min(writes):.2f} s"
    )


def machine(sizes: Sizes, mode: str, seconds: float, measured_pace: str) -> str:
    wrk = shutil.which("wrk")
    wrk_version = ""
    if wrk:
        done = subprocess.run([wrk, "--version"], capture_output=True, text=True)
        wrk_version = (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else ""
    libs = ", ".join(f"{k} {v}" for k, v in versions().items())
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return "\n".join(
        [
            f"- Run: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, mode `{mode}`, {seconds:.0f} s in all",
            f"- Machine: {cpu_count()} CPUs ({cpu_model}), {platform.system()} {platform.release()}",
            measured_pace,
            f"- Python {platform.python_version()} ({platform.python_implementation()})",
            f"- Libraries: {libs}",
            f"- Load generator: {wrk_version or 'wrk not found'}",
            f"- Sizes: {sizes}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev bench")
    parser.add_argument("section", nargs="?", choices=sorted(NAMED), help="one named section alone")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a first look")
    parser.add_argument("--only", default="", help="comma-separated section numbers, e.g. 1,2")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cases", default="", help="section 6's cases alone, by letter, e.g. d or a,d")
    args = parser.parse_args(argv)
    only = [int(s) for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    if args.section:
        only = [NAMED[args.section]]
    out: Path = args.out or HERE / ("RESULTS.md" if not args.section else f"RESULTS-{args.section}.md")
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mifamilias-bench-") as tmp:
        measured_pace = pace(Path(tmp))
        rows = run_sections(sizes, Path(tmp), only, cases=args.cases)
    rendered = table(rows)
    print(rendered)
    notes = HERE / "NOTES.md"
    text = [
        "# Benchmark results",
        "",
        "Written by `./dev bench` (bench/__main__.py); do not edit by hand: the analysis lives in",
        "bench/NOTES.md and is copied below the table.",
        "",
        machine(sizes, "quick" if args.quick else "full", time.monotonic() - started, measured_pace),
        "",
        rendered,
        "",
    ]
    if notes.exists():
        text += [notes.read_text().strip(), ""]
    out.write_text("\n".join(text))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
