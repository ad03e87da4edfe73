"""Section 7: what metrics and tracing cost. `me` and `feed` under wrk (as in
section 2) on four servers of the same data, each pinned to the server core:
metrics off or on (`MIFAMILIAS_METRICS`), tracing off or on (spans batched to
an OTLP/HTTP sink on the load core that accepts and drops them, so encoding and
export are paid as in production). Interleaved rounds; ratios paired per round
against metrics off, tracing off.

    python -m bench observability [--quick]
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import (
    FEED_QUERY,
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
from bench.http import lua_script, post, wrk
from bench.processes import LOAD_CPU, Server, graphql_server, pinned

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
            extra = {"MIFAMILIAS_METRICS": "true" if metrics else "false", "MIFAMILIAS_OTEL": "false"}
            if tracing:
                extra |= {"MIFAMILIAS_OTEL": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": sink}
            # MIFAMILIAS_OTEL=false wins over an OTEL_EXPORTER_OTLP_ENDPOINT in the environment.
            servers[way] = stack.enter_context(graphql_server(server_env(data_dir, **extra), log_dir))
        urls = {way: f"{server.url}/graphql" for way, server in servers.items()}
        for query, body in bodies.items():  # every way answers the same
            answers = [post(url, body, authorization) for url in urls.values()]
            if any(answer != answers[0] for answer in answers):
                raise RuntimeError(f"{query}: the servers answer differently")
        keys = [(way, query) for query in bodies for way in WAYS]
        for way, query in keys:  # warm-up
            wrk(urls[way], scripts[query], min(2.0, sizes.http_seconds), sizes.http_connections, TIMEOUT)
        results: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        for r in range(sizes.http_rounds):
            shift = r % len(keys)
            for way, query in keys[shift:] + keys[:shift]:
                rps, _, _ = wrk(
                    urls[way], scripts[query], sizes.http_seconds, sizes.http_connections, TIMEOUT
                )
                results[way, query].append(rps)
        metrics_page = servers["metrics on, tracing off"].url + "/metrics"
        import urllib.request

        with urllib.request.urlopen(metrics_page, timeout=10) as response:
            series = sum(1 for line in response.read().decode().splitlines() if line and line[0] != "#")
    return rows_of(results, sizes, series)


def rows_of(results: dict[tuple[str, str], list[float]], sizes: Sizes, series: int) -> list[Row]:
    rows = []
    for query in ("me", "feed"):
        for way in WAYS:
            m, s = Stats.of(results[way, query]).fmt(" req/s", 0)
            rows.append(Row(SECTION, f"`{query}` {way}: throughput ({sizes.http_connections} conns)", m, s))
        for way in list(WAYS)[1:]:
            ratio = ratio_stats(results[way, query], results[BASELINE, query])
            m, s = ratio.fmt("", 3)
            metrics_only = way == "metrics on, tracing off"
            rows.append(
                Row(
                    SECTION,
                    f"`{query}` {way} / {BASELINE} (req/s)",
                    m,
                    s,
                    m,
                    f"≥ {METRICS_TARGET}" if metrics_only else "",
                    verdict(ratio.median >= METRICS_TARGET) if metrics_only else "",
                )
            )
    rows.append(Row(SECTION, "series on /metrics after the run (metrics on)", str(series)))
    return rows
