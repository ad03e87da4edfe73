"""Leaving with one's data: the data export as the API shows it."""

from __future__ import annotations

from datetime import datetime

import strawberry

from resolvers.domain import exports
from schema.common import Info, maybe_when
from schema.enums import DataExportStatus
from store import items


@strawberry.type(
    description="A zip of everything the viewer put in: one JSON document and the original media "
    f"files. Built in the background; downloadable for {exports.EXPORT_DAYS} days, then deleted."
)
class DataExport:
    item: strawberry.Private[items.DataExport]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    def status(self) -> DataExportStatus:
        return DataExportStatus(self.item.status)

    @strawberry.field(description="a short-lived signed URL of the zip; null unless READY")
    async def download_url(self, info: Info) -> str | None:
        return await exports.download_url(info.context, self.item)

    @strawberry.field(description="when the export and its file are deleted; null while PENDING")
    def expires_at(self) -> datetime | None:
        return maybe_when(self.item.available_until)
