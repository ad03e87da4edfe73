"""Part of section 6: the collector's pauses with many subscriptions. One
server per way, each with a probe (`bench/serve_app.py --gc-probe`) that notes
every full collection and, on request, times one `gc.collect()`: after a
warm-up, then once N idle subscriptions are open and have settled.

The ways: the collector as CPython sets it (the heap frozen at start-up only);
the heap frozen after the burst of subscriptions (`resolvers/core/heap.py`,
the default); a higher oldest-generation threshold (fewer full collections,
each as long).

    python -m bench.gc_pauses [SUBSCRIPTIONS]   # this part alone, printed
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Row, Sizes, server_env, token, verdict
from bench.fanout import Clients
from bench.processes import bench_server

SECTION = "6. Robustness"
WAYS: tuple[tuple[str, dict[str, str], list[str]], ...] = (
    ("CPython's defaults (frozen at start-up only)", {"MIFAMILIAS_FREEZE_SUBSCRIPTIONS": "false"}, []),
    ("frozen after the burst of subscriptions (the default)", {}, []),
    (
        "threshold (700, 10, 100), not frozen",
        {"MIFAMILIAS_FREEZE_SUBSCRIPTIONS": "false"},
        ["--gc-threshold", "700,10,100"],
    ),
)


def _report(pid: int, path: Path, count: int) -> dict[str, Any]:
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return dict(json.loads(lines[count - 1]))
        time.sleep(0.1)
    raise RuntimeError("the server did not report its collector")


def measure(n: int, processes: int, data_dir: Path, log_dir: Path) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for number, (name, extra, args) in enumerate(WAYS):
        probe = log_dir / f"gc-{number}.jsonl"
        server = bench_server(
            f"gc-{number}", ["--gc-probe", str(probe), *args], server_env(data_dir, **extra), log_dir
        )
        with server:
            assert server.process is not None
            url = server.url.replace("http", "ws") + "/graphql"
            warm = Clients(url, [token("warm")] * 5, 1)
            warm.wait_ready()
            time.sleep(1.5)
            before = _report(server.process.pid, probe, 1)
            clients = Clients(url, [token("ana")] * n, processes)
            try:
                started = time.monotonic()
                clients.wait_ready()
                subscribing = time.monotonic() - started
                time.sleep(3.0)  # past the quiet second after which the heap is frozen
                after = _report(server.process.pid, probe, 2)
            finally:
                clients.stop()
                warm.stop()
        during = after["full_collections"][len(before["full_collections"]) :]
        results[name] = {
            "collect": after["collect"],
            "during": during,
            "objects": (after["tracked"] + after["frozen"] - before["tracked"] - before["frozen"]) / n,
            "tracked": after["tracked"],
            "subscribing": subscribing,
        }
        print(f"[gc] {name}: {results[name]}", file=sys.stderr, flush=True)
    return results


def rows_of(n: int, results: dict[str, dict[str, Any]]) -> list[Row]:
    rows = []
    baseline = results[WAYS[0][0]]["collect"]
    for name, result in results.items():
        during = result["during"]
        rows.append(
            Row(
                SECTION,
                f"full collection with {n:,} idle subscriptions, {name}",
                f"{result['collect'] * 1000:,.0f} ms",
                f"{len(during)} full collections while subscribing (longest "
                f"{max(during, default=0) * 1000:,.0f} ms); {result['tracked']:,} objects walked; "
                f"{result['objects']:.0f} objects per subscription",
                f"{result['collect'] / baseline:.2f}×" if baseline else "",
                "≤ 100 ms",
                verdict(result["collect"] <= 0.1),
            )
        )
    return rows


def run(sizes: Sizes, log_dir: Path) -> list[Row]:
    data_dir = log_dir / "gc"
    data_dir.mkdir(parents=True, exist_ok=True)
    n = sizes.robust_subscribers
    return rows_of(n, measure(n, sizes.fanout_processes, data_dir, log_dir))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else Sizes().robust_subscribers
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "gc"
        data_dir.mkdir()
        results = measure(n, Sizes().fanout_processes, data_dir, Path(tmp))
    for row in rows_of(n, results):
        print(" | ".join(str(cell) for cell in dataclasses.astuple(row)), flush=True)


if __name__ == "__main__":
    main()
