"""The benchmark runs end to end on tiny sizes and reports every section's rows.
No timing is asserted: the benchmark is not a test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.__main__ import SECTIONS, run_sections, table
from bench.common import TINY


def test_every_section_reports_its_rows(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (./dev bench installs it)")
    rows = run_sections(TINY, tmp_path, log=False)
    rendered = table(rows)
    sections = {row.section for row in rows}
    assert {s.split(".")[0] for s in sections} == {str(n) for n in SECTIONS}
    measures = [row.measure for row in rows]
    for expected in (
        "Strawberry / graphql-core",
        "Strawberry / floor",
        "`me` GraphQL / plain (req/s)",
        "`feed` GraphQL / plain (req/s)",
        "ours / bare (medians)",
        "server RSS per idle subscription, deflate off (2 clients; each implementation below)",
        "query `me`",
        "mutation `setTags`",
        "/healthz p50 / p99 (ms): (a) amplification query, repeatedly",
        "/healthz p50 / p99 (ms): (c) 30 MB bodies",
        "server RSS growth, (b) peak (MB)",
        "`me` metrics on, tracing off / metrics off, tracing off (req/s)",
        "`feed` metrics on, tracing on / metrics off, tracing off (req/s)",
        "  capsules opened exactly once (counters sum to the capsules, every round, 1 and N processes)",
        "warm / fresh",
        "ours / floor, 4 workers",
    ):
        assert expected in measures, expected
    for implementation in ("websockets", "websockets-sansio", "wsproto"):
        for deflate in ("off", "on"):
            wanted = f"server RSS per idle subscription, `{implementation}`, deflate {deflate} (2 clients)"
            assert any(m.startswith(wanted) for m in measures), wanted
    assert any(m.startswith("full collection with") and "frozen after the burst" in m for m in measures)
    assert any(m.startswith("embedded store:") for m in measures)
    assert any(m.startswith("DynamoDB (moto_server)") for m in measures)
    # Section 8 checks that every capsule opened once and every event arrived.
    assert (
        next(row for row in rows if row.measure.startswith("  capsules opened exactly once")).median == "yes"
    )
    for ways in ("1 process", "2 processes"):
        assert any(
            m.startswith(f"unlock date → last delivery, {ways}, 6 subscribers; missed 0") for m in measures
        )
    assert not [row for row in rows if row.median == "not measured"]
    assert rendered.count("\n") == len(rows) + 1
