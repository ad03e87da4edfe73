"""Section 7: what metrics and tracing cost. `me` and `feed` under wrk (as in
section 2) on four servers of the same data, each pinned to the server core:
metrics off or on (`MIFAMILIAS_METRICS`), tracing off or on (spans batched to
an OTLP/HTTP sink on the load core that accepts and drops them, so encoding and
export are paid as in production). Interleaved rounds; ratios paired per round
against metrics off, tracing off.

Besides requests per second, each round reads the server's CPU time
(/proc/<pid>/stat, every thread, the span exporter's included) and divides it
by the requests wrk completed: CPU per request moves less than requests per
second when other programs share the core. The capacity ratio is the
baseline's CPU per request over the way's: what one core would serve.

Last, the same four ways in this process (the app over httpx's ASGI transport,
spans to the same sink), one request after another: the process's CPU time per
request, the minimum over rounds, the figure a busy machine disturbs least.

    python -m bench observability [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    ME_QUERY,
    ROOT,
    VIEWER,
    Row,
    Sizes,
    Stats,
    ratio_stats,
    server_env,
    token,
    verdict,
)
from bench.http import lua_script, parse_wrk, post, wrk, wrk_output
from bench.processes import LOAD_CPU, Server, cpu_seconds, graphql_server, pinned
from tests.typical_calls import FEED_QUERY

SECTION = "7. Observability cost (uvicorn, 1 core; wrk on the other)"
# (metrics, tracing)
WAYS = {
    "metrics off, tracing off": (False, False),
    "metrics on, tracing off": (True, False),
    "metrics off, tracing on": (False, True),
    "metrics on, tracing on": (True, True),
}
BASELINE = "metrics off, tracing off"
METRICS_TARGET = 0.95  # metrics may cost at most 5% of throughput
# A traced feed answers slowly under 16 connections: wait for it rather than count it failed.
TIMEOUT = 30.0


def measured(server: Server, url: str, script: Path, sizes: Sizes) -> tuple[float, float]:
    """(requests per second, server CPU milliseconds per request) for one wrk run."""
    assert server.process is not None
    before = cpu_seconds(server.process.pid)
    output = wrk_output(url, script, sizes.http_seconds, sizes.http_connections, TIMEOUT)
    spent = cpu_seconds(server.process.pid) - before
    rps, _, _ = parse_wrk(output)
    found = re.search(r"^\s*(\d+) requests in", output, re.M)
    requests = int(found.group(1)) if found else 0
    return rps, (spent * 1000 / requests if requests else float("nan"))


@contextlib.contextmanager
def otlp_sink(log_dir: Path) -> Iterator[str]:
    """`python -m bench.otlp_sink` on the load core; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (log_dir / "otlp-sink.log").open("wb")
    process = subprocess.Popen(
        pinned(LOAD_CPU, [sys.executable, "-m", "bench.otlp_sink", str(port)]),
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the OTLP sink did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def run(data_dir: Path, family_id: str, sizes: Sizes, log_dir: Path) -> list[Row]:
    authorization = f"Bearer {token(VIEWER)}"
    bodies = {
        "me": {"query": ME_QUERY, "variables": {}},
        "feed": {"query": FEED_QUERY, "variables": {"id": family_id}},
    }
    scripts = {
        name: lua_script(log_dir / f"obs-{name}.lua", body, authorization) for name, body in bodies.items()
    }
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(otlp_sink(log_dir))
        servers: dict[str, Server] = {}
        for way, (metrics, tracing) in WAYS.items():
            # One viewer sends feeds as fast as it can: what is measured is the
            # instruments' cost, so the cost budget (which would throttle it) is off.
            extra = {
                "MIFAMILIAS_METRICS": "true" if metrics else "false",
                "MIFAMILIAS_OTEL": "false",
                "MIFAMILIAS_COST_BUDGET": "0",
            }
            if tracing:
                extra |= {"MIFAMILIAS_OTEL": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": sink}
            # MIFAMILIAS_OTEL=false wins over an OTEL_EXPORTER_OTLP_ENDPOINT in the environment.
            servers[way] = stack.enter_context(graphql_server(server_env(data_dir, **extra), log_dir))
        urls = {way: f"{server.url}/graphql" for way, server in servers.items()}
        for query, body in bodies.items():  # every way answers the same
            # Each server's own cost bucket says what is left in `extensions`: the data must agree.
            answers = [post(url, body, authorization).get("data") for url in urls.values()]
            if any(answer != answers[0] for answer in answers):
                raise RuntimeError(f"{query}: the servers answer differently")
        keys = [(way, query) for query in bodies for way in WAYS]
        for way, query in keys:  # warm-up
            wrk(urls[way], scripts[query], min(2.0, sizes.http_seconds), sizes.http_connections, TIMEOUT)
        results: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in keys}
        for r in range(sizes.http_rounds):
            shift = r % len(keys)
            for way, query in keys[shift:] + keys[:shift]:
                results[way, query].append(measured(servers[way], urls[way], scripts[query], sizes))
        metrics_page = servers["metrics on, tracing off"].url + "/metrics"
        import urllib.request

        with urllib.request.urlopen(metrics_page, timeout=10) as response:
            series = sum(1 for line in response.read().decode().splitlines() if line and line[0] != "#")
        for server in servers.values():
            server.stop()  # the core is the in-process part's now
        cpu = asyncio.run(in_process(data_dir, bodies, sink, sizes))
    return rows_of(results, sizes, series) + cpu_rows(cpu)


# Requests per round in process, and rounds per round of wrk: short rounds, many of
# them, so the minimum finds moments the machine left the process alone.
IN_PROCESS = {"me": 100, "feed": 4}
IN_PROCESS_ROUNDS = {"me": 8, "feed": 4}


async def in_process(
    data_dir: Path, bodies: dict[str, dict[str, Any]], sink: str, sizes: Sizes
) -> dict[tuple[str, str], list[float]]:
    """CPU milliseconds per request, per round, for each way and query."""
    from bench.common import bench_settings, in_process_app

    authorization = {"Authorization": f"Bearer {token(VIEWER)}"}
    results: dict[tuple[str, str], list[float]] = {}
    saved = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink  # read by the exporter the traced apps make
    try:
        async with contextlib.AsyncExitStack() as stack:
            apps = {
                way: await stack.enter_async_context(
                    # As for the servers above: the instruments' cost, without the budget.
                    in_process_app(bench_settings(data_dir, metrics=metrics, otel=tracing, cost_budget=0))
                )
                for way, (metrics, tracing) in WAYS.items()
            }
            for query, body in bodies.items():
                keys = [(way, query) for way in WAYS]
                for way, _ in keys:  # warm-up
                    for _ in range(max(2, IN_PROCESS[query] // 10)):
                        await apps[way].client.post("/graphql", json=body, headers=authorization)
                for r in range(sizes.http_rounds * IN_PROCESS_ROUNDS[query]):
                    shift = r % len(keys)
                    for way, _ in keys[shift:] + keys[:shift]:
                        client = apps[way].client
                        started = time.process_time()
                        for _ in range(IN_PROCESS[query]):
                            response = await client.post("/graphql", json=body, headers=authorization)
                            if response.status_code != 200 or "errors" in response.json():
                                raise RuntimeError(f"{way} {query}: {response.text[:300]}")
                        spent = time.process_time() - started
                        results.setdefault((way, query), []).append(spent * 1000 / IN_PROCESS[query])
    finally:
        if saved is None:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        else:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = saved
    return results


def cpu_rows(results: dict[tuple[str, str], list[float]]) -> list[Row]:
    rows = []
    for query in ("me", "feed"):
        for way in WAYS:
            samples = results[way, query]
            rows.append(
                Row(
                    SECTION,
                    f"`{query}` {way}: CPU per request in process (min of {len(samples)} rounds)",
                    f"{min(samples):.3f} ms",
                    f"median {statistics.median(samples):.3f} ms",
                )
            )
        for way in list(WAYS)[1:]:
            ratio = min(results[BASELINE, query]) / min(results[way, query])
            metrics_only = way == "metrics on, tracing off"
            rows.append(
                Row(
                    SECTION,
                    f"`{query}` {way} / {BASELINE} (capacity in process, from the minimum CPU per request)",
                    f"{ratio:.3f}",
                    f"{(1 / ratio - 1) * 100:+.1f}% CPU per request",
                    f"{ratio:.3f}",
                    f"≥ {METRICS_TARGET}" if metrics_only else "",
                    verdict(ratio >= METRICS_TARGET) if metrics_only else "",
                )
            )
    return rows


def rows_of(
    results: dict[tuple[str, str], list[tuple[float, float]]], sizes: Sizes, series: int
) -> list[Row]:
    rows = []
    for query in ("me", "feed"):
        for way in WAYS:
            rps = Stats.of([x[0] for x in results[way, query]])
            # A round where no request finished has no CPU per request.
            cpu = Stats.of([x[1] for x in results[way, query] if not math.isnan(x[1])])
            m, s = rps.fmt(" req/s", 0)
            rows.append(Row(SECTION, f"`{query}` {way}: throughput ({sizes.http_connections} conns)", m, s))
            m, s = cpu.fmt(" ms", 2)
            rows.append(Row(SECTION, f"`{query}` {way}: server CPU per request", m, s))
        for way in list(WAYS)[1:]:
            metrics_only = way == "metrics on, tracing off"
            target = f"≥ {METRICS_TARGET}" if metrics_only else ""
            by_rps = ratio_stats(
                [x[0] for x in results[way, query]], [x[0] for x in results[BASELINE, query]]
            )
            # Capacity: the baseline's CPU per request over this way's, paired per round.
            by_cpu = ratio_stats(
                [x[1] for x in results[BASELINE, query]], [x[1] for x in results[way, query]]
            )
            for label, ratio in (("req/s", by_rps), ("capacity, from CPU per request", by_cpu)):
                m, s = ratio.fmt("", 3)
                met = verdict(ratio.median >= METRICS_TARGET) if metrics_only else ""
                rows.append(Row(SECTION, f"`{query}` {way} / {BASELINE} ({label})", m, s, m, target, met))
    rows.append(Row(SECTION, "series on /metrics after the run (metrics on)", str(series)))
    return rows
