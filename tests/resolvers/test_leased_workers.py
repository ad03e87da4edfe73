"""A leased worker stops when told to, wherever the stop lands.

Two windows hung `stop()` (and a CI run): a worker's build has ended and its
`finally` waits for the heartbeat task, and a cancel of the worker arriving
then was swallowed (`suppress(CancelledError)` around that wait); or the
build's own cleanup raises on the cancel (a zip closed while a thread still
writes to it), replacing the CancelledError. Either way the worker went back
to its queue. Each test makes the stop land in one window every time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from resolvers.core.config import Settings
from resolvers.domain import exports
from resolvers.processes.exports import ExportBuilder
from store.blobs import LocalBlobStore
from store.enums import ExportStatus
from store.items import DataExport
from store.sqlite import SqliteTable


def now() -> datetime:
    return datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture
async def builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ExportBuilder]:
    """An export builder whose claim always wins one pending export and whose
    release writes nothing; the tests give it the build they need."""

    async def claim(*_: Any) -> dict[str, Any]:
        record = DataExport(
            user_id="ana",
            id="e1",
            status=ExportStatus.PENDING,
            requested_at="2026-11-30T00:00:00Z",
            expires_at=0,
        )
        return record.to_item()

    monkeypatch.setattr(exports, "claim", claim)
    monkeypatch.setattr(exports, "release", lambda *_: asyncio.sleep(0))
    table = SqliteTable(tmp_path / "table.sqlite3")
    try:
        yield ExportBuilder(
            table=table,
            blobs=LocalBlobStore(tmp_path / "blobs", "http://testserver", b"k" * 32),
            settings=Settings(data_dir=tmp_path / "data", auth_secret="s" * 32),
            clock=now,
        )
    finally:
        await table.close()


async def stopped(builder: ExportBuilder) -> bool:
    """Whether `stop()` returns. A hang guard, not a speed claim: before the fixes
    it never did. (`wait`, not `wait_for`: the latter's own cancel would end the worker.)"""
    stopping = asyncio.create_task(builder.stop())
    await asyncio.wait({stopping}, timeout=30)
    return stopping.done()


async def test_stop_lands_while_the_heartbeat_winds_down(
    builder: ExportBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    beating = asyncio.Event()
    winding_down = asyncio.Event()
    never = asyncio.Event()

    async def heartbeat(export: DataExport) -> None:
        beating.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            winding_down.set()
            await never.wait()  # a second cancel (the worker's own) ends this
            raise

    async def build(*_: Any) -> bool:
        await beating.wait()
        return True

    monkeypatch.setattr(builder, "_renew", heartbeat)
    monkeypatch.setattr(exports, "build", build)
    await builder.start()
    builder.submit("ana", "e1")
    await winding_down.wait()
    assert await stopped(builder)


async def test_stop_lands_while_a_cleanup_replaces_the_cancel(
    builder: ExportBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker stops all the same, and the export is not failed."""
    building = asyncio.Event()
    failed: list[str] = []

    async def build(*_: Any) -> bool:
        building.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("can't close the ZIP file while there is an open writing handle") from None
        return True

    async def fail(*args: Any) -> None:
        failed.append(str(args[-1]))

    monkeypatch.setattr(exports, "build", build)
    monkeypatch.setattr(exports, "fail", fail)
    await builder.start()
    builder.submit("ana", "e1")
    await building.wait()
    assert await stopped(builder)
    assert failed == []
