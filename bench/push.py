"""Section 9: Web Push of one capsule opening to 1,000 devices (`push_devices`).

A family of 1,001 (one creator, 1,000 recipients), each recipient with one
browser registered on a push service on loopback (tests/push_service.py, in
its accepting mode: it answers 201 and notes when, without decrypting, so its
own CPU stays small). One LOCKED capsule for all of them is due; the scheduler
opens it in process and the push workers (MIFAMILIAS_PUSH_WORKERS of them)
send every push, encrypted (aes128gcm) and signed (VAPID). Measured: the time
from the start of the unlock pass to the last push accepted, and pushes per
second from the first accepted to the last. The baseline of the same run: the
same number of POSTs of a payload of the same size, unencrypted, by one httpx
client at the same concurrency (what the transport alone allows)."""

from __future__ import annotations

import asyncio
import base64
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.common import Row, Sizes, Stats, bench_settings, in_process_app
from store import items
from tests.factories import capsule_rows, family_rows
from tests.push_service import PushService, running_push_service

SECTION = "10. Web Push"
WORKERS = (4, 16)


def _point() -> str:
    raw = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def device_rows(service: PushService, people: list[str]) -> list[dict[str, Any]]:
    now = items.iso(datetime.now(UTC))
    rows: list[dict[str, Any]] = []
    for person in people:
        device = items.PushDevice(
            user_id=person,
            id=uuid.uuid4().hex[:24],
            platform="WEB",
            created_at=now,
            updated_at=now,
            endpoint=f"{service.origin}/push/{person}",
            p256dh=_point(),
            auth=base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode(),
        )
        rows += [device.to_item(), items.PushDeviceCount(person, 1).to_item()]
    return rows


async def one_round(service: PushService, data_dir: Path, workers: int, devices: int) -> tuple[float, float]:
    """(unlock -> last push accepted, pushes per second)."""
    settings = bench_settings(
        data_dir, push_allowed_origins=(service.origin,), push_workers=workers, push_recovery_seconds=3600
    )
    async with in_process_app(settings) as api:
        table = api.services.table
        family_id = f"fam{uuid.uuid4().hex[:8]}"
        people = [f"p{n}{family_id}" for n in range(devices)]
        creator = f"c{family_id}"
        _, capsule = capsule_rows(
            family_id, creator, people, datetime.now(UTC) - timedelta(seconds=1), settings.unlock_shards
        )
        rows = family_rows(family_id, creator, people) + capsule + device_rows(service, people)
        for start in range(0, len(rows), 1000):
            await table.batch_write(rows[start : start + 1000])
        with service.lock:
            service.accepted_at.clear()
        started = time.monotonic()
        result = await api.services.scheduler.run_once()
        assert result.unlocked == 1, result
        deadline = time.monotonic() + 300
        while len(service.accepted_at) < devices:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(service.accepted_at)} of {devices} pushes arrived")
            await asyncio.sleep(0.05)
        with service.lock:
            first, last = min(service.accepted_at), max(service.accepted_at)
        return last - started, devices / max(last - first, 1e-9)


async def floor(service: PushService, concurrency: int, devices: int) -> float:
    """Pushes per second of the transport alone: the same POSTs, unencrypted."""
    body = os.urandom(230)
    names = iter(range(devices))
    async with httpx.AsyncClient() as client:

        async def worker() -> None:
            for n in names:
                await client.post(f"{service.origin}/push/floor{n}", content=body, headers={"TTL": "60"})

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return devices / (time.monotonic() - started)


def _row(measure: str, stats: Stats, shape: str) -> Row:
    spread = f"{shape.format(stats.low)} – {shape.format(stats.high)} (n={stats.n})"
    return Row(SECTION, measure, shape.format(stats.median), spread)


async def run(sizes: Sizes, tmp: Path) -> list[Row]:
    devices = sizes.push_devices
    rows: list[Row] = []
    with running_push_service(verify=False) as service:
        for workers in WORKERS:
            latency, rate, base = [], [], []
            for n in range(sizes.push_rounds):
                took, per_second = await one_round(service, tmp / f"push-{workers}-{n}", workers, devices)
                latency.append(took)
                rate.append(per_second)
                base.append(await floor(service, workers, devices))
            lat = Stats.of([s * 1000 for s in latency])
            ratio = Stats.of([a / b for a, b in zip(rate, base, strict=True)])
            rows += [
                _row(f"unlock → last push, {devices} devices, {workers} workers", lat, "{:,.0f} ms"),
                _row(f"pushes/s, {workers} workers", Stats.of(rate), "{:,.0f}"),
                _row(f"transport floor pushes/s, {workers} at once", Stats.of(base), "{:,.0f}"),
                _row(f"ours / floor, {workers} workers", ratio, "{:.2f}"),
            ]
    return rows
