"""The data-export job: builds requested exports beside the requests, on a
leased queue (`resolvers.processes.leased`) as the media pipeline does.

An export is built only under a lease on its record, so two processes never
build the same export; one left PENDING by a crash (or a full queue) is found
again through GSI2 `EXPORTS_PENDING` by the recovery pass, once its lease has
run out. An export whose build was claimed `MAX_ATTEMPTS` times (a crash each
time, say) ends FAILED. The expiry sweep deletes what has expired.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from resolvers.core import workdirs
from resolvers.core.config import Settings
from resolvers.domain import exports
from resolvers.processes.leased import Claim, LeasedJob, LeaseSpec, cancelling
from store import keys
from store.blobs import BlobStore
from store.items import DataExport
from store.port import Table

log = logging.getLogger("mifamilias.exports")


class ExportBuilder(LeasedJob):
    SPEC = LeaseSpec(
        "exports",
        recover_from=keys.EXPORTS_PENDING_PK,
        claimable=exports.BUILDING,
        count_attempts=True,
        previous_attempts=exports.PREVIOUS_ATTEMPTS,
    )

    def __init__(
        self, *, table: Table, blobs: BlobStore, settings: Settings, clock: Callable[[], datetime]
    ) -> None:
        super().__init__(table=table, clock=clock, lease=timedelta(seconds=settings.pipeline_lease_seconds))
        self.blobs = blobs

    def submit(self, user_id: str, export_id: str) -> None:
        """Never blocks: when the queue is full the export waits for recovery."""
        self.jobs.submit(keys.data_export(user_id, export_id))

    async def sweep(self) -> int:
        return await exports.expire(self.table, self.blobs, self.clock())

    async def build(self, user_id: str, export_id: str) -> bool:
        """True when this call took the export (and built it, or failed it)."""
        return await self.jobs.run(keys.data_export(user_id, export_id))

    async def process(self, claim: Claim) -> None:
        export = DataExport.from_item(claim.item)
        if claim.attempts > exports.MAX_ATTEMPTS:
            await exports.fail(self.table, export, self.owner, self.clock(), "the export could not be built")
            return
        try:
            with workdirs.work_dir("export") as workdir:
                await exports.build(self.table, self.blobs, export, self.owner, self.clock, Path(workdir))
        except Exception:
            if cancelling():
                raise  # stopped mid-build: not a failure of the export
            log.exception("exports: export %s failed", export.id)
            await exports.fail(
                self.table, export, self.owner, self.clock(), "the export failed; ask for a new one"
            )
