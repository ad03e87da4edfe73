"""The benchmark runs end to end on tiny sizes and reports every section's rows.
No timing is asserted: the benchmark is not a test. One test per section, so
that parallel workers share them out. Its profiler counts what a section asks."""

from __future__ import annotations

import os
import pstats
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import profiled
from bench.__main__ import SECTIONS, pace, run_sections, table
from bench.common import ROOT, TINY
from bench.push import NETWORK_DELAY_MS

SLOW_READERS, NORMAL_READERS = TINY.slow_readers, TINY.normal_readers
# Measures each section must report, by their whole name or (second) by how they start.
MEASURES: dict[int, tuple[str, ...]] = {
    1: ("Strawberry / graphql-core", "Strawberry / floor"),
    2: ("`me` GraphQL / plain (req/s)", "`feed` GraphQL / plain (req/s)"),
    3: (
        "ours / bare (medians)",
        "server RSS per idle subscription, deflate off (2 clients; each implementation below)",
    ),
    5: ("query `me`", "mutation `setTags`"),
    6: (
        "/healthz p50 / p99 (ms): (a) amplification query, repeatedly",
        "/healthz p50 / p99 (ms): (c) 30 MB bodies",
        "/healthz p50 / p99 (ms): (i) 20 parallel replays of one person",
        "server RSS growth, (b) peak (MB)",
    ),
    7: (
        "`me` metrics on, tracing off / metrics off, tracing off (req/s)",
        "`feed` metrics on, tracing on / metrics off, tracing off (req/s)",
    ),
    8: ("  capsules opened exactly once (counters sum to the capsules, every round, 1 and N processes)",),
    9: ("warm / fresh",),
    10: (
        "push: ours / transport alone",
        "store calls per push (the opening's own included)",
        f"push: ours / transport alone, push service answering in {NETWORK_DELAY_MS} ms",
    ),
}
MEASURES_STARTING: dict[int, tuple[str, ...]] = {
    3: tuple(
        f"server RSS per idle subscription, `{implementation}`, deflate {deflate} (2 clients)"
        for implementation in TINY.ws_implementations
        for deflate in ("off", "on")
    ),
    4: (
        "embedded store:",
        "  SQLite alone writing the pass's rows",
        "  embedded store / SQLite alone",
        "DynamoDB (moto_server)",
        "  write units per capsule",
        "  the server's CPU per capsule on DynamoDB",
    ),
    6: (
        "full collection with",
        "/healthz p50 / p99 (ms): (k) a long recording transcoded",
        f"/healthz p50 / p99 (ms): (e) {SLOW_READERS} slow readers beside {NORMAL_READERS} normal subscribers, SQLite",
        f"/healthz p50 / p99 (ms): (e) {SLOW_READERS} slow readers beside {NORMAL_READERS} normal subscribers, DynamoDB",
        "another person's push latency (s), (j) behind 20 devices",
    ),
    8: tuple(
        f"unlock date → last delivery, {ways}, 6 subscribers; missed 0"
        for ways in ("1 process", "2 processes")
    ),
}


def test_every_section_has_its_test() -> None:
    assert set(MEASURES) | set(MEASURES_STARTING) == set(SECTIONS)


@pytest.mark.parametrize("section", SECTIONS)
def test_each_section_reports_its_rows(section: int, tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (./dev bench installs it)")
    rows = run_sections(TINY, tmp_path, only=[section], log=False)
    assert {row.section.split(".")[0] for row in rows} == {str(section)}
    measures = [row.measure for row in rows]
    for expected in MEASURES.get(section, ()):
        assert expected in measures, expected
    for start in MEASURES_STARTING.get(section, ()):
        assert any(m.startswith(start) for m in measures), start
    if section == 6:
        assert any(m.startswith("full collection with") and "frozen after the burst" in m for m in measures)
    if section == 8:  # it checks that every capsule opened once and every event arrived
        opened = next(row for row in rows if row.measure.startswith("  capsules opened exactly once"))
        assert opened.median == "yes"
    assert not [row for row in rows if row.median == "not measured"]
    assert table(rows).count("\n") == len(rows) + 1


def test_the_machines_pace_is_measured(tmp_path: Path) -> None:
    line = pace(tmp_path)
    seconds = [float(found) for found in re.findall(r", ([0-9.]+) s(?:;|$)", line)]
    assert len(seconds) == 2 and all(s > 0 for s in seconds), line


WINDOWED = """
import os, signal

def before(): return sum(range(1000))
def inside(): return sum(range(1000))
def after(): return sum(range(1000))

before()
os.kill(os.getpid(), signal.SIGUSR1)
inside()
os.kill(os.getpid(), signal.SIGUSR2)
after()
"""


@pytest.mark.parametrize("windows", [True, False])
def test_a_profiled_process_counts_its_windows_alone_when_asked(windows: bool, tmp_path: Path) -> None:
    script, out = tmp_path / "windowed.py", tmp_path / "windowed.prof"
    script.write_text(WINDOWED)
    env = {k: v for k, v in os.environ.items() if k != profiled.WINDOWS}
    if windows:
        env[profiled.WINDOWS] = "1"
    subprocess.run(
        [sys.executable, "-m", "bench.profiled", str(out), str(script)], env=env, cwd=ROOT, check=True
    )
    counted = {name for _, _, name in pstats.Stats(str(out)).stats}  # type: ignore[attr-defined]
    # Paused and resumed either way; with `WINDOWS` it starts paused.
    assert "inside" in counted and "after" not in counted
    assert ("before" in counted) is not windows
