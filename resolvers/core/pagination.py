"""Relay connections over store queries, with signed cursors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from resolvers.core.context import Context
from resolvers.core.cursors import Cursor
from resolvers.core.errors import BadInput
from resolvers.core.loaders import QuerySpec
from resolvers.core.turns import TURNS
from store.port import Index, InvalidCursor, Item, SortKey

MAX_PAGE = 100


@dataclass(frozen=True)
class ItemPage:
    items: list[Item]
    cursors: list[Cursor]
    has_next: bool
    # Past the last edge when filtering stopped reading before filling the page.
    resume_cursor: Cursor | str | None = None

    @property
    def end_cursor(self) -> Cursor | str | None:
        return self.resume_cursor or (self.cursors[-1] if self.cursors else None)


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
    # A page is a hundred objects to decide on and complete: the loop's other work goes first.
    await TURNS.take(ctx)
    # Both indexes project every attribute: what a page holds is the item itself,
    # so point reads of the same items later in the operation need no round trip.
    ctx.loaders.prime(page.items)
    cursors = [ctx.services.cursors.after(scope, item, index) for item in page.items]
    return ItemPage(page.items, cursors, page.cursor is not None)


async def filtered_page(
    ctx: Context,
    *,
    scope: str,
    pk: str,
    sk: SortKey | None = None,
    index: Index = "table",
    descending: bool = False,
    first: int,
    after: str | None,
    keep: Callable[[list[Item]], Awaitable[list[bool]]],
    max_reads: int = 5,
) -> ItemPage:
    """A page of the items `keep` accepts. Filtering can drop items, so the page
    is filled by reading on, at most `max_reads` queries; if that bound comes
    first, the page is short and its end cursor continues after all it read."""
    check_first(first)
    position = ctx.services.cursors.open(scope, after) if after else None
    kept: list[Item] = []
    cursors: list[Cursor] = []
    for _ in range(max_reads):
        try:
            page = await ctx.table.query(
                pk, sk, index=index, descending=descending, limit=first, cursor=position
            )
        except InvalidCursor as error:
            raise BadInput("the cursor is not valid") from error
        await TURNS.take(ctx)
        ctx.loaders.prime(page.items)
        for item, wanted in zip(page.items, await keep(page.items), strict=True):
            if not wanted:
                continue
            if len(kept) == first:
                return ItemPage(kept, cursors, True)  # one more is left: there is a next page
            kept.append(item)
            cursors.append(ctx.services.cursors.after(scope, item, index))
        if page.cursor is None:
            return ItemPage(kept, cursors, False)
        if len(kept) == first:
            return ItemPage(kept, cursors, True)
        position = page.cursor
    assert position is not None
    return ItemPage(kept, cursors, True, ctx.services.cursors.sign(scope, position))
