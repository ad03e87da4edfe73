"""Live events for subscriptions. Events carry ids; each subscriber re-reads
what it is told about with fresh loaders and its own authorization, so a
member removed from a family stops receiving that family's events.

The person-addressed streams can resume: every event a person receives is one
of their notifications (a capsule's opening is their CAPSULE_UNLOCKED
notification, whose id is derived from the capsule and the person), so the
event id is that notification's id, the same on every process and after a
restart. With `after`, a stream subscribes to its channel first, then reads the
viewer's notifications newer than `after` from the table and sends them oldest
first, then goes on live; what the replay sent is dropped when it also comes
live, so there is neither a gap nor a duplicate at the seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar, cast

from resolvers.adapters.broker import RESYNC, content_channel, user_channel
from resolvers.core.context import Context, utc_now
from resolvers.core.errors import BadInput, NotFound, RateLimited
from resolvers.core.ports import Event, EventBus, Held, SharedReads
from resolvers.domain import access, notifications
from resolvers.domain import content as content_resolvers
from resolvers.domain.notifications import notification_id
from store import keys
from store.enums import NotificationType
from store.items import Capsule, Content, Family, Membership, Notification, iso
from store.port import Item, Key, SortKey, all_items, every_item

log = logging.getLogger("mifamilias.live")

T = TypeVar("T")
RESYNC_KIND = RESYNC["kind"]


# Charges one event of a stream: its actual cost when it is known before the
# event is sent (a class's shared result), else its estimate (`HeldStream.charge`).
Charge = Callable[[int | None], Awaitable[None]]


class HeldStream(Generic[T]):
    """A subscription's events while it holds one of its person's slots
    (`RateLimiter.streams`): each event delivered, replayed or live, is charged
    `cost` points of the person's budget first (what `events` yields, here;
    what it delivers itself, through the `charge` it is given); the slot is
    given back when the stream ends or is closed, iterated or not. What it
    yields is executed for this subscriber alone: counted by `name`, and
    charged its estimate until it has run, then its actual cost (`settle`).
    The stream an event came from is `delivering` where it is executed."""

    def __init__(
        self,
        ctx: Context,
        events: Callable[[Charge], AsyncIterator[T]],
        slot: Key,
        subject: str,
        cost: int,
        name: str,
    ) -> None:
        self.ctx = ctx
        self.slot = slot
        self.subject = subject
        self.cost = cost
        self.name = name
        self.closed = False
        self.events = events(self.charge)

    def __aiter__(self) -> HeldStream[T]:
        return self

    async def charge(self, actual: int | None = None) -> None:
        rates = self.ctx.services.rates
        cost = self.cost if actual is None else max(1, actual)
        await rates.budget.charge_delivery(self.subject, cost, self.ctx.services.now())

    @property
    def budgeted(self) -> bool:
        """Whether its events are charged at all (a budget is on)."""
        return self.ctx.services.rates.budget.enabled

    def settle(self, actual: int) -> None:
        """The last event yielded ran and cost `actual`: what it was charged
        beyond that comes off the person's next charge."""
        self.ctx.services.rates.budget.credit(self.subject, self.cost - max(1, actual))

    async def __anext__(self) -> T:
        try:
            event = await anext(self.events)
            await self.charge()
        except BaseException:
            await self.aclose()
            raise
        self.ctx.services.metrics.executed(self.name)
        delivering.set(self)
        return event

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            rates = self.ctx.services.rates
            rates.budget.settle_credit(self.subject, self.ctx.services.now())
            await rates.streams.release(self.slot)


# The stream whose event is being executed, in the task that executes it: the
# schema settles the event's charge by its result (`HeldStream.settle`).
delivering: ContextVar[HeldStream[Any] | None] = ContextVar("delivering", default=None)


async def held(
    ctx: Context, events: Callable[[Charge], AsyncIterator[T]], cost: int, name: str
) -> HeldStream[T]:
    """`events(charge)` as the stream of subscription field `name`, holding a
    slot of the viewer's; RATE_LIMITED (before anything is subscribed) when
    they have every slot."""
    subject = f"user:{await ctx.viewer_id()}"
    slot = await ctx.services.rates.streams.hold(subject)
    return HeldStream(ctx, events, slot, subject, cost, name)


def _broker(ctx: Context) -> EventBus:
    return ctx.services.broker


def _slot(ctx: Context) -> asyncio.Semaphore:
    return ctx.services.event_reads.slots


def _refresh(ctx: Context) -> None:
    # The connection's context outlives one event; its cache must not.
    ctx.forget_loaders()


# What a subscriber's rights on an event's record depend on, beside the event
# itself: subscribers whose `share` is equal see the same answer to the same
# document (schema.multiplex executes it once for them).
Share = tuple[str | bool | None, ...]


async def content_status(
    ctx: Context, content_id: str, frames: ClassFrames | None = None, charge: Charge | None = None
) -> AsyncGenerator[tuple[Content, Share | None], None]:
    """The content as it is now, then again at every status change; with each
    change, what the viewer's rights on it depend on. With `frames` and the
    stream's `charge`, a change that comes while the stream waits may be sent
    as its class's frame from the change's turn (`_StatusChange`), and never
    yielded here."""
    with ctx.services.metrics.subscription("contentStatusChanged"):
        viewer = await ctx.viewer_id()
        stream = _StatusReceiver(ctx, viewer, content_id, frames, charge)
        receiver = stream if frames is not None and charge is not None else None
        # Subscribed before the first read: a move committed between the two
        # is heard, where the other order would miss it for good.
        async with _broker(ctx).subscribe(content_channel(content_id), receiver) as events:
            content, _ = await content_resolvers.readable_content(ctx, content_id)
            yield content, None
            stream.last = content.status
            async for event in events:
                if event.get("kind") == RESYNC_KIND:
                    event = {}  # events may have been missed: the status as it is now
                async with _slot(ctx):
                    _refresh(ctx)
                    if event.get("eventId"):
                        shared = await _content_reads(ctx, content_id, str(event["eventId"]))
                        if shared is not None:
                            _prime_content(ctx, shared, viewer)
                    try:
                        content, membership = await content_resolvers.readable_content(ctx, content_id)
                    except NotFound:
                        if await content_resolvers.load_content(ctx, content_id) is None:
                            return  # deleted: the stream ends
                        continue  # no longer theirs to see
                moved = stream.moved(event, content, membership)
                if moved is not None:
                    stream.last = moved[0].status
                    yield moved


@dataclass(frozen=True)
class UnlockedReads:
    capsule: Item
    # Decoded once for every subscriber: a capsule for a whole family carries
    # a thousand recipients, and records are immutable.
    record: Capsule
    content: Item | None
    members: dict[str, Item]  # membership items by user id
    notes: dict[str, Item]  # each person's CAPSULE_UNLOCKED notification, by user id
    # Whose membership and note were read: the people told of the opening whom
    # this process held a stream for then. With the streams spread over many
    # processes, each reads its own share of a family's thousand, not all of it.
    read_for: frozenset[str]

    def covers(self, viewer: str) -> bool:
        """Whether what was read decides for `viewer`: read for them, or not
        one of the people told of the opening (who hear nothing of it)."""
        capsule = self.record
        return viewer in self.read_for or not (capsule.receives(viewer) or viewer == capsule.creator_id)


class EventReads:
    """One store read per event, shared by every subscriber it wakes in this
    process: an unlock wakes all its recipients at once, and each would
    otherwise read the same capsule, content and family. Authorization stays
    per subscriber, on what was read."""

    TTL_SECONDS = 10.0
    # Subscribers reading for an event at once, in this process. One event can
    # wake ten thousand; each holds a slot for its reads, so the store sees a
    # few dozen of them at a time and everything else (health checks,
    # requests) keeps its turn. A slot is never held while the answer is
    # yielded: that waits for the subscriber's own connection, which may be a
    # client that stopped reading (schema.backpressure).
    SLOTS = 64

    def __init__(self) -> None:
        self._reads: dict[tuple[str, ...], tuple[float, asyncio.Future[Any]]] = {}
        self._gatherings: dict[tuple[str, ...], object] = {}
        self.slots = asyncio.Semaphore(self.SLOTS)

    def gathering(self, key: tuple[str, ...], start: Callable[[], T]) -> T:
        found = self._gatherings.get(key)
        if found is None:
            found = self._gatherings[key] = start()
        return cast(T, found)

    def closed(self, key: tuple[str, ...]) -> None:
        self._gatherings.pop(key, None)

    async def read(self, key: tuple[str, ...], load: Callable[[], Awaitable[T]]) -> T:
        """What `load` answers, read once for every caller with the same `key`
        within `TTL_SECONDS`."""
        now = time.monotonic()
        if len(self._reads) > 1000:
            self._reads = {k: v for k, v in self._reads.items() if v[0] > now}
        cached = self._reads.get(key)
        if cached is None or cached[0] <= now:
            cached = (now + self.TTL_SECONDS, asyncio.ensure_future(load()))
            self._reads[key] = cached
        return cast(T, await asyncio.shield(cached[1]))


def _event_reads(ctx: Context) -> SharedReads:
    return ctx.services.event_reads


@dataclass(frozen=True)
class Opened:
    """A capsule's opening as one subscriber receives it."""

    capsule: Capsule
    note: Notification | None  # the viewer's notification of it: its public id is the event's
    share: Share
    reads: UnlockedReads
    viewer: str

    def prime(self, ctx: Context) -> None:
        """The subscriber's loaders hold what was read for everyone, for an
        execution of the event's document: the capsule, its content, and this
        subscriber's own membership (or its absence, which the rule needs too).
        A subscriber whose class's answer is sent as its frame executes
        nothing, and makes no loaders."""
        for item in (self.reads.capsule, self.reads.content):
            if item is not None:
                ctx.loaders.remember(item)
        ctx.loaders.item.prime(
            keys.member(self.capsule.family_id, self.viewer), self.reads.members.get(self.viewer)
        )


async def _unlocked_capsule(ctx: Context, event: dict[str, object], viewer: str) -> Opened | None:
    """The capsule an event names if this viewer may read it, with the viewer's
    notification of its opening (whose public id is the event's id)."""
    capsule_id, unlocked_at = str(event["capsuleId"]), str(event["unlockedAt"])
    if not keys.usable_id(capsule_id) or not keys.usable_id(unlocked_at):
        return None
    shared = await _unlocked_reads(ctx, capsule_id, unlocked_at)
    if shared is None:
        return None
    if not shared.covers(viewer):
        shared = await _read_for_viewer(ctx, shared, unlocked_at, viewer)
    return _opened(shared, unlocked_at, viewer)


async def _unlocked_reads(ctx: Context, capsule_id: str, unlocked_at: str) -> UnlockedReads | None:
    """What an opening's subscribers read, once for all of them in this process."""

    async def load() -> UnlockedReads | None:
        capsule = await ctx.table.get(keys.capsule(capsule_id))
        if capsule is None:
            return None
        # Only the people this event can wake (the recipients and the creator),
        # and of them those with a stream here: the others' events go to
        # other processes. A stream that starts later reads for itself.
        broker = ctx.services.broker
        people = frozenset(
            person
            for person in (*capsule.get("recipientIds", ()), capsule["creatorId"])
            if broker.subscriber_count(user_channel(person, "capsules"))
        )
        wanted = _viewer_keys(capsule["familyId"], capsule_id, unlocked_at, people)
        if capsule.get("contentId"):
            wanted.append(keys.content(capsule["contentId"]))
        found = await ctx.table.batch_get(wanted)
        content = found.pop(keys.content(capsule["contentId"]), None) if capsule.get("contentId") else None
        members, notes = _by_person(found.values())
        return UnlockedReads(capsule, Capsule.from_item(capsule), content, members, notes, people)

    return await _event_reads(ctx).read(("capsule", capsule_id, unlocked_at), load)


def _viewer_keys(family_id: str, capsule_id: str, unlocked_at: str, people: Iterable[str]) -> list[Key]:
    """Each person's membership and notification of the opening."""
    return [
        key
        for person in people
        for key in (
            keys.member(family_id, person),
            keys.notification(person, unlocked_at, capsule_event_id(capsule_id, person)),
        )
    ]


def _by_person(items: Iterable[Item]) -> tuple[dict[str, Item], dict[str, Item]]:
    members = {item["userId"]: item for item in items if item.get("type") == "Membership"}
    notes = {item["userId"]: item for item in items if item.get("type") == "Notification"}
    return members, notes


async def _read_for_viewer(
    ctx: Context, shared: UnlockedReads, unlocked_at: str, viewer: str
) -> UnlockedReads:
    """The opening's reads with the viewer's own membership and note, for a
    stream that was not here when they were read for everyone."""
    capsule = shared.record
    found = await ctx.table.batch_get(_viewer_keys(capsule.family_id, capsule.id, unlocked_at, (viewer,)))
    members, notes = _by_person(found.values())
    return replace(shared, members=members, notes=notes, read_for=frozenset((viewer,)))


def _opened(shared: UnlockedReads, unlocked_at: str, viewer: str) -> Opened | None:
    """The opening as this viewer receives it, decided from what was read for everyone."""
    capsule = shared.record
    member = shared.members.get(viewer)
    # The one read rule for a capsule (what `access.may_read` decides for one),
    # from this subscriber's membership as it was read for everyone: deciding
    # through the loaders cost more than the rest of a subscriber's delivery.
    if not access.capsule_readable(capsule, viewer, Membership.from_item(member) if member else None):
        return None
    note = shared.notes.get(viewer)
    share = (
        "capsule",
        capsule.id,
        unlocked_at,
        member.get("role") if member else None,
        viewer == capsule.creator_id,
        capsule.receives(viewer),
        viewer == (shared.content or {}).get("authorId"),
    )
    told = Notification.from_item(note) if note is not None else None
    return Opened(capsule, told, share, shared, viewer)


@dataclass(frozen=True)
class ContentReads:
    """What deciding on a content's status change reads, once for every subscriber."""

    content: Item
    family: Item | None
    members: dict[str, Item]  # the family's memberships, by user id
    # Decoded once for every subscriber of the change's turn.
    record: Content
    family_record: Family | None


async def _content_reads(ctx: Context, content_id: str, event_id: str) -> ContentReads | None:
    """One read of the content, its family and the family's memberships, shared
    by every subscriber of this change in this process (one change can reach
    thousands; the family has at most `MAX_MEMBERS`); None when the content is gone."""

    async def load() -> ContentReads | None:
        content = await ctx.table.get(keys.content(content_id))
        if content is None:
            return None
        family_id = str(content["familyId"])
        family, members = await asyncio.gather(
            ctx.table.get(keys.family(family_id)),
            all_items(ctx.table, keys.family_pk(family_id), SortKey.begins_with(keys.MEMBER_PREFIX)),
        )
        return ContentReads(
            content,
            family,
            {str(item["userId"]): item for item in members},
            Content.from_item(content),
            Family.from_item(family) if family is not None else None,
        )

    return await _event_reads(ctx).read(("content", content_id, event_id), load)


def _prime_content(ctx: Context, shared: ContentReads, viewer: str) -> None:
    """The subscriber's loaders hold what the change read for everyone, so
    the one read rule decides from the cache."""
    family_id = shared.record.family_id
    ctx.loaders.remember(shared.content)
    ctx.loaders.item.prime(keys.family(family_id), shared.family)
    # This subscriber's own membership, or its absence: the rule needs either.
    ctx.loaders.item.prime(keys.member(family_id, viewer), shared.members.get(viewer))


class _StatusReceiver:
    """A contentStatusChanged stream's place (the status it last reported),
    and its part in a `_StatusChange`: what its own loop does for a change,
    done from the change's turn, charged to its budget as its own event."""

    __slots__ = ("charge", "content_id", "ctx", "frames", "last", "turn", "viewer")

    def __init__(
        self, ctx: Context, viewer: str, content_id: str, frames: ClassFrames | None, charge: Charge | None
    ) -> None:
        self.ctx = ctx
        self.viewer = viewer
        self.content_id = content_id
        self.frames = frames
        self.charge = charge
        self.last: str | None = None  # until the first event is yielded
        self.turn: _StatusChange | None = None  # the turn holding its inbox

    def moved(self, event: Event, content: Content, membership: Membership) -> tuple[Content, Share] | None:
        """The content as this stream reports the event, and its share; None
        when the status it last reported stands. `last` moves once the
        report is made (yielded, or sent from a turn), not here.

        A move from the status last reported is reported as the event says,
        though the content may have moved on while it travelled, so that every
        state is seen in order. Any other event came before the first read,
        or after missed ones: the status as it is now says where the content is."""
        status = str(event["status"]) if event.get("was") == self.last else content.status
        if status == self.last:
            return None
        share = ("content", content.id, status, membership.role, self.viewer == content.author_id)
        return replace(content, status=status), share

    def offer(self, event: Event, inbox: Held) -> bool:
        event_id = event.get("eventId")
        if event.get("kind") != "content" or not event_id or self.last is None:
            return False
        key = ("status", self.content_id, str(event_id))
        turn = _event_reads(self.ctx).gathering(key, lambda: _StatusChange(self.ctx, key, event))
        turn.members.append((self, inbox))
        self.turn = turn
        return True

    async def deliver(self, turn: _StatusChange, shared: ContentReads, inbox: Held) -> None:
        """Sends the change as the class's frame, charged; whatever this
        cannot decide or send goes back to the stream, which does it the
        ordinary way (a content no longer readable, a refused charge, a
        client not reading)."""
        given_back: Event | None = turn.event
        try:
            content = shared.record
            member = shared.members.get(self.viewer)
            membership = Membership.from_item(member) if member is not None else None
            if membership is None or not access.content_readable(
                content, self.viewer, membership, shared.family_record
            ):
                return
            moved = self.moved(turn.event, content, membership)
            if moved is None:
                given_back = None
                return
            assert self.frames is not None and self.charge is not None  # offered only with both
            lead = Lead(moved, functools.partial(_primed_content, self.ctx, shared, self.viewer))
            if await self.frames.send_shared(moved[1], None, lead, self.charge):
                given_back = None
                self.last = moved[0].status
        except RateLimited:
            pass  # its stream is refused the ordinary way, and ends
        except Exception:
            log.exception("could not send a status change of content %s from its turn", self.content_id)
        finally:
            if self.turn is turn:
                self.turn = None
                inbox.release(given_back)


def _primed_content(ctx: Context, shared: ContentReads, viewer: str) -> None:
    _refresh(ctx)
    _prime_content(ctx, shared, viewer)


# Subscribers a status change's turn sends to at once: their charges are one
# pass of the budget (`RateLimiter.charge_delivery`), one call of its counter.
STATUS_SLICE = 64


class _StatusChange:
    """Every subscriber in this process whose stream waited when one status
    change woke it, in one turn, as `_Opening` does for an opening: the change
    is read once, and each subscriber's part is decided from that read, charged
    and sent as its class's frame, a slice at a time, the slice's charges in
    one pass, without waking the thousands of streams."""

    def __init__(self, ctx: Context, key: tuple[str, str, str], event: Event) -> None:
        self.key = key
        self.event = event
        self.members: list[tuple[_StatusReceiver, Held]] = []
        self.task = asyncio.get_running_loop().create_task(self._run(ctx))

    async def _run(self, ctx: Context) -> None:
        _, content_id, event_id = self.key
        done = 0
        try:
            try:
                async with _slot(ctx):
                    shared = await _content_reads(ctx, content_id, event_id)
            except Exception:
                # Given back: each stream meets the failed read (shared, as
                # it was for them all before the turn) the ordinary way.
                shared = None
            while done < len(self.members):
                part = self.members[done : done + STATUS_SLICE]
                done += len(part)
                if shared is None:  # gone, or not read: each stream decides
                    self._give_back(part)
                    continue
                await asyncio.gather(*(receiver.deliver(self, shared, inbox) for receiver, inbox in part))
        finally:
            _event_reads(ctx).closed(self.key)
            # Those the turn did not get to (it was cancelled), in this slice or after it.
            self._give_back(self.members)

    def _give_back(self, members: Sequence[tuple[_StatusReceiver, Held]]) -> None:
        for receiver, inbox in members:
            if receiver.turn is self:
                receiver.turn = None
                inbox.release(self.event)


# Resuming ---------------------------------------------------------------------

# How far back `after` is looked for: a phone offline for days still finds its
# place; an id older than this asks the client to refetch instead.
REPLAY_LIMIT = 1000
REPLAY_COSTS = 10
# Event ids a stream remembers to drop repeats: at-least-once delivery (a
# recovery pass publishing again) and the replay seam both repeat recent ones.
REMEMBERED = 256
# Ids a resuming client may say it holds: as many as any list in a request's
# variables (schema.cost bounds those before this runs; this bounds a list
# written in the document itself).
RECEIVED_MOST = 100


class Seen:
    """The ids a stream has sent, the most recent `REMEMBERED` of them."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def holding(cls, received: Sequence[str]) -> Seen:
        """A resumed stream's ids, starting with those its client says it holds
        (public ids or stored ones): neither its replay nor a live event sends
        them again. A person's notes are not sent in the order they sort
        (each is dated before its commit), so the replay after the last one a
        client received may hold one it received before it; only the client
        knows which."""
        if len(received) > RECEIVED_MOST:
            raise BadInput(f"received: at most {RECEIVED_MOST} ids, the most recent the stream sent")
        seen = cls()
        for value in received:
            seen.first_time(notifications.stored_id(str(value)))
        return seen

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def first_time(self, event_id: str) -> bool:
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > REMEMBERED:
            self._ids.popitem(last=False)
        return True


async def _notifications_after(
    ctx: Context, viewer: str, after: str, most: int = REPLAY_LIMIT
) -> list[Notification]:
    """The viewer's notifications newer than the one `after` names, oldest
    first; BAD_USER_INPUT when there are more than `most`.

    A notification's public id carries its place (`notifications.public_id`),
    so the read starts right after it; a bare id (from before public ids held
    their place) is looked for among the newest `REPLAY_LIMIT`."""
    pk, prefix = keys.user_pk(viewer), SortKey.begins_with(keys.NOTIFICATION_PREFIX)
    named = notifications.parse_public_id(viewer, after)
    if named is not None:
        # Just after the named sort key (no key continues it below " "), up to
        # the last notification ("~" sorts after every character of a key).
        after_it = SortKey.between(named.key[1] + " ", keys.NOTIFICATION_PREFIX + "~")
        page = await ctx.table.query(pk, after_it, limit=min(most, REPLAY_LIMIT))
        if page.cursor is None:
            return [Notification.from_item(item) for item in page.items]
        raise _too_many(after, min(most, REPLAY_LIMIT))
    newer: list[Notification] = []
    async for item in every_item(ctx.table, pk, prefix, descending=True):
        if item["id"] == after:
            if len(newer) > most:
                raise _too_many(after, most)
            return newer[::-1]
        if len(newer) == REPLAY_LIMIT:
            break
        newer.append(Notification.from_item(item))
    raise BadInput(
        f"after: no event {after!r} among your last {REPLAY_LIMIT} notifications; "
        "subscribe without `after` and refetch what you missed"
    )


class Place:
    """Where a person's stream is in their notifications: the last it sent (or
    its start). When events may have been missed (the broker lost its
    connection, a publish failed: a resync event), the stream reads on from
    here in the table, as `after` does; `Seen` drops what also comes live."""

    def __init__(self, viewer: str) -> None:
        self.viewer = viewer
        self.sort_key = keys.notification(viewer, iso(utc_now()), "")[1]

    def passed(self, created_at: str, note_id: str) -> None:
        self.sort_key = max(self.sort_key, keys.notification(self.viewer, created_at, note_id)[1])

    async def missed(self, ctx: Context) -> list[Notification]:
        """The viewer's notifications after this place, oldest first (the
        newest `REPLAY_LIMIT`; a store failure reads nothing, and is logged)."""
        wanted = SortKey.between(self.sort_key + " ", keys.NOTIFICATION_PREFIX + "~")
        try:
            page = await ctx.table.query(keys.user_pk(self.viewer), wanted, limit=REPLAY_LIMIT)
        except Exception:
            log.exception("could not read what a stream missed")
            return []
        return [Notification.from_item(item) for item in page.items]


@contextlib.asynccontextmanager
async def _replay_turn(ctx: Context, viewer: str, after: str | None) -> AsyncIterator[Callable[[], None]]:
    """With `after`, one of the viewer's replay turns (`RateLimiter.replays`),
    held until the replay is sent: what ends it (called once it is; again
    is nothing). Without, nothing to wait for."""
    if after is None:
        yield _nothing
        return
    give_back = await ctx.services.rates.replays.take(viewer)
    try:
        yield give_back
    finally:
        give_back()


def _nothing() -> None:
    return None


def _too_many(after: str, most: int) -> BadInput:
    return BadInput(
        f"after: more than {most} notifications came since {after!r}, more than a replay of this "
        "subscription may send; subscribe without `after` and refetch what you missed"
    )


def replay_bound(event_cost: int, max_cost: int) -> int:
    """How many events one replay may send: together they may cost at most
    `REPLAY_COSTS` operations at the cost limit (and never more than
    `REPLAY_LIMIT`), so a heavy selection replays few."""
    return max(1, min(REPLAY_LIMIT, REPLAY_COSTS * max_cost // max(1, event_cost)))


def capsule_event_id(capsule_id: str, viewer: str) -> str:
    """A capsule's opening as this viewer's event: their notification's id."""
    return notification_id(NotificationType.CAPSULE_UNLOCKED, capsule_id, viewer)


def _capsule_event(note: Notification) -> dict[str, object]:
    return {"kind": "capsule", "capsuleId": note.capsule_id, "unlockedAt": note.created_at}


# A capsule's opening as `capsules_unlocked` yields it to one subscriber:
# (capsule, unlocked at, event id, share, prime).
Yielded = tuple[Capsule, str, str, Share | None, Callable[[], None]]


@dataclass(frozen=True)
class Lead:
    """What leading a class in an event's turn executes for its first
    subscriber: what that subscriber's stream would yield (but its `prime`),
    once `prime` has readied its loaders."""

    yielded: tuple[Any, ...]
    prime: Callable[[], None]


class ClassFrames(Protocol):
    """How a subscriber's event leaves as its class's frame, encoded once
    (`schema.frames`): the class is what `Share` and the document make it."""

    async def send_shared(
        self, share: Share, event_id: str | None, lead: Lead | None = None, charge: Charge | None = None
    ) -> bool | None:
        """Sends the class's frame with this subscriber's ids, waiting for the
        class's result but never for the client; with `charge`, charged the
        result's cost first. A class with no lead yet is led from `lead` when
        the frames can execute it; None when they cannot; False when the event
        must take the subscriber's ordinary way."""
        ...


# Subscribers an opening's turn sends to between turns of the event loop. More
# than the broker wakes at a time (`DELIVERY_SLICE`): here each is sent its
# class's frame in place, a few dozen microseconds, where a woken stream runs its
# whole event in the turns that follow.
OPENING_SLICE = 64


class _Opening:
    """Every subscriber in this process whose stream waited when one capsule's
    opening woke it, in one turn: the opening is read once, and each
    subscriber's part is decided from that read and sent as its class's frame
    by this turn's task, in order, a slice at a time, without waking the
    thousand streams; the first subscriber of a class nobody leads yet leads
    it here, when its frames can execute its event. Whatever a subscriber's
    part cannot be done here (its class's lead must run the ordinary way, or
    the class's result is not one to share) goes back to its own stream,
    first in its inbox: the ordinary way."""

    def __init__(self, ctx: Context, key: tuple[str, str, str]) -> None:
        self.key = key
        self.members: list[tuple[_OpeningReceiver, Held]] = []
        self.task = asyncio.get_running_loop().create_task(self._run(ctx))

    async def _run(self, ctx: Context) -> None:
        _, capsule_id, unlocked_at = self.key
        event: Event = {"kind": "capsule", "capsuleId": capsule_id, "unlockedAt": unlocked_at}
        done = 0
        try:
            try:
                async with _slot(ctx):
                    shared = await _unlocked_reads(ctx, capsule_id, unlocked_at)
            except Exception:
                # Each stream reads for itself, and logs what failed.
                shared = _FAILED
            while done < len(self.members):
                receiver, inbox = self.members[done]
                done += 1
                if shared is _FAILED:
                    inbox.release(event)
                    continue
                try:
                    leads = await receiver.deliver(shared, event, inbox)
                except Exception:
                    # Given back (`deliver` releases it with the event): its own
                    # stream tries the ordinary way; the others go on here.
                    log.exception("could not send the opening of capsule %s from its turn", capsule_id)
                    leads = False
                if leads or done % OPENING_SLICE == 0:
                    # A lead given back runs first, so its fellows find their class led.
                    await asyncio.sleep(0)
        finally:
            _event_reads(ctx).closed(self.key)
            for _, inbox in self.members[done:]:
                inbox.release(event)


_FAILED: Any = object()


class _OpeningReceiver:
    """A capsuleUnlocked stream's part in an `_Opening`: what its own loop does
    for a live opening (the read rule, the seen ids, its place), done from the
    opening's turn. Its event is not charged to the stream's budget, nor is a
    class's lead when it is led here: an opening is executed once a class for
    all its recipients, a charge would be a write per person in one turn, and
    what openings there are is bounded by their creators' own capsule limit."""

    __slots__ = ("ctx", "frames", "place", "seen", "viewer")

    def __init__(self, ctx: Context, viewer: str, seen: Seen, place: Place, frames: ClassFrames) -> None:
        self.ctx = ctx
        self.viewer = viewer
        self.seen = seen
        self.place = place
        self.frames = frames

    def offer(self, event: Event, inbox: Held) -> bool:
        if event.get("kind") != "capsule":
            return False
        capsule_id, unlocked_at = str(event["capsuleId"]), str(event["unlockedAt"])
        if not keys.usable_id(capsule_id) or not keys.usable_id(unlocked_at):
            return False
        opening = _event_reads(self.ctx).gathering(
            ("opening", capsule_id, unlocked_at),
            lambda: _Opening(self.ctx, ("opening", capsule_id, unlocked_at)),
        )
        opening.members.append((self, inbox))
        return True

    async def deliver(self, shared: UnlockedReads | None, event: Event, inbox: Held) -> bool:
        """Does the stream's part; True when the event went back to the stream
        to lead its class."""
        given_back: Event | None = event
        try:
            if shared is not None and not shared.covers(self.viewer):
                return True  # not read for: its own stream reads for itself
            opened = None if shared is None else _opened(shared, str(event["unlockedAt"]), self.viewer)
            if opened is None:
                given_back = None  # nothing for this viewer, as the stream would decide
                return False
            told = opened.note
            # The note was read by this id: no need to hash it again.
            raw_id = told.id if told is not None else capsule_event_id(opened.capsule.id, self.viewer)
            if raw_id in self.seen:
                given_back = None
                return False
            event_id = notifications.public_id(told) if told is not None else raw_id
            unlocked_at = str(event["unlockedAt"])
            prime = functools.partial(_primed, self.ctx, opened)
            lead = Lead((opened.capsule, unlocked_at, event_id, opened.share), prime)
            sent = await self.frames.send_shared(opened.share, event_id, lead)
            if sent is None:
                return True  # its own stream leads the class
            if sent:
                given_back = None
                self.seen.first_time(raw_id)
                self.place.passed(unlocked_at, raw_id)
            return False
        finally:
            inbox.release(given_back)


def _primed(ctx: Context, opened: Opened) -> None:
    """The subscriber's loaders, fresh, holding what the opening read for
    everyone: as its stream readies them before its event is executed."""
    _refresh(ctx)
    opened.prime(ctx)


async def capsules_unlocked(
    ctx: Context,
    after: str | None = None,
    most: int = REPLAY_LIMIT,
    frames: ClassFrames | None = None,
    received: Sequence[str] = (),
) -> AsyncGenerator[Yielded, None]:
    """(capsule, unlocked at, event id, share, prime) for every capsule the
    viewer may read as it opens; with `after`, first those that opened since
    that event. The event id is the public id of the viewer's notification of
    the opening; `prime()` readies the viewer's loaders before the event's
    document is executed for them (`Opened.prime`). With `frames`, a live
    opening that comes while the stream waits may be sent as its class's frame
    from the opening's turn (`_Opening`), and never yielded here. What the
    client says it has `received` is not sent again (`Seen.holding`)."""
    with ctx.services.metrics.subscription("capsuleUnlocked"):
        viewer = await ctx.viewer_id()
        seen = Seen.holding(received)
        place = Place(viewer)
        receiver = _OpeningReceiver(ctx, viewer, seen, place, frames) if frames is not None else None
        async with (
            _broker(ctx).subscribe(user_channel(viewer, "capsules"), receiver) as events,
            _replay_turn(ctx, viewer, after) as replayed,
        ):
            replay = await _notifications_after(ctx, viewer, after, most) if after is not None else []
            while True:
                for note in replay:
                    place.passed(note.created_at, note.id)
                    if note.type != NotificationType.CAPSULE_UNLOCKED or not note.capsule_id:
                        continue
                    async with _slot(ctx):
                        opened = await _capsule_for(ctx, _capsule_event(note), viewer)
                    if opened is not None and seen.first_time(note.id):
                        # A replay is this subscriber's alone: nothing to share.
                        yield (
                            opened.capsule,
                            note.created_at,
                            notifications.public_id(note),
                            None,
                            functools.partial(opened.prime, ctx),
                        )
                replayed()
                event = await anext(events)
                if event.get("kind") == RESYNC_KIND:
                    replay = await place.missed(ctx)
                    continue
                replay = []
                if event.get("kind") != "capsule":
                    continue
                raw_id = capsule_event_id(str(event["capsuleId"]), viewer)
                if raw_id in seen:
                    continue
                async with _slot(ctx):
                    opened = await _capsule_for(ctx, event, viewer)
                if opened is not None and seen.first_time(raw_id):
                    told = opened.note
                    place.passed(str(event["unlockedAt"]), raw_id)
                    event_id = notifications.public_id(told) if told is not None else raw_id
                    prime = functools.partial(opened.prime, ctx)
                    yield opened.capsule, str(event["unlockedAt"]), event_id, opened.share, prime


async def _capsule_for(ctx: Context, event: dict[str, object], viewer: str) -> Opened | None:
    """The capsule an event names, if this viewer may read it (the caller holds a slot for it)."""
    _refresh(ctx)
    try:
        return await _unlocked_capsule(ctx, event, viewer)
    except Exception:
        # The store failed this read; the notification stays in the table.
        log.exception("could not read capsule %s for a subscriber", event.get("capsuleId"))
        return None


async def notifications_added(
    ctx: Context, after: str | None = None, most: int = REPLAY_LIMIT, received: Sequence[str] = ()
) -> AsyncGenerator[Notification, None]:
    """Every notification addressed to the viewer as it is created; with
    `after`, first those created since that one; none the client says it has
    `received` (`Seen.holding`)."""
    with ctx.services.metrics.subscription("notificationAdded"):
        viewer = await ctx.viewer_id()
        seen = Seen.holding(received)
        place = Place(viewer)
        async with (
            _broker(ctx).subscribe(notifications.channel(viewer)) as events,
            _replay_turn(ctx, viewer, after) as replayed,
        ):
            replay = await _notifications_after(ctx, viewer, after, most) if after is not None else []
            while True:
                for note in replay:
                    place.passed(note.created_at, note.id)
                    if seen.first_time(note.id):
                        yield note
                replayed()
                event = await anext(events)
                if event.get("kind") == RESYNC_KIND:
                    replay = await place.missed(ctx)
                    continue
                replay = []
                if event.get("kind") != "notification" or event.get("userId") != viewer:
                    continue
                if str(event["id"]) in seen:
                    continue
                async with _slot(ctx):
                    _refresh(ctx)
                    item = await ctx.loaders.item.load(
                        keys.notification(viewer, str(event["createdAt"]), str(event["id"]))
                    )
                if item is not None and seen.first_time(str(item["id"])):
                    note = Notification.from_item(item)
                    place.passed(note.created_at, note.id)
                    yield note
