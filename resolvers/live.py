"""Live events for subscriptions. Events carry ids; each subscriber re-reads
what it is told about with fresh loaders and its own authorization, so a
member removed from a family stops receiving that family's events."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from resolvers import capsules
from resolvers import content as content_resolvers
from resolvers.broker import Broker, content_channel, user_channel
from resolvers.context import Context
from resolvers.errors import NotFound
from resolvers.families import READERS
from resolvers.loaders import Loaders
from store import keys
from store.items import Capsule, Content, Notification
from store.port import Item, SortKey

log = logging.getLogger("mifamilias.live")


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


class EventReads:
    """One store read per event, shared by every subscriber it wakes in this
    process: an unlock wakes all its recipients at once, and each would
    otherwise read the same capsule, content and family. Authorization stays
    per subscriber, on what was read."""

    TTL_SECONDS = 10.0

    def __init__(self) -> None:
        self._reads: dict[tuple[str, ...], tuple[float, asyncio.Future[list[Item | None]]]] = {}

    async def read(
        self, key: tuple[str, ...], load: Callable[[], Awaitable[list[Item | None]]]
    ) -> list[Item | None]:
        now = time.monotonic()
        if len(self._reads) > 1000:
            self._reads = {k: v for k, v in self._reads.items() if v[0] > now}
        cached = self._reads.get(key)
        if cached is not None and cached[0] > now:
            return await asyncio.shield(cached[1])
        future: asyncio.Future[list[Item | None]] = asyncio.ensure_future(load())
        self._reads[key] = (now + self.TTL_SECONDS, future)
        return await asyncio.shield(future)


def _event_reads(ctx: Context) -> EventReads:
    reads: EventReads = ctx.services.extras.setdefault("event_reads", EventReads())
    return reads


async def _unlocked_capsule(ctx: Context, event: dict[str, object], viewer: str) -> Capsule | None:
    capsule_id, unlocked_at = str(event["capsuleId"]), str(event["unlockedAt"])
    if "#" in capsule_id:
        return None
    capsule_key = keys.capsule(capsule_id)

    async def load() -> list[Item | None]:
        first = await ctx.table.get(capsule_key)
        if first is None:
            return [None]
        wanted = [keys.content(first["contentId"])] if first.get("contentId") else []
        members = await ctx.table.query(
            keys.family_pk(first["familyId"]), SortKey.begins_with(keys.MEMBER_PREFIX)
        )
        found = await ctx.table.batch_get(wanted) if wanted else {}
        return [first, *found.values(), *members.items]

    shared = await _event_reads(ctx).read(("capsule", capsule_id, unlocked_at), load)
    if shared[0] is None:
        return None
    capsule = Capsule.from_item(shared[0])
    readers = {
        i["userId"] for i in shared[1:] if i and i.get("type") == "Membership" and i["role"] in READERS
    }
    if not capsules.can_see(capsule, viewer) or (viewer != capsule.creator_id and viewer not in readers):
        return None
    for item in shared:
        if item is not None:
            ctx.loaders.remember(item)  # the payload's fields read what was shared
    return capsule


async def capsules_unlocked(ctx: Context) -> AsyncIterator[tuple[Capsule, str]]:
    viewer = await ctx.viewer_id()
    async with _broker(ctx).subscribe(user_channel(viewer)) as events:
        async for event in events:
            if event.get("kind") != "capsule":
                continue
            _refresh(ctx)
            try:
                capsule = await _unlocked_capsule(ctx, event, viewer)
            except Exception:
                # The store failed this read; the notification stays in the table.
                log.exception("could not read capsule %s for a subscriber", event.get("capsuleId"))
                continue
            if capsule is not None:
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
