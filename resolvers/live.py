"""Live events for subscriptions. Events carry ids; each subscriber re-reads
what it is told about with fresh loaders and its own authorization, so a
member removed from a family stops receiving that family's events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from resolvers import capsules
from resolvers import content as content_resolvers
from resolvers.broker import Broker, content_channel, user_channel
from resolvers.context import Context
from resolvers.errors import NotFound
from resolvers.loaders import Loaders
from store import keys
from store.items import Capsule, Content, Notification


def _broker(ctx: Context) -> Broker:
    broker: Broker = ctx.services.extras["broker"]
    return broker


def _refresh(ctx: Context) -> None:
    # The connection's context outlives one event; its cache must not.
    ctx.loaders = Loaders(ctx.table)


async def content_status(ctx: Context, content_id: str) -> AsyncIterator[Content]:
    """The content as it is now, then again at every status change."""
    content, _ = await content_resolvers.readable_content(ctx, content_id)
    async with _broker(ctx).subscribe(content_channel(content_id)) as events:
        yield content
        last = content.status
        async for event in events:
            _refresh(ctx)
            try:
                content, _ = await content_resolvers.readable_content(ctx, content_id)
            except NotFound:
                if await content_resolvers.load_content(ctx, content_id) is None:
                    return  # deleted: the stream ends
                continue  # no longer theirs to see
            # The content may have moved on while this event travelled: report
            # the move the event announces, so every state is seen in order.
            status = str(event.get("status") or content.status)
            if status != last:
                last = status
                yield replace(content, status=status)


async def capsules_unlocked(ctx: Context) -> AsyncIterator[tuple[Capsule, str]]:
    viewer = await ctx.viewer_id()
    async with _broker(ctx).subscribe(user_channel(viewer)) as events:
        async for event in events:
            if event.get("kind") != "capsule":
                continue
            _refresh(ctx)
            try:
                capsule = await capsules.visible_capsule(ctx, str(event["capsuleId"]))
            except NotFound:
                continue
            yield capsule, str(event["unlockedAt"])


async def notifications_added(ctx: Context) -> AsyncIterator[Notification]:
    viewer = await ctx.viewer_id()
    async with _broker(ctx).subscribe(user_channel(viewer)) as events:
        async for event in events:
            if event.get("kind") != "notification" or event.get("userId") != viewer:
                continue
            _refresh(ctx)
            item = await ctx.loaders.item.load(
                keys.notification(viewer, str(event["createdAt"]), str(event["id"]))
            )
            if item is not None:
                yield Notification.from_item(item)
