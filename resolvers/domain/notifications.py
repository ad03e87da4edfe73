"""Notifications: items under the addressee's partition, newest first, each
announced on the addressee's channel once it is written."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from resolvers.adapters.broker import Broker, user_channel
from resolvers.core.context import Context
from resolvers.core.pagination import ItemPage, filtered_page
from store import keys
from store.enums import NotificationType, Role, TrustLevel
from store.items import Content, Family, Membership, Notification
from store.port import ConditionFailed, Item, NotExists, SortKey, Table, Update, eq


def notification_id(*parts: str) -> str:
    """Deterministic: the same event for the same user is the same item, so a
    retried write cannot duplicate it."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def broker_of(ctx: Context) -> Broker | None:
    return ctx.services.broker


async def announce(broker: Broker | None, notes: Sequence[Notification]) -> None:
    if broker is None:
        return
    for note in notes:
        await broker.publish(
            user_channel(note.user_id, "notifications"),
            {"kind": "notification", "userId": note.user_id, "createdAt": note.created_at, "id": note.id},
        )


async def write(table: Table, broker: Broker | None, notes: Sequence[Notification]) -> None:
    """Writes each note once (a replay finds it there and stays quiet)."""
    written: list[Notification] = []
    for note in notes:
        try:
            await table.put(note.to_item(), NotExists())
        except ConditionFailed:
            continue
        written.append(note)
    await announce(broker, written)


async def family_members(table: Table, family_id: str) -> list[Membership]:
    page = await table.query(keys.family_pk(family_id), SortKey.begins_with(keys.MEMBER_PREFIX))
    return [Membership.from_item(item) for item in page.items]


async def content_ready(table: Table, broker: Broker | None, content: Content, at: str) -> None:
    """NEW_CONTENT to the family's other members (capsule content is announced
    when its capsule opens, by the scheduler)."""
    if not content.in_feed:
        return
    notes = [
        Notification(
            user_id=m.user_id,
            id=notification_id(NotificationType.NEW_CONTENT, content.id, m.user_id),
            type=NotificationType.NEW_CONTENT,
            created_at=content.ready_at or at,
            family_id=content.family_id,
            content_id=content.id,
        )
        for m in await family_members(table, content.family_id)
        if m.role in (Role.ADMIN, Role.MEMBER) and m.user_id != content.author_id
    ]
    await write(table, broker, notes)


async def member_joined(
    ctx: Context, family: Family, joined: Membership, members: Sequence[Membership] | None = None
) -> None:
    # `members`, when given, were read by the caller beside its own reads.
    if members is None:
        members = await family_members(ctx.table, family.id)
    if joined.role == Role.PENDING:
        kind = NotificationType.MEMBER_PENDING
        can_admit = (Role.ADMIN, Role.MEMBER) if family.trust_level == TrustLevel.VOUCHED else (Role.ADMIN,)
        to = [m.user_id for m in members if m.role in can_admit and m.user_id != joined.user_id]
    else:
        kind = NotificationType.MEMBER_JOINED
        to = [m.user_id for m in members if m.role == Role.ADMIN and m.user_id != joined.user_id]
    await _family_note(ctx, family, joined, kind, to)


async def member_admitted(
    ctx: Context, family: Family, admitted: Membership, members: Sequence[Membership] | None = None
) -> None:
    if members is None:
        members = await family_members(ctx.table, family.id)
    to = [m.user_id for m in members if m.role == Role.ADMIN and m.user_id != admitted.user_id]
    await _family_note(ctx, family, admitted, NotificationType.MEMBER_JOINED, to)


async def _family_note(
    ctx: Context, family: Family, member: Membership, kind: str, to: Sequence[str]
) -> None:
    now = ctx.services.now_iso()
    notes = [
        Notification(
            user_id=user_id,
            id=notification_id(kind, family.id, member.user_id, member.joined_at, user_id),
            type=kind,
            created_at=now,
            family_id=family.id,
        )
        for user_id in to
    ]
    await write(ctx.table, broker_of(ctx), notes)


async def notifications_page(ctx: Context, first: int, after: str | None, unread_only: bool) -> ItemPage:
    """Newest first; unread-only pages read on past read items (bounded)."""
    viewer = await ctx.viewer_id()

    async def keep(found: list[Item]) -> list[bool]:
        return [not (unread_only and item.get("read")) for item in found]

    return await filtered_page(
        ctx,
        scope=f"notifications:{viewer}:{unread_only}",
        pk=keys.user_pk(viewer),
        sk=SortKey.begins_with(keys.NOTIFICATION_PREFIX),
        descending=True,
        first=first,
        after=after,
        keep=keep,
    )


async def mark_read(ctx: Context, ids: Sequence[str] | None) -> int:
    viewer = await ctx.viewer_id()
    wanted = set(ids) if ids is not None else None
    changed = 0
    cursor: str | None = None
    while True:
        page = await ctx.table.query(
            keys.user_pk(viewer), SortKey.begins_with(keys.NOTIFICATION_PREFIX), cursor=cursor, limit=100
        )
        for item in page.items:
            if item.get("read") or (wanted is not None and item["id"] not in wanted):
                continue
            try:
                await ctx.table.update(
                    Update((item["PK"], item["SK"]), set={"read": True}, condition=eq("read", False))
                )
            except ConditionFailed:
                continue
            changed += 1
        if page.cursor is None:
            return changed
        cursor = page.cursor
