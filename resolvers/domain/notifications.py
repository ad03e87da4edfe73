"""Notifications: items under the addressee's partition, newest first, each
announced on the addressee's channel once it is written.

Read state. A person's unread count is kept in `keys.UNREAD_SLOTS`
counter items beside their notifications, with an epoch: "mark everything
read" moves the epoch on (one transaction of the counters, whatever the number
of notifications), and a notification written at an older epoch is read
(`Notification.read_in`). Every change of read state moves the count in the
same transaction:

- writing a notification: its put (NotExists, so a replay counts nothing) and
  +1 on the first counter, both at the epoch read just before;
- marking listed ids: the notes' `read` flags (each conditioned on being unread
  at that epoch) and -n on one counter, up to 99 notes per transaction, the
  transactions in parallel, each on a counter of its own;
- marking everything: both counters to the next epoch and 0, conditioned on
  the values read, so the answer (how many became read) is exact.

A notification's public id names its key and epoch (`public_id`), so marking
listed ids reads nothing first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from resolvers.adapters.broker import publish_committed, user_channel
from resolvers.core.context import Context
from resolvers.core.errors import Conflict
from resolvers.core.pagination import ItemPage, filtered_page
from resolvers.core.ports import EventBus
from store import keys
from store.enums import NotificationType, Role, TrustLevel
from store.items import Content, Family, Membership, Notification, UnreadCounter
from store.port import (
    MAX_TRANSACTION_ITEMS,
    ConditionFailed,
    Item,
    Key,
    NotExists,
    Put,
    SortKey,
    StoreError,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
    all_of,
    eq,
    every_item,
)

# Tries of a write whose epoch moved under it (a "mark everything read" between
# reading the epoch and writing), before giving up.
ATTEMPTS = 5
# Notes marked in one transaction: the rest of it is their counter.
MARKED_PER_TRANSACTION = MAX_TRANSACTION_ITEMS - 1
# Notes written in one transaction, each with its addressee's counter at worst.
WRITTEN_PER_TRANSACTION = MAX_TRANSACTION_ITEMS // 2
CONDITION_FAILED = "ConditionalCheckFailed"


# Public ids ------------------------------------------------------------------------


def public_id(note: Notification) -> str:
    """`<id>.<epoch>.<createdAt>`: what `markNotificationsRead` needs to reach
    the note and its counter without reading first."""
    return f"{note.id}.{note.epoch or 0}.{note.created_at}"


@dataclass(frozen=True)
class Named:
    """A note named by a public id: not known to exist, nor to be the viewer's."""

    key: Key
    epoch: int


def parse_public_id(user_id: str, value: str) -> Named | None:
    """None for anything `public_id` cannot have made: it names nothing."""
    parts = value.split(".", 2)
    if len(parts) != 3:
        return None
    note_id, epoch, created_at = parts
    if not (note_id and created_at and epoch.isascii() and epoch.isdigit() and len(epoch) <= 15):
        return None
    if not (keys.usable_id(note_id) and keys.usable_id(created_at)):
        return None
    return Named(keys.notification(user_id, created_at, note_id), int(epoch))


# Counts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    epoch: int
    unread: int


def counter_keys(user_id: str) -> list[Key]:
    return [keys.unread_counter(user_id, slot) for slot in range(keys.UNREAD_SLOTS)]


def counters_of(user_id: str, found: Sequence[Item | None]) -> list[UnreadCounter]:
    """Each share as stored, or at epoch 0 with nothing counted if never written."""
    return [
        UnreadCounter.from_item(item) if item is not None else UnreadCounter(user_id, slot)
        for slot, item in enumerate(found)
    ]


def tally(counters: Sequence[UnreadCounter]) -> Tally:
    # Every share moves to a new epoch in one transaction; the first one's epoch
    # is the person's (writes of new notifications count there).
    epoch = counters[0].epoch
    return Tally(epoch, sum(c.unread for c in counters if c.epoch == epoch))


async def viewer_tally(ctx: Context, viewer: str) -> Tally:
    """One batch get, shared with anything else of the same resolver level."""
    return tally(counters_of(viewer, await ctx.loaders.many(counter_keys(viewer))))


async def unread_count(ctx: Context) -> int:
    return (await viewer_tally(ctx, await ctx.viewer_id())).unread


async def epoch_of(table: Table, user_id: str) -> int:
    item = await table.get(keys.unread_counter(user_id, 0))
    return UnreadCounter.from_item(item).epoch if item is not None else 0


# Writing ---------------------------------------------------------------------------


def notification_id(*parts: str) -> str:
    """Deterministic: the same event for the same user is the same item, so a
    retried write cannot duplicate it."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def broker_of(ctx: Context) -> EventBus | None:
    return ctx.services.broker


async def announce(broker: EventBus | None, notes: Sequence[Notification]) -> None:
    """After the notes are committed: best effort (`publish_committed`)."""
    await publish_committed(
        broker,
        [
            (
                user_channel(note.user_id, "notifications"),
                {"kind": "notification", "userId": note.user_id, "createdAt": note.created_at, "id": note.id},
            )
            for note in notes
        ],
    )


async def write(table: Table, broker: EventBus | None, notes: Sequence[Notification]) -> None:
    """Writes each note once (a replay finds it there and stays quiet)."""
    await announce(broker, await store(table, notes))


async def store(table: Table, notes: Sequence[Notification]) -> list[Notification]:
    """Writes each note once, counted unread in the same transaction, and
    returns those written now (a replay finds its note there and counts
    nothing): a batch get and one transaction per `WRITTEN_PER_TRANSACTION`."""
    written: list[Notification] = []
    pending = list(notes)
    moved = 0
    while pending:
        chunk = pending[:WRITTEN_PER_TRANSACTION]
        fresh, ops = await creation_ops(table, chunk)
        try:
            await table.transact(ops)
        except TransactionCancelled as error:
            if any(r.reason != CONDITION_FAILED for r in error.reasons):
                raise
            if not any(error.failed_on(note.key) for note in fresh):
                # Everything was marked read between reading an epoch and writing.
                moved += 1
                if moved == ATTEMPTS:
                    raise StoreError("unread counts kept moving under new notifications") from error
            continue  # (a note written meanwhile is found there, and left out, next time)
        written += fresh
        pending = pending[len(chunk) :]
    return written


async def creation_ops(
    table: Table, notes: Sequence[Notification]
) -> tuple[list[Notification], list[WriteOp]]:
    """The notes not written yet, and for one transaction their puts, each at
    its addressee's epoch read now, and their counts. One batch get reads the
    epochs and the notes; the transaction is cancelled if a note is written or
    an epoch moves meanwhile."""
    if not notes:
        return [], []
    users = list(dict.fromkeys(note.user_id for note in notes))
    counter_at = {user: keys.unread_counter(user, 0) for user in users}
    found = await table.batch_get([*counter_at.values(), *(note.key for note in notes)])
    counters = {user: counters_of(user, [found.get(key)])[0] for user, key in counter_at.items()}
    fresh = [note for note in notes if note.key not in found]
    added = Counter(note.user_id for note in fresh)
    stamped = [dataclasses.replace(note, epoch=counters[note.user_id].epoch) for note in fresh]
    puts = [Put(note.to_item(), NotExists()) for note in stamped]
    return fresh, [*puts, *(counters[user].add(n) for user, n in added.items())]


async def family_members(table: Table, family_id: str) -> list[Membership]:
    page = await table.query(keys.family_pk(family_id), SortKey.begins_with(keys.MEMBER_PREFIX))
    return [Membership.from_item(item) for item in page.items]


async def content_ready(table: Table, broker: EventBus | None, content: Content, at: str) -> None:
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


def joined_notes(
    ctx: Context, family: Family, joined: Membership, members: Sequence[Membership]
) -> list[Notification]:
    """Who is told of a join: the admins, or those who may admit a PENDING member."""
    if joined.role == Role.PENDING:
        kind = NotificationType.MEMBER_PENDING
        can_admit = (Role.ADMIN, Role.MEMBER) if family.trust_level == TrustLevel.VOUCHED else (Role.ADMIN,)
        to = [m.user_id for m in members if m.role in can_admit and m.user_id != joined.user_id]
    else:
        kind = NotificationType.MEMBER_JOINED
        to = [m.user_id for m in members if m.role == Role.ADMIN and m.user_id != joined.user_id]
    return _family_notes(ctx, family, joined, kind, to)


def admitted_notes(
    ctx: Context, family: Family, admitted: Membership, members: Sequence[Membership]
) -> list[Notification]:
    to = [m.user_id for m in members if m.role == Role.ADMIN and m.user_id != admitted.user_id]
    return _family_notes(ctx, family, admitted, NotificationType.MEMBER_JOINED, to)


async def member_admitted(ctx: Context, family: Family, admitted: Membership) -> None:
    members = await family_members(ctx.table, family.id)
    await write(ctx.table, broker_of(ctx), admitted_notes(ctx, family, admitted, members))


def _family_notes(
    ctx: Context, family: Family, member: Membership, kind: str, to: Sequence[str]
) -> list[Notification]:
    now = ctx.services.now_iso()
    return [
        Notification(
            user_id=user_id,
            id=notification_id(kind, family.id, member.user_id, member.joined_at, user_id),
            type=kind,
            created_at=now,
            family_id=family.id,
        )
        for user_id in to
    ]


async def write_prepared(
    table: Table,
    broker: EventBus | None,
    notes: Sequence[Notification],
    prepared: tuple[list[Notification], list[WriteOp]],
) -> None:
    """Writes notes whose epochs were read beside the caller's own write (from
    `creation_ops`), saving a round trip; if an epoch moved meanwhile, `store`
    reads again."""
    fresh, ops = prepared
    try:
        if ops:
            await table.transact(ops)
    except TransactionCancelled:
        fresh = await store(table, notes)
    await announce(broker, fresh)


async def notifications_page(ctx: Context, first: int, after: str | None, unread_only: bool) -> ItemPage:
    """Newest first, each item's `read` as the epoch has it; unread-only pages
    read on past read items (bounded). The counters are read beside the first
    query, in the same round trip."""
    viewer = await ctx.viewer_id()
    counted = asyncio.ensure_future(viewer_tally(ctx, viewer))
    # Retrieved even when the page fails first, so its error is not reported twice.
    counted.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def keep(found: list[Item]) -> list[bool]:
        epoch = (await counted).epoch
        return [not (unread_only and Notification.from_item(item).read_in(epoch)) for item in found]

    page = await filtered_page(
        ctx,
        scope=f"notifications:{viewer}:{unread_only}",
        pk=keys.user_pk(viewer),
        sk=SortKey.begins_with(keys.NOTIFICATION_PREFIX),
        descending=True,
        first=first,
        after=after,
        keep=keep,
    )
    epoch = (await counted).epoch
    return dataclasses.replace(
        page, items=[{**item, "read": Notification.from_item(item).read_in(epoch)} for item in page.items]
    )


# Marking read ------------------------------------------------------------------------


async def mark_read(ctx: Context, ids: Sequence[str] | None) -> int:
    """How many of the viewer's notifications became read (were unread just before)."""
    viewer = await ctx.viewer_id()
    if ids is None:
        return await _mark_everything(ctx.table, viewer)
    named = {found for found in (parse_public_id(viewer, value) for value in ids) if found}
    # The ids of one epoch at a time, the newest first: only the current epoch's
    # notes can be unread (older ones were read by a "mark everything read"), and
    # its counters are the only ones a transaction at that epoch matches. A later
    # epoch than there is (a made-up id) fails on its counters and costs a round trip.
    for epoch in sorted({found.epoch for found in named}, reverse=True):
        current = [found.key for found in named if found.epoch == epoch]
        counted = await _mark_at(ctx.table, viewer, epoch, current)
        if counted is not None:
            return counted
    return 0


async def _mark_at(table: Table, viewer: str, epoch: int, named: list[Key]) -> int | None:
    """How many of the named notes became read, or None if `epoch` is not the
    viewer's. Up to 198 notes in one round trip: a transaction per counter,
    in parallel (no two of them touch the same item)."""
    size = MARKED_PER_TRANSACTION
    chunks = [named[start : start + size] for start in range(0, len(named), size)]
    changed: int | None = None
    for start in range(0, len(chunks), keys.UNREAD_SLOTS):
        wave = chunks[start : start + keys.UNREAD_SLOTS]
        counts = await asyncio.gather(
            *(_mark(table, UnreadCounter(viewer, slot, epoch), chunk) for slot, chunk in enumerate(wave))
        )
        for count in counts:
            if count is not None:
                changed = (changed or 0) + count
    return changed


async def _mark(table: Table, counter: UnreadCounter, named: list[Key]) -> int | None:
    """Marks the named notes read and counts them out of `counter`, in one
    transaction; a note that is not there, or not unread at the counter's
    epoch, cancels it, and the rest are tried again without it. None if the
    counter is not at that epoch (or no note was left to find out)."""
    pending = list(named)
    while pending:
        marks: list[WriteOp] = [
            Update(key, set={"read": True}, condition=all_of(eq("read", False), eq("epoch", counter.epoch)))
            for key in pending
        ]
        try:
            await table.transact([*marks, counter.add(-len(pending))])
        except TransactionCancelled as error:
            if any(r.reason != CONDITION_FAILED for r in error.reasons):
                raise
            if error.failed_on(counter.key):
                return None  # not the epoch: every one of them is read already, or never was
            failed = set(error.failed_keys)
            pending = [key for key in pending if key not in failed]
            continue
        return len(pending)
    return None  # none of them could be marked, which says nothing of the epoch


async def _mark_everything(table: Table, viewer: str) -> int:
    """Every counter to the next epoch and 0 in one transaction, conditioned on
    the values read: a note written or marked meanwhile makes it count again."""
    wanted = counter_keys(viewer)
    for _ in range(ATTEMPTS):
        found = await table.batch_get(wanted)
        counters = counters_of(viewer, [found.get(key) for key in wanted])
        now = tally(counters)
        if now.unread == 0:
            return 0
        ops: list[WriteOp] = [
            Put(
                dataclasses.replace(counter, epoch=now.epoch + 1, unread=0).to_item(),
                all_of(eq("epoch", counter.epoch), eq("unread", counter.unread))
                if counter.key in found
                else NotExists(),
            )
            for counter in counters
        ]
        try:
            await table.transact(ops)
        except TransactionCancelled as error:
            if any(r.reason != CONDITION_FAILED for r in error.reasons):
                raise
            continue
        return now.unread
    raise Conflict("your notifications keep changing; try again")


# Leaving ---------------------------------------------------------------------------


async def delete_all(table: Table, user_id: str) -> None:
    """Every notification of the person, and their counters. The counters are
    read first and deleted last, each only if unchanged: a notification written
    meanwhile (and counted) makes the round start again and is deleted then."""
    wanted = counter_keys(user_id)
    for _ in range(ATTEMPTS):
        found = await table.batch_get(wanted)
        notes: list[Key] = [
            (item["PK"], item["SK"])
            async for item in every_item(
                table, keys.user_pk(user_id), SortKey.begins_with(keys.NOTIFICATION_PREFIX)
            )
        ]
        if notes:
            await table.batch_write(deletes=notes)
        try:
            for key, item in found.items():
                await table.delete(key, all_of(eq("epoch", item["epoch"]), eq("unread", item["unread"])))
        except ConditionFailed:
            continue
        return
    raise Conflict("notifications keep arriving; try again")
