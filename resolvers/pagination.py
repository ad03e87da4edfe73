"""Relay connections over store queries, with signed cursors."""

from __future__ import annotations

from dataclasses import dataclass

from resolvers.context import Context
from resolvers.errors import BadInput
from resolvers.loaders import QuerySpec
from store.expressions import cursor_for
from store.port import Index, InvalidCursor, Item, SortKey

MAX_PAGE = 100


@dataclass(frozen=True)
class ItemPage:
    items: list[Item]
    cursors: list[str]
    has_next: bool

    @property
    def end_cursor(self) -> str | None:
        return self.cursors[-1] if self.cursors else None


def page_size(first: int | None, default: int) -> int:
    """An explicit null means the default; anything else must be in range."""
    return check_first(default if first is None else first)


def check_first(first: int) -> int:
    if not 1 <= first <= MAX_PAGE:
        raise BadInput(f"first must be between 1 and {MAX_PAGE}")
    return first


async def query_page(
    ctx: Context,
    *,
    scope: str,
    pk: str,
    sk: SortKey | None = None,
    index: Index = "table",
    descending: bool = False,
    first: int,
    after: str | None,
) -> ItemPage:
    check_first(first)
    position = ctx.services.cursors.open(scope, after) if after else None
    try:
        page = await ctx.loaders.query.load(
            QuerySpec(pk, sk, index=index, descending=descending, limit=first, cursor=position)
        )
    except InvalidCursor as error:
        raise BadInput("the cursor is not valid") from error
    cursors = [ctx.services.cursors.sign(scope, cursor_for(item, index)) for item in page.items]
    return ItemPage(page.items, cursors, page.cursor is not None)
