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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from resolvers.adapters.broker import publish_committed, to_the_end, user_channel
from resolvers.core.context import Context
from resolvers.core.errors import Conflict
from resolvers.core.pagination import ItemPage, filtered_page
from resolvers.core.ports import Event, EventBus
from resolvers.core.slices import built
from store import keys
from store.enums import NotificationType, Role, TrustLevel
from store.items import Capsule, Content, Family, Membership, Notification, UnreadCounter
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
    op_key,
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


def stored_id(value: str) -> str:
    """The stored id in a public id, or a stored id as it is (an id has no dot)."""
    return value.split(".", 1)[0]


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
#
# `write` is the only function that stores a notification: it stamps each note
# with its addressee's epoch, counts it unread in the same transaction, and
# announces it. The notes themselves are built here too, one builder per kind,
# so the next kind of notification goes through the same rule or nowhere
# (`tests/test_layers.py` checks that no other module builds one).


def notification_id(*parts: str) -> str:
    """Deterministic: the same event for the same user is the same item, so a
    retried write cannot duplicate it."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def broker_of(ctx: Context) -> EventBus | None:
    return ctx.services.broker


def channel(user_id: str) -> str:
    """Where a person's notifications are announced."""
    return user_channel(user_id, "notifications")


def announcement(user_id: str, created_at: str, note_id: str) -> tuple[str, Event]:
    """The event that tells a person's streams of a note (the one shape of it)."""
    return (
        channel(user_id),
        {"kind": "notification", "userId": user_id, "createdAt": created_at, "id": note_id},
    )


# Where the push workers of every process hear of notes to push (they are in the
# push outbox already; this only saves waiting for the next recovery scan).
PUSH_CHANNEL = "push:outbox"


def push_wake(notes: Sequence[tuple[str, str, str]]) -> tuple[str, Event]:
    """The event that tells the push workers of new notes, each (user, createdAt, id)."""
    return (PUSH_CHANNEL, {"kind": "push", "notes": [list(note) for note in notes]})


async def _announce(broker: EventBus | None, notes: Sequence[Notification]) -> None:
    """After the notes are committed: best effort (`publish_committed`)."""
    events = [announcement(n.user_id, n.created_at, n.id) for n in notes]
    pushed = [(n.user_id, n.created_at, n.id) for n in notes if n.push_pending]
    if pushed:
        events.append(push_wake(pushed))
    await publish_committed(broker, events)


@dataclass(frozen=True)
class Prepared:
    """What `write` reads before its transaction: each addressee's first
    counter, who of them has push devices, and which of the notes are not
    written yet."""

    fresh: list[Notification]
    counters: dict[str, UnreadCounter]
    with_devices: frozenset[str] = frozenset()


def reads_for(notes: Sequence[Notification]) -> list[Key]:
    """What `prepared_from` needs, for a caller to read it in a batch of its
    own (for new notes only: their ids are new, so they are not there): each
    addressee's first counter and device count."""
    users = dict.fromkeys(note.user_id for note in notes)
    return [key for user in users for key in reads_for_user(user)]


def reads_for_user(user_id: str) -> tuple[Key, Key]:
    return (keys.unread_counter(user_id, 0), keys.push_device_count(user_id))


def prepared_from(notes: Sequence[Notification], found: Mapping[Key, Item | None]) -> Prepared:
    users = dict.fromkeys(note.user_id for note in notes)
    counters = {user: counters_of(user, [found.get(keys.unread_counter(user, 0))])[0] for user in users}
    # Only a note to someone with a device goes in the push outbox (the count is
    # read in the same batch as the epoch: no round trip of its own).
    with_devices = frozenset(
        user for user in users if int((found.get(keys.push_device_count(user)) or {}).get("count", 0)) > 0
    )
    return Prepared([note for note in notes if found.get(note.key) is None], counters, with_devices)


async def prepare(table: Table, notes: Sequence[Notification]) -> Prepared:
    """One batch get: the addressees' epochs, and the notes already there."""
    if not notes:
        return Prepared([], {})
    found = await table.batch_get([*reads_for(notes), *(note.key for note in notes)])
    return prepared_from(notes, found)


def _creation_ops(prepared: Prepared) -> tuple[list[Notification], list[WriteOp]]:
    """The fresh notes stamped with their addressee's epoch, and for one
    transaction their puts and counts (cancelled if a note is written or an
    epoch moves meanwhile)."""
    stamped = [
        dataclasses.replace(
            note,
            epoch=prepared.counters[note.user_id].epoch,
            push_pending=note.user_id in prepared.with_devices,
        )
        for note in prepared.fresh
    ]
    added = Counter(note.user_id for note in stamped)
    puts: list[WriteOp] = [Put(note.to_item(), NotExists()) for note in stamped]
    return stamped, [*puts, *(prepared.counters[user].add(n) for user, n in added.items())]


async def write(
    table: Table,
    broker: EventBus | None,
    notes: Sequence[Notification],
    *,
    prepared: Prepared | None = None,
    beside: Sequence[WriteOp] = (),
    announce: bool = True,
) -> list[Notification]:
    """Stores each note once, stamped with its addressee's epoch and counted
    unread in the same transaction, then announces those written now (a replay
    finds its note there, and counts and announces nothing). Returns them.

    `prepared` holds what the caller read beside its own work (`prepare`, or
    `prepared_from` a batch of its own), saving a round trip; if an epoch moved
    meanwhile, it is read again. `beside` are the caller's own writes, committed
    in the first transaction with the notes (which must then fit in it); if one
    of them fails, the transaction's `TransactionCancelled` is raised and
    nothing is written. `announce=False` is for a caller that publishes the
    notes itself, with `announcement`, once a later write of its own commits.

    Runs to its end even if the operation is stopped meanwhile (`to_the_end`):
    a transaction in flight when the deadline passes may land, and its notes
    must then be announced; no outbox would tell the streams otherwise."""
    return await to_the_end(_write(table, broker, notes, prepared, beside, announce))


async def _write(
    table: Table,
    broker: EventBus | None,
    notes: Sequence[Notification],
    prepared: Prepared | None,
    beside: Sequence[WriteOp],
    announce: bool,
) -> list[Notification]:
    extra = list(beside)
    if extra and len(notes) + len(extra) > WRITTEN_PER_TRANSACTION:
        raise ValueError("notes written beside other writes must fit in one transaction")
    written: list[Notification] = []
    pending = list(notes)
    moved = 0
    while pending or extra:
        chunk = pending if extra else pending[:WRITTEN_PER_TRANSACTION]
        if prepared is not None and len(chunk) == len(notes):
            ready = prepared
        else:
            ready = await prepare(table, chunk)
        prepared = None
        stamped, ops = _creation_ops(ready)
        try:
            if ops or extra:
                await table.transact([*extra, *ops])
        except TransactionCancelled as error:
            if any(r.reason != CONDITION_FAILED for r in error.reasons):
                raise
            if any(error.failed_on(op_key(op)) for op in extra):
                raise
            if not any(error.failed_on(note.key) for note in ready.fresh):
                # Everything was marked read between reading an epoch and writing.
                moved += 1
                if moved == ATTEMPTS:
                    raise StoreError("unread counts kept moving under new notifications") from error
            continue  # (a note written meanwhile is found there, and left out, next time)
        written += stamped
        pending = pending[len(chunk) :]
        extra = []
    if announce:
        await _announce(broker, written)
    return written


# Who is told of what ----------------------------------------------------------------


async def family_members(table: Table, family_id: str) -> list[Membership]:
    page = await table.query(keys.family_pk(family_id), SortKey.begins_with(keys.MEMBER_PREFIX))
    return [Membership.from_item(item) for item in page.items]


async def content_ready(table: Table, broker: EventBus | None, content: Content, ready: Update) -> None:
    """Commits `ready` (the content's move to READY, conditional on the status
    it was read in) with NEW_CONTENT to the family's other members, then
    announces them. The notes that fit go in the move's own transaction, a
    large family's first ones in transactions before it: a crash anywhere
    leaves the content either short of READY, its walk resumed by the
    pipeline's recovery to write what is missing, or READY with every note.
    Capsule content is announced when its capsule opens, by the scheduler.

    Its writes and the announcement run to their end once the writes start
    (`to_the_end`), as `write`'s do: a move that commits is announced."""
    at = content.notes_at or str(ready.set["readyAt"])
    members = await family_members(table, content.family_id) if content.in_feed else []
    notes = [
        Notification(
            user_id=m.user_id,
            id=notification_id(NotificationType.NEW_CONTENT, content.id, m.user_id),
            type=NotificationType.NEW_CONTENT,
            created_at=at,
            family_id=content.family_id,
            content_id=content.id,
        )
        for m in members
        if m.role in (Role.ADMIN, Role.MEMBER) and m.user_id != content.author_id
    ]
    if not notes:
        await table.update(ready)
        return
    beside_the_move = len(notes) % (WRITTEN_PER_TRANSACTION - 1) or WRITTEN_PER_TRANSACTION - 1
    first, last = notes[:-beside_the_move], notes[-beside_the_move:]
    if first and content.notes_at is None:
        # Dated once, before the first of them: a resumed walk finds them under their keys.
        await table.update(Update(content.key, set={"notesAt": at}, condition=eq("status", content.status)))
    await to_the_end(_ready_with(table, broker, first, last, ready, first_time=content.ready_at is None))


async def _ready_with(
    table: Table,
    broker: EventBus | None,
    first: list[Notification],
    last: list[Notification],
    ready: Update,
    *,
    first_time: bool,
) -> None:
    notes = [*first, *last]
    written = await _write(table, broker, first, None, (), announce=False) if first else []
    written += await _write(table, broker, last, None, [ready], announce=False)
    if first_time:
        # Notes that a crashed walk stored before the move belong to this move
        # too, and nobody announced them.
        fresh = {note.id for note in written}
        written += [note for note in notes if note.id not in fresh]
    # (Back at READY after a retried transcription, the notes are old news.)
    await _announce(broker, written)


def comment_notes(content: Content, comment_id: str, created_at: str, to_author: bool) -> list[Notification]:
    """NEW_COMMENT to the content's author (when someone else comments, and the
    author still reads the family)."""
    if not to_author:
        return []
    return [
        Notification(
            user_id=content.author_id,
            id=notification_id(NotificationType.NEW_COMMENT, comment_id, content.author_id),
            type=NotificationType.NEW_COMMENT,
            created_at=created_at,
            family_id=content.family_id,
            content_id=content.id,
        )
    ]


async def unlocked_notes(
    capsule: Capsule, content_id: str, people: Sequence[str], at: str
) -> list[Notification]:
    """CAPSULE_UNLOCKED to each person told of an opening (a whole family, in slices)."""
    return await built(
        people,
        lambda user: Notification(
            user_id=user,
            id=unlocked_id(capsule.id, user),
            type=NotificationType.CAPSULE_UNLOCKED,
            created_at=at,
            family_id=capsule.family_id,
            content_id=content_id,
            capsule_id=capsule.id,
        ),
    )


def unlocked_id(capsule_id: str, user_id: str) -> str:
    return notification_id(NotificationType.CAPSULE_UNLOCKED, capsule_id, user_id)


def empty_note(capsule: Capsule) -> Notification:
    """CAPSULE_EMPTY to the creator of a capsule whose date came with no content."""
    return Notification(
        user_id=capsule.creator_id,
        id=notification_id(NotificationType.CAPSULE_EMPTY, capsule.id),
        type=NotificationType.CAPSULE_EMPTY,
        created_at=capsule.unlock_date,
        family_id=capsule.family_id,
        capsule_id=capsule.id,
    )


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


# Reading ---------------------------------------------------------------------------


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
