"""Pieces every type family uses: PageInfo, the context type, time conversion."""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.types import Info as StrawberryInfo

from resolvers.core.context import Context
from resolvers.core.cursors import Cursor
from store.items import parse_iso

Info = StrawberryInfo[Context, None]


@strawberry.type
class PageInfo:
    has_next_page: bool
    end: strawberry.Private[Cursor | str | None]

    @strawberry.field
    def end_cursor(self) -> str | None:
        return None if self.end is None else str(self.end)


@strawberry.type
class Edge:
    """What every connection's edge holds first: its cursor, signed only if the
    answer asks for it."""

    position: strawberry.Private[Cursor]

    @strawberry.field
    def cursor(self) -> str:
        return str(self.position)


def when(text: str) -> datetime:
    return parse_iso(text)


def maybe_when(text: str | None) -> datetime | None:
    return None if text is None else parse_iso(text)
