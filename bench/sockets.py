"""Part of section 3: server memory per idle subscription for each of uvicorn's
WebSocket implementations, per-message deflate off and on, for our server and
for the bare Starlette endpoint under the same uvicorn options (the difference
is what our side of a connection costs: Strawberry's protocol handler, its
tasks, the operation and its generators).

    python -m bench.sockets [CLIENTS]   # this part alone, printed
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

from bench.common import Row, Sizes, server_env, token, verdict
from bench.processes import bench_server

SECTION = "3. Subscription fan-out"
IMPLEMENTATIONS = Sizes().ws_implementations
Memory = dict[tuple[str, str, bool], float]


def measure(
    tokens: list[str],
    warm: list[str],
    data_dir: Path,
    processes: int,
    log_dir: Path,
    implementations: tuple[str, ...] = IMPLEMENTATIONS,
) -> Memory:
    """KB of server RSS per idle subscription, by (app, implementation, deflate)."""
    from bench.fanout import idle_memory

    memory: Memory = {}
    for implementation in implementations:
        for deflate in (False, True):
            env = server_env(
                data_dir,
                MIFAMILIAS_WS_IMPLEMENTATION=implementation,
                MIFAMILIAS_WS_DEFLATE="true" if deflate else "false",
            )
            for name, args, path in (("graphql", [], "/graphql"), ("bare", ["--plain"], "/ws")):
                server = bench_server(f"sockets-{name}-{implementation}-{int(deflate)}", args, env, log_dir)
                server.ws_path = path  # type: ignore[attr-defined]
                with server:
                    memory[name, implementation, deflate], clients = idle_memory(
                        server, tokens, warm, processes
                    )
                    clients.stop()
    return memory


def chosen(deflate: bool) -> str:
    """The implementation the server runs by default with deflate as given."""
    from resolvers.core.config import Settings

    return Settings(ws_deflate=deflate).websocket_implementation()


def rows_of(n: int, memory: Memory) -> list[Row]:
    rows = []
    for implementation in dict.fromkeys(implementation for _, implementation, _ in memory):
        for deflate, target in ((False, 45), (True, 90)):
            ours, bare = memory["graphql", implementation, deflate], memory["bare", implementation, deflate]
            pick = implementation == chosen(deflate)
            rows.append(
                Row(
                    SECTION,
                    f"server RSS per idle subscription, `{implementation}`, "
                    f"deflate {'on' if deflate else 'off'} ({n} clients){' (the default)' if pick else ''}",
                    f"{ours:.1f} KB",
                    f"bare endpoint: {bare:.1f} KB; ours on top: {ours - bare:.1f} KB",
                    "",
                    f"≤ {target} KB",
                    verdict(ours <= target),
                )
            )
    return rows


def run(sizes: Sizes, log_dir: Path) -> list[Row]:
    """This part within section 3 (whose `fanout.run` has seeded the people)."""

    n = sizes.fanout_clients
    people = [f"sub{k:05d}" for k in range(n)]
    tokens, warm = [token(p) for p in people], [token(f"warm{k}") for k in range(min(5, n))]
    memory = measure(
        tokens, warm, log_dir / "fanout", sizes.fanout_processes, log_dir, sizes.ws_implementations
    )
    return rows_of(n, memory)


def main() -> None:
    from bench.fanout import seed_people

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    people = [f"sub{k:05d}" for k in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "sockets"
        data_dir.mkdir()
        asyncio.run(seed_people(data_dir, people))
        memory = measure(
            [token(p) for p in people],
            [token(f"warm{k}") for k in range(5)],
            data_dir,
            Sizes().fanout_processes,
            Path(tmp),
        )
    for row in rows_of(n, memory):
        print(" | ".join(str(cell) for cell in dataclasses.astuple(row)), flush=True)


if __name__ == "__main__":
    main()
