"""A leased worker stops when told to, even when the stop lands while it waits
for its lease heartbeat to wind down.

The window is one in which a worker's build has ended and its `finally` waits
for the heartbeat task. A cancel of the worker arriving then used to be
swallowed (`suppress(CancelledError)` around that wait): the worker went back to
its queue and `stop()` waited for ever. It hung a CI run. The heartbeat here is
made slow to wind down, so that the stop lands in that window every time.
"""

from __future__ import annotations

import asyncio
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


async def test_stop_lands_while_the_heartbeat_winds_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = SqliteTable(tmp_path / "table.sqlite3")
    settings = Settings(data_dir=tmp_path / "data", auth_secret="s" * 32)
    builder = ExportBuilder(
        table=table,
        blobs=LocalBlobStore(tmp_path / "blobs", "http://testserver", b"k" * 32),
        settings=settings,
        clock=now,
    )
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

    async def claim(*_: Any) -> dict[str, Any]:
        record = DataExport(
            user_id="ana",
            id="e1",
            status=ExportStatus.PENDING,
            requested_at="2026-11-30T00:00:00Z",
            expires_at=0,
        )
        return record.to_item()

    async def build(*_: Any) -> bool:
        await beating.wait()
        return True

    monkeypatch.setattr(builder, "_renew", heartbeat)
    monkeypatch.setattr(exports, "claim", claim)
    monkeypatch.setattr(exports, "build", build)
    monkeypatch.setattr(exports, "release", lambda *_: asyncio.sleep(0))
    try:
        await builder.start()
        builder.submit("ana", "e1")
        await winding_down.wait()
        stopping = asyncio.create_task(builder.stop())
        # A hang guard, not a speed claim: before the fix `stop` never returned.
        # (`wait`, not `wait_for`: the latter's own cancel would end the worker.)
        await asyncio.wait({stopping}, timeout=30)
        assert stopping.done()
    finally:
        await table.close()


async def test_stop_lands_while_a_cleanup_replaces_the_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build whose cleanup raises on the cancel (a zip closed while a thread
    still writes to it) stops its worker all the same, and fails nothing."""
    table = SqliteTable(tmp_path / "table.sqlite3")
    settings = Settings(data_dir=tmp_path / "data", auth_secret="s" * 32)
    blobs = LocalBlobStore(tmp_path / "blobs", "http://testserver", b"k" * 32)
    builder = ExportBuilder(table=table, blobs=blobs, settings=settings, clock=now)
    building = asyncio.Event()
    failed: list[str] = []

    async def claim(*_: Any) -> dict[str, Any]:
        record = DataExport(
            user_id="ana",
            id="e1",
            status=ExportStatus.PENDING,
            requested_at="2026-11-30T00:00:00Z",
            expires_at=0,
        )
        return record.to_item()

    async def build(*_: Any) -> bool:
        building.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise ValueError("can't close the ZIP file while there is an open writing handle") from None
        return True

    async def fail(*args: Any) -> None:
        failed.append(str(args[-1]))

    monkeypatch.setattr(exports, "claim", claim)
    monkeypatch.setattr(exports, "build", build)
    monkeypatch.setattr(exports, "fail", fail)
    monkeypatch.setattr(exports, "release", lambda *_: asyncio.sleep(0))
    try:
        await builder.start()
        builder.submit("ana", "e1")
        await building.wait()
        stopping = asyncio.create_task(builder.stop())
        # A hang guard, not a speed claim: the worker used to go back to its queue.
        await asyncio.wait({stopping}, timeout=30)
        assert stopping.done()
        assert failed == []
    finally:
        await table.close()
