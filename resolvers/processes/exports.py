"""The data-export job: builds requested exports beside the requests, as the
media pipeline processes content.

Requests arrive on a bounded queue (`submit` never blocks). An export is built
only under a lease on its record, taken with a conditional write and renewed
while the build runs, so two processes never build the same export; one left
PENDING by a crash (or a full queue) is found again through GSI2
`EXPORTS_PENDING` by the recovery pass, at start-up and every recovery
interval, once its lease has run out. An export whose build failed
`MAX_ATTEMPTS` times (a crash each time, say) ends FAILED. The expiry sweep
deletes what has expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from resolvers.core.config import Settings
from resolvers.domain import exports
from resolvers.processes.workers import cancelling
from store import keys
from store.blobs import BlobStore
from store.items import DataExport, iso
from store.port import Table

log = logging.getLogger("mifamilias.exports")

QUEUE_SIZE = 100
WORKERS = 1


class ExportBuilder:
    def __init__(
        self, *, table: Table, blobs: BlobStore, settings: Settings, clock: Callable[[], datetime]
    ) -> None:
        self.table = table
        self.blobs = blobs
        self.clock = clock
        self.lease = timedelta(seconds=settings.pipeline_lease_seconds)
        self.owner = uuid.uuid4().hex
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(QUEUE_SIZE)
        self._queued: set[tuple[str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._holding: dict[tuple[str, str], DataExport] = {}

    def submit(self, user_id: str, export_id: str) -> None:
        """Never blocks: when the queue is full the export waits for recovery."""
        wanted = (user_id, export_id)
        if wanted in self._queued:
            return
        try:
            self.queue.put_nowait(wanted)
        except asyncio.QueueFull:
            log.warning("export queue full; export %s waits for the next recovery pass", export_id)
            return
        self._queued.add(wanted)

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"exports-{n}") for n in range(WORKERS)]

    async def stop(self) -> None:
        """Stops the workers and hands back the leases of builds cut short."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for export in list(self._holding.values()):
            await exports.release(self.table, export, self.owner)
        self._holding.clear()

    async def _work(self) -> None:
        while True:
            user_id, export_id = await self.queue.get()
            self._queued.discard((user_id, export_id))
            try:
                await self.build(user_id, export_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                if cancelling():
                    raise asyncio.CancelledError from None
                log.exception("exports: unexpected failure on export %s", export_id)
            finally:
                self.queue.task_done()

    async def recover(self) -> int:
        """Queues PENDING exports nobody holds."""
        found = 0
        now = iso(self.clock())
        cursor: str | None = None
        while True:
            page = await self.table.query(keys.EXPORTS_PENDING_PK, index="GSI2", limit=100, cursor=cursor)
            for item in page.items:
                lease = item.get("leaseUntil")
                if lease and lease > now:
                    continue
                self.submit(item["userId"], item["id"])
                found += 1
            if page.cursor is None or self.queue.full():
                return found
            cursor = page.cursor

    async def sweep(self) -> int:
        return await exports.expire(self.table, self.blobs, self.clock())

    async def build(self, user_id: str, export_id: str) -> bool:
        """True when this call built the export."""
        claimed = await exports.claim(self.table, user_id, export_id, self.owner, self.clock(), self.lease)
        if claimed is None:
            return False
        export = DataExport.from_item(claimed)
        if int(claimed.get("attempts", 1)) > exports.MAX_ATTEMPTS:
            await exports.fail(self.table, export, self.owner, self.clock(), "the export could not be built")
            return False
        self._holding[(user_id, export_id)] = export
        heartbeat = asyncio.create_task(self._renew(export))
        cancelled = False
        try:
            with tempfile.TemporaryDirectory(prefix="mifamilias-export-") as workdir:
                return await exports.build(
                    self.table, self.blobs, export, self.owner, self.clock, Path(workdir)
                )
        except asyncio.CancelledError:
            cancelled = True  # `stop` hands the lease back
            raise
        except Exception:
            if cancelling():  # stopped mid-build: not a failure of the export
                cancelled = True
                raise asyncio.CancelledError from None
            log.exception("exports: export %s failed", export_id)
            await exports.fail(
                self.table, export, self.owner, self.clock(), "the export failed; ask for a new one"
            )
            return False
        finally:
            heartbeat.cancel()
            # As in the pipeline: suppressing CancelledError here would swallow a
            # cancel of this worker by `stop`, which would then wait for ever.
            await asyncio.gather(heartbeat, return_exceptions=True)
            if not cancelled:
                self._holding.pop((user_id, export_id), None)

    async def _renew(self, export: DataExport) -> None:
        while True:
            await asyncio.sleep(self.lease.total_seconds() / 3)
            try:
                if not await exports.renew(self.table, export, self.owner, self.clock(), self.lease):
                    return
            except Exception:
                log.exception("exports: could not renew the lease of export %s", export.id)
