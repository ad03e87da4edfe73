"""Pieces every type family uses: PageInfo, the context type, time conversion."""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.types import Info as StrawberryInfo

from resolvers.core.context import Context
from store.items import parse_iso

Info = StrawberryInfo[Context, None]


@strawberry.type
class PageInfo:
    has_next_page: bool
    end_cursor: str | None


def when(text: str) -> datetime:
    return parse_iso(text)


def maybe_when(text: str | None) -> datetime | None:
    return None if text is None else parse_iso(text)
