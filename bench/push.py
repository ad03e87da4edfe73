"""Section 10: Web Push of one capsule opening to 1,000 devices (`push_devices`).

A family of 1,001 (one creator, 1,000 recipients), each recipient with one
browser registered on a push service on loopback (bench/push_sink.py, in a
process of its own: it answers 201 and notes when, without decrypting, so its
own CPU stays small). One LOCKED capsule for all of them is due; the scheduler
opens it in process and the push workers (the default settings) send every
push, encrypted (aes128gcm) and signed (VAPID). Measured: the time from the
start of the unlock pass to the last push accepted, pushes per second from the
first accepted to the last, and the store calls of the round (CountingTable)
per push. The baseline of the same run: the same number of POSTs of a payload
of the same size, unencrypted, through the pool our sends use (`webpush.Pool`,
aiohttp since 2026-12-04, httpx before) at the concurrency our sends to one
push service have (what the transport alone allows). The same rounds again
against a push service that answers each push 20 ms after it came, as one
across a network does: there the transport, not our CPU, sets the pace."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.common import ROOT, Row, Sizes, Stats, bench_settings, in_process_app, verdict
from resolvers.adapters.webpush import Pool, tls_context
from resolvers.core.config import Settings
from store import items
from tests.counting import CountingTable
from tests.factories import capsule_rows, family_rows

SECTION = "10. Web Push"
TOOK_TARGET_S = 1.5
RATIO_TARGET = 0.8
# A push service across a network answers tens of milliseconds after a push
# (a round trip to it, and its own write); this is the short end of that. The
# rows of record answer at once, so they measure our CPU against the client's
# alone; these show what the same sends reach when the transport takes time.
NETWORK_DELAY_MS = 20


def _point() -> str:
    raw = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@contextlib.contextmanager
def push_sink(delay_ms: int = 0) -> Iterator[str]:
    """The push service (bench/push_sink.py) in a process of its own, answering
    each push `delay_ms` after it came; its origin."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.push_sink", str(delay_ms)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        yield f"http://127.0.0.1:{int(process.stdout.readline())}"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def stats(origin: str, count: int = 0) -> dict[str, float]:
    """What the push service took, once it has taken `count`."""
    # No TLS here, and none of the CPU that loading its certificates costs.
    async with httpx.AsyncClient(timeout=300, verify=False) as client:
        found: dict[str, float] = (await client.get(f"{origin}/stats?count={count}")).json()
        return found


async def reset(origin: str) -> None:
    async with httpx.AsyncClient(verify=False) as client:
        await client.post(f"{origin}/reset")


def device_rows(origin: str, people: list[str]) -> list[dict[str, Any]]:
    now = items.iso(datetime.now(UTC))
    rows: list[dict[str, Any]] = []
    for person in people:
        device = items.PushDevice(
            user_id=person,
            id=uuid.uuid4().hex[:24],
            platform="WEB",
            created_at=now,
            updated_at=now,
            endpoint=f"{origin}/push/{person}",
            p256dh=_point(),
            auth=base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode(),
        )
        rows += [device.to_item(), items.PushDeviceCount(person, 1).to_item()]
    return rows


@dataclass(frozen=True)
class Round:
    took: float  # unlock -> last push accepted, seconds
    rate: float  # pushes per second, first accepted to last
    calls: int  # store calls of the opening and its pushes
    kinds: str


async def one_round(origin: str, data_dir: Path, devices: int) -> Round:
    settings = bench_settings(data_dir, push_allowed_origins=(origin,), push_recovery_seconds=3600)
    counted: list[CountingTable] = []

    def counting(table: Any) -> CountingTable:
        counted.append(CountingTable(table))
        return counted[-1]

    await reset(origin)
    async with in_process_app(settings, wrap_table=counting) as api:
        table = api.services.table
        family_id = f"fam{uuid.uuid4().hex[:8]}"
        people = [f"p{n}{family_id}" for n in range(devices)]
        creator = f"c{family_id}"
        _, capsule = capsule_rows(
            family_id, creator, people, datetime.now(UTC) - timedelta(seconds=1), settings.unlock_shards
        )
        rows = family_rows(family_id, creator, people) + capsule + device_rows(origin, people)
        for start in range(0, len(rows), 1000):
            await table.batch_write(rows[start : start + 1000])
        [calls] = counted
        calls.reset()
        started = time.monotonic()
        result = await api.services.scheduler.run_once()
        assert result.unlocked == 1, result
        took = await stats(origin, devices)
        first, last = took["first"], took["last"]
        # The settling writes of the last pushes land just after their POSTs.
        await api.services.pusher.queue.join()
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(calls.calls.items()))
        return Round(last - started, devices / max(last - first, 1e-9), calls.total_calls, kinds)


async def floor(origin: str, concurrency: int, devices: int) -> float:
    """Pushes per second of the transport alone: the same POSTs, unencrypted,
    through the pool our sends to one push service use (`webpush.Pool`, its
    connections kept alive), as many at once."""
    body = os.urandom(230)
    names = iter(range(devices))
    pool = Pool(concurrency, timeout=10.0, tls=tls_context())
    try:

        async def worker() -> None:
            for n in names:
                await pool.post(f"{origin}/push/floor{n}", content=body, headers={"TTL": "60"})

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return devices / (time.monotonic() - started)
    finally:
        await pool.close()


def _row(measure: str, stats: Stats, shape: str, target: str = "", met: bool | None = None) -> Row:
    spread = f"{shape.format(stats.low)} – {shape.format(stats.high)} (n={stats.n})"
    return Row(SECTION, measure, shape.format(stats.median), spread, target=target, met=verdict(met))


async def rounds_against(
    sizes: Sizes, tmp: Path, delay_ms: int, concurrency: int
) -> tuple[list[Round], list[float]]:
    """Our rounds and the transport's alone, alternating, against one push
    service answering `delay_ms` after each push."""
    devices = sizes.push_devices
    rounds: list[Round] = []
    base: list[float] = []
    with push_sink(delay_ms) as origin:
        # A first opening warms what a running server has warm (imports, the
        # VAPID signature's code).
        await one_round(origin, tmp / f"push-warm-{delay_ms}", min(devices, 50))
        for n in range(sizes.push_rounds):
            rounds.append(await one_round(origin, tmp / f"push-{delay_ms}-{n}", devices))
            base.append(await floor(origin, concurrency, devices))
    return rounds, base


async def run(sizes: Sizes, tmp: Path) -> list[Row]:
    devices = sizes.push_devices
    concurrency = Settings.model_fields["push_connections_per_origin"].default
    rounds, base = await rounds_against(sizes, tmp, 0, concurrency)
    took = Stats.of([r.took * 1000 for r in rounds])
    rate = Stats.of([r.rate for r in rounds])
    ratio = Stats.of([r.rate / b for r, b in zip(rounds, base, strict=True)])
    calls = Stats.of([r.calls / devices for r in rounds])
    far, far_base = await rounds_against(sizes, tmp, NETWORK_DELAY_MS, concurrency)
    far_took = Stats.of([r.took * 1000 for r in far])
    far_ratio = Stats.of([r.rate / b for r, b in zip(far, far_base, strict=True)])
    answering = f"push service answering in {NETWORK_DELAY_MS} ms"
    return [
        _row(
            f"unlock → last push, {devices:,} devices",
            took,
            "{:,.0f} ms",
            target=f"≤ {TOOK_TARGET_S} s",
            met=took.median <= TOOK_TARGET_S * 1000,
        ),
        _row("pushes/s (first accepted to last)", rate, "{:,.0f}"),
        _row(f"transport alone pushes/s, {concurrency} at once", Stats.of(base), "{:,.0f}"),
        _row(
            "push: ours / transport alone",
            ratio,
            "{:.2f}",
            target=f"≥ {RATIO_TARGET}",
            met=ratio.median >= RATIO_TARGET,
        ),
        Row(
            SECTION,
            "store calls per push (the opening's own included)",
            f"{calls.median:.2f}",
            f"{rounds[len(rounds) // 2].kinds} (a round's calls; n={calls.n})",
            target="≤ 2",
            met=verdict(calls.median <= 2),
        ),
        _row(f"unlock → last push, {devices:,} devices, {answering}", far_took, "{:,.0f} ms"),
        _row(
            f"pushes/s (first accepted to last), {answering}",
            Stats.of([r.rate for r in far]),
            "{:,.0f}",
        ),
        _row(f"transport alone pushes/s, {answering}", Stats.of(far_base), "{:,.0f}"),
        _row(f"push: ours / transport alone, {answering}", far_ratio, "{:.2f}"),
    ]
