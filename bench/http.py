"""Section 2: HTTP throughput and latency under wrk. Our server (`python app.py
serve`) and the plain Starlette baseline, each pinned to core 0, the load from
wrk pinned to core 1, measured in interleaved rounds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import (
    ME_QUERY,
    VIEWER,
    Row,
    Sizes,
    Stats,
    ratio_stats,
    server_env,
    token,
    verdict,
)
from bench.processes import LOAD_CPU, bench_server, graphql_server, pinned
from tests.typical_calls import FEED_QUERY

SECTION = "2. HTTP (uvicorn, 1 core; wrk on the other)"
TARGETS = {"me": 0.5, "feed": 0.2}
# Seconds before wrk counts a request as failed: its default (2 s) fails the run
# on a loaded machine, where a feed request can take that long; a timeout is not
# what this section measures.
WRK_TIMEOUT = 10.0


def lua_script(path: Path, body: dict[str, Any], authorization: str) -> Path:
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [==[{json.dumps(body)}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "{authorization}"\n'
    )
    return path


UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_wrk(output: str) -> tuple[float, float, float]:
    """(requests per second, p50 ms, p99 ms)."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"wrk saw errors:\n{output}")

    def percentile(p: str) -> float:
        found = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", output, re.M)
        assert found, output
        return float(found.group(1)) * UNITS[found.group(2)]

    return rps, percentile("50"), percentile("99")


def wrk(
    url: str, script: Path, seconds: float, connections: int, timeout: float | None = None
) -> tuple[float, float, float]:
    """`timeout`: seconds before wrk counts a request as failed (its default is 2)."""
    return parse_wrk(wrk_output(url, script, seconds, connections, timeout))


def wrk_output(url: str, script: Path, seconds: float, connections: int, timeout: float | None = None) -> str:
    """wrk's report, as it prints it."""
    binary = shutil.which("wrk")
    if binary is None:
        raise RuntimeError("wrk is not installed (./dev bench installs it)")
    argv = [
        binary,
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        *([f"--timeout={timeout:g}s"] if timeout else []),
        "-s",
        str(script),
        url,
    ]
    done = subprocess.run(pinned(LOAD_CPU, argv), capture_output=True, text=True, check=True)
    return done.stdout


def post(url: str, body: dict[str, Any], authorization: str) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": authorization},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def run(data_dir: Path, family_id: str, sizes: Sizes, log_dir: Path) -> list[Row]:
    env = server_env(data_dir)
    authorization = f"Bearer {token(VIEWER)}"
    bodies = {
        "me": {"query": ME_QUERY, "variables": {}},
        "feed": {"query": FEED_QUERY, "variables": {"id": family_id}},
    }
    scripts = {
        name: lua_script(log_dir / f"{name}.lua", body, authorization) for name, body in bodies.items()
    }
    with graphql_server(env, log_dir) as graphql, bench_server("plain", ["--plain"], env, log_dir) as plain:
        urls = {
            ("graphql", "me"): f"{graphql.url}/graphql",
            ("plain", "me"): f"{plain.url}/me",
            ("graphql", "feed"): f"{graphql.url}/graphql",
            ("plain", "feed"): f"{plain.url}/feed",
        }
        for query, body in bodies.items():  # the same body from both
            ours, theirs = (
                post(urls["graphql", query], body, authorization),
                post(urls["plain", query], body, authorization),
            )
            # Our answer carries its cost (`extensions.cost`); the plain app has none.
            if {k: v for k, v in ours.items() if k != "extensions"} != theirs:
                raise RuntimeError(f"{query}: GraphQL and plain answer differently:\n{ours}\n{theirs}")
        for key, url in urls.items():  # warm-up
            wrk(url, scripts[key[1]], min(2.0, sizes.http_seconds), sizes.http_connections, WRK_TIMEOUT)
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {key: [] for key in urls}
        order = list(urls)
        for r in range(sizes.http_rounds):
            shift = r % len(order)
            for key in order[shift:] + order[:shift]:
                results[key].append(
                    wrk(urls[key], scripts[key[1]], sizes.http_seconds, sizes.http_connections, WRK_TIMEOUT)
                )
    return rows_of(results, sizes)


def rows_of(results: dict[tuple[str, str], list[tuple[float, float, float]]], sizes: Sizes) -> list[Row]:
    rows = []
    for query, target in TARGETS.items():
        for server in ("graphql", "plain"):
            samples = results[server, query]
            label = "GraphQL" if server == "graphql" else "plain Starlette"
            m, s = Stats.of([x[0] for x in samples]).fmt(" req/s", 0)
            rows.append(Row(SECTION, f"`{query}` {label}: throughput ({sizes.http_connections} conns)", m, s))
            p50, p99 = Stats.of([x[1] for x in samples]), Stats.of([x[2] for x in samples])
            rows.append(
                Row(
                    SECTION,
                    f"`{query}` {label}: p50 / p99 latency",
                    f"{p50.median:.1f} / {p99.median:.1f} ms",
                    f"p99 {p99.low:.1f} – {p99.high:.1f} ms",
                )
            )
        ratio = ratio_stats(
            [x[0] for x in results["graphql", query]], [x[0] for x in results["plain", query]]
        )
        m, s = ratio.fmt("", 2)
        rows.append(
            Row(
                SECTION,
                f"`{query}` GraphQL / plain (req/s)",
                m,
                s,
                m,
                f"≥ {target}",
                verdict(ratio.median >= target),
            )
        )
    return rows
