"""Section 5: store calls and sequential round trips of one typical call of
every query and mutation, counted through CountingTable with a small simulated
latency (so calls of one resolver level overlap), on the embedded store,
in-process over httpx's ASGI transport. The calls and their world live in
tests/typical_calls.py, which tests/api/test_round_trips.py asserts on both
engines."""

from __future__ import annotations

from pathlib import Path

from bench.common import Row, Sizes, bench_settings, in_process_app
from tests.counting import CountingTable
from tests.typical_calls import VIEWERS, build_world, label, only_the_request, operations, schema_operations

SECTION = "5. Round trips (store calls / sequential round trips)"


async def run(sizes: Sizes, tmp: Path) -> list[Row]:
    from schema import schema
    from tests.clock import FakeClock

    clock = FakeClock()
    rows = []
    async with in_process_app(
        bench_settings(tmp / "round-trips"), clock=clock, wrap_table=CountingTable
    ) as api:
        table: CountingTable = api.services.table
        world = await build_world(api, clock)
        ops = operations(api, world)
        for user in VIEWERS:
            await api.post("{ me { id } }", as_=user)  # the first-request profile check is cached per process
        covered = set()
        for op in ops:
            variables = await op.setup() if op.setup else {}
            async with only_the_request(api):
                table.reset()
                table.latency = sizes.round_trip_latency
                try:
                    body = await api.post(op.document, variables, as_=op.viewer)
                finally:
                    table.latency = 0
            calls, rounds = table.total_calls, table.round_trips
            detail = ", ".join(f"{k} {n}" for k, n in sorted(table.calls.items()))
            kind = "mutation" if op.document.lstrip().startswith("mutation") else "query"
            if body.get("errors"):
                code = body["errors"][0].get("extensions", {}).get("code", "?")
                rows.append(
                    Row(
                        SECTION,
                        label(op),
                        f"{calls} / {rounds}",
                        f"answered {code}: {body['errors'][0]['message'][:80]}",
                    )
                )
            else:
                covered.add((kind, op.field))
                rows.append(Row(SECTION, label(op), f"{calls} / {rounds}", detail))
    for kind, name in sorted(schema_operations(schema) - covered):
        rows.append(
            Row(SECTION, f"{kind} `{name}`", "not measured", "no successful typical call in the bench")
        )
    return rows
