"""The push worker: it runs in every server process and sends each
notification to its person's devices, once per device, however many run.

The notification is the outbox: `notifications.write` puts every note in the
push outbox (GSI1 `PUSH_OUTBOX`) in the transaction that writes it. A worker
claims up to `BATCH` notes (one of each person's) in one batched claim, reads
what decides their pushes now once for them all (the people's `pushTypes`,
their memberships of the family and whether it is muted, the capsule's status,
their devices), sends to each device not yet pushed to, records each device it
reached on the note (`pushedTo`), and settles each note out of the outbox,
every write conditioned on the note's lease and committed with the others'
(`GroupedWrites`). A process killed
between the claim and a send leaves a lease that runs out: the next claim
sends to the devices not recorded. A push service that answers 429 or 5xx
has the note handed back with `pushRetryAt` (its Retry-After, or a backoff);
404 or 410 (a disabled SNS endpoint) removes the device.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Protocol

from cachetools import TTLCache

from resolvers.adapters.broker import Broker
from resolvers.adapters.sns import NativeMessage, SnsPush
from resolvers.adapters.webpush import Message, Refused, Subscription, WebPushSender
from resolvers.core import caches, leases
from resolvers.core.config import Settings
from resolvers.core.grouped import GroupedWrites
from resolvers.core.leases import Lease
from resolvers.domain import notifications, push
from resolvers.domain.access import READERS
from resolvers.processes.leased import Claim, LeasedQueue, LeaseSpec, cancelling
from store import keys
from store.enums import CapsuleStatus, NotificationType, PushPlatform
from store.items import Capsule, Family, Membership, Notification, PushDevice, User, iso
from store.port import (
    MAX_TRANSACTION_ITEMS,
    Condition,
    ConditionFailed,
    Exists,
    Item,
    Key,
    Table,
    Update,
    all_of,
    eq,
)

log = logging.getLogger("mifamilias.pusher")

# A note is given up after this many rounds of retryable failures.
MAX_ATTEMPTS = 8
# Backoff between rounds when the push service says nothing of when to come back.
FIRST_BACKOFF = timedelta(seconds=2)
MAX_BACKOFF = timedelta(hours=1)
# A Retry-After longer than this is held to it (a note still matters tomorrow;
# a push service asking for a week is not followed that far).
MAX_RETRY_AFTER = timedelta(hours=6)
# A capsule still opening is asked about again this soon.
OPENING_WAIT = timedelta(seconds=5)
# Notes a push worker claims and pushes together (one transaction of claims).
BATCH = MAX_TRANSACTION_ITEMS
# Families and open capsules a process keeps from one batch to the next.
SHARED_ENTRIES = 1024
SHARED_SECONDS = 10.0


@dataclass(frozen=True)
class Tried:
    """One send: what became of it (`Pusher._send`), the push service's HTTP
    status when it answered, and why it failed, if it did."""

    result: str | timedelta
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Reads:
    """What decides a batch of notes' pushes: items by key (people,
    memberships, families, capsules) and each person's devices."""

    items: dict[Key, Item]
    devices: dict[str, list[PushDevice]]


@dataclass
class Sent:
    """What one round of sends did."""

    delivered: list[PushDevice]
    gone: list[PushDevice]
    retry_after: timedelta | None = None  # the longest a push service asked for
    failed: bool = False  # a retryable failure without a Retry-After


def retry_delay(value: str | None, now: datetime) -> timedelta | None:
    """Retry-After as seconds or an HTTP date (RFC 9110 10.2.3); None if absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return min(timedelta(seconds=int(text)), MAX_RETRY_AFTER)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(timedelta(0), min(moment - now, MAX_RETRY_AFTER))


def backoff(attempt: int) -> timedelta:
    """Exponential with jitter: 2 s, 4 s, 8 s ... up to an hour."""
    base: timedelta = min(FIRST_BACKOFF * (2 ** max(attempt - 1, 0)), MAX_BACKOFF)
    return base * (0.5 + random.random() / 2)


class Held(Protocol):
    """The lease a handler works under."""

    def held(self) -> Condition: ...

    def finish(self, update: Update) -> Update: ...


class Pusher:
    def __init__(
        self,
        *,
        table: Table,
        settings: Settings,
        clock: Callable[[], datetime],
        web: WebPushSender | None,
        native: SnsPush | None,
    ) -> None:
        self.table = table
        self.settings = settings
        self.clock = clock
        self.web = web
        self.native = native
        self.writes = GroupedWrites(table)
        # Families and open capsules read just now: the same for every note of
        # an opening, read once for them all, whichever batch a note is in.
        self._shared: TTLCache[Key, Item] = caches.lru_for(SHARED_ENTRIES, SHARED_SECONDS)

    # Notes -------------------------------------------------------------------------------

    async def handle(self, item: Item, lease: Held) -> None:
        """Pushes one claimed note (`handle_many` of one)."""
        await self.handle_many([(item, lease)])

    async def handle_many(self, claimed: Sequence[tuple[Item, Held]]) -> None:
        """Pushes claimed notes, of as many people: what decides them is read
        once for them all (`_read`), then each is pushed and settled on its
        own, every write to it conditioned on still holding its lease, the
        last one letting go of it. Their writes are committed together
        (`GroupedWrites`); one note's failure is its own."""
        now = self.clock()
        notes = [(Notification.from_item(item), item, lease) for item, lease in claimed]
        reads = await self._read([note for note, _, _ in notes])

        async def one(note: Notification, item: Item, lease: Held) -> None:
            try:
                await self._push(note, item, lease, reads, now)
            except ConditionFailed:
                log.warning("push of %s: its lease ran out while it was sent", note.user_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                if cancelling():
                    raise
                log.exception("push of a note of %s failed", note.user_id)

        await asyncio.gather(*(one(*found) for found in notes))

    async def _read(self, notes: Sequence[Notification]) -> Reads:
        """What decides the notes' pushes, in one batch read and one query per
        person: their people, memberships and devices; their families and
        capsules, the same for all the notes of an opening, only where this
        process has not read them just now (`_shared`)."""
        wanted: list[Key] = []
        shared: list[Key] = []
        families: set[Key] = set()
        for note in notes:
            wanted.append(keys.user(note.user_id))
            if note.family_id:
                wanted.append(keys.member(note.family_id, note.user_id))
                families.add(keys.family(note.family_id))
                shared.append(keys.family(note.family_id))
            if note.capsule_id:
                shared.append(keys.capsule(note.capsule_id))
        known = {key: item for key in dict.fromkeys(shared) if (item := self._shared.get(key)) is not None}
        wanted += [key for key in dict.fromkeys(shared) if key not in known]
        people = list(dict.fromkeys(note.user_id for note in notes))
        found, devices = await asyncio.gather(
            self.table.batch_get(list(dict.fromkeys(wanted))),
            asyncio.gather(*(push.devices_of(self.table, person) for person in people)),
        )
        for key in shared:
            item = found.get(key)
            if item is not None and (key in families or _open(item)):
                # A family's name is what a push says of it, and an open capsule
                # stays open: seconds old is as good as new for the notes to come.
                self._shared[key] = item
        return Reads({**known, **found}, dict(zip(people, devices, strict=True)))

    async def _push(self, note: Notification, item: Item, lease: Held, reads: Reads, now: datetime) -> None:
        finish = lease.finish
        user_item = reads.items.get(keys.user(note.user_id))
        member_item = reads.items.get(keys.member(note.family_id, note.user_id)) if note.family_id else None
        family_item = reads.items.get(keys.family(note.family_id)) if note.family_id else None
        devices = reads.devices.get(note.user_id, [])
        if note.type == NotificationType.CAPSULE_UNLOCKED:
            capsule_item = reads.items.get(keys.capsule(note.capsule_id)) if note.capsule_id else None
            capsule = Capsule.from_item(capsule_item) if capsule_item else None
            if capsule is not None and capsule.status == CapsuleStatus.UNLOCKING:
                # Its notes are written just before it opens: nothing is said of
                # a capsule until it has.
                await self.writes.update(finish(self._later(note, item, now + OPENING_WAIT, count=False)))
                return
            if capsule is None or capsule.status not in (CapsuleStatus.AVAILABLE, CapsuleStatus.ARCHIVED):
                await self.writes.update(finish(self._settled(note, "skipped")))
                return
        if not self._wanted(note, user_item, member_item, now) or not devices:
            await self.writes.update(finish(self._settled(note, "skipped")))
            return
        family_name = Family.from_item(family_item).name if family_item else None
        said = push.push_for(note, notifications.public_id(note), family_name)
        pending = [d for d in devices if d.id not in note.pushed_to]
        reached = list(note.pushed_to)
        recording = asyncio.Lock()

        async def record(device: PushDevice, alone: bool) -> None:
            # Each device as soon as it is reached, while other sends of the note
            # are still out: a process killed after this leaves the next claim to
            # the devices not reached yet. The last one reached is recorded by
            # the settling write itself.
            async with recording:
                reached.append(device.id)
                if alone:
                    await self.writes.update(
                        Update(
                            note.key,
                            set={"pushedTo": list(reached)},
                            condition=all_of(Exists(), lease.held()),
                        )
                    )

        sent = await self._send_all(pending, said, now, record)
        attempts = int(item.get("pushAttempts", 0)) + 1
        if (sent.retry_after is not None or sent.failed) and attempts < MAX_ATTEMPTS:
            wait = sent.retry_after if sent.retry_after is not None else backoff(attempts)
            later = self._later(note, item, now + wait, count=True, pushed_to=reached)
            await self.writes.update(finish(later))
            return
        await self.writes.update(finish(self._settled(note, "sent", pushed_to=reached)))

    def _wanted(
        self, note: Notification, user_item: Item | None, member_item: Item | None, now: datetime
    ) -> bool:
        """Decided at send time: the person wants this kind pushed, still reads
        the family, and has not muted it."""
        if user_item is None:
            return False
        if note.type not in push.push_types_of(User.from_item(user_item)):
            return False
        if note.family_id is None:
            return True
        if member_item is None:
            return False
        membership = Membership.from_item(member_item)
        return membership.role in READERS and not push.muted(membership, now)

    def _settled(self, note: Notification, state: str, pushed_to: Sequence[str] | None = None) -> Update:
        """Out of the push outbox for good."""
        changes: dict[str, object] = {"pushState": state}
        if pushed_to is not None:
            changes["pushedTo"] = list(pushed_to)
        return Update(note.key, set=changes, remove=["GSI1PK", "GSI1SK", "pushRetryAt"], condition=Exists())

    def _later(
        self,
        note: Notification,
        item: Item,
        at: datetime,
        *,
        count: bool,
        pushed_to: Sequence[str] | None = None,
    ) -> Update:
        changes: dict[str, object] = {"pushRetryAt": iso(at)}
        if pushed_to is not None:
            changes["pushedTo"] = list(pushed_to)
        return Update(note.key, set=changes, add={"pushAttempts": 1} if count else {}, condition=Exists())

    # Sending -------------------------------------------------------------------------

    async def _send_all(
        self,
        devices: Sequence[PushDevice],
        said: push.Push,
        now: datetime,
        record: Callable[[PushDevice, bool], Awaitable[None]],
    ) -> Sent:
        sent = Sent([], [])
        live = [device for device in devices if device.gone_at is None]
        out = len(live)

        async def one(device: PushDevice) -> str | timedelta:
            nonlocal out
            tried = await self._send(device, said, now)
            out -= 1
            if tried.result in ("delivered", "collapsed"):
                await record(device, out > 0)
            elif tried.result != "gone":
                await self._tried(device, tried, now)  # what a developer looking at the device sees
            return tried.result

        results = await asyncio.gather(*(one(device) for device in live))
        for device, result in zip(live, results, strict=True):
            if result == "delivered" or result == "collapsed":
                sent.delivered.append(device)
            elif result == "gone":
                sent.gone.append(device)
            elif isinstance(result, timedelta):
                sent.retry_after = max(sent.retry_after or timedelta(0), result)
            elif result == "retry":
                sent.failed = True
        return sent

    async def _send(self, device: PushDevice, said: push.Push, now: datetime) -> Tried:
        """One of "delivered", "collapsed", "gone", "retry", "refused", or how
        long the push service asked to wait; with what the push service said."""
        recently = iso(now - timedelta(seconds=push.COLLAPSE_SECONDS))
        if said.collapse and device.last_topic == said.collapse and (device.last_topic_at or "") > recently:
            return Tried("collapsed")  # a push of this topic reached it within the minute
        try:
            if device.platform == PushPlatform.WEB:
                tried = await self._send_web(device, said, now)
            else:
                tried = await self._send_native(device, said)
        except Exception as error:
            log.exception("push to device %s of %s failed", device.id, device.user_id)
            return Tried("retry", error=f"the push could not be sent: {type(error).__name__}")
        if tried.result == "delivered":
            await self._pushed(device, said, now, tried.status)
        elif tried.result == "gone":
            await self._forget(device, tried, now)
        return tried

    async def _send_web(self, device: PushDevice, said: push.Push, now: datetime) -> Tried:
        if self.web is None or not (device.endpoint and device.p256dh and device.auth):
            return Tried("refused", error="Web Push is off on this server")
        subscription = Subscription(device.endpoint, device.p256dh, device.auth)
        message = Message(said.web_payload(), ttl=said.ttl, urgency=said.urgency, topic=said.collapse)
        try:
            outcome = await self.web.send(subscription, message)
        except Refused as error:
            # The host now resolves somewhere it may not go: not sent, and not
            # tried again for this note (the device stays; it may come back).
            log.warning("push endpoint of device %s refused at send: %s", device.id, error)
            return Tried("refused", error=f"the endpoint {error}")
        if outcome.delivered:
            return Tried("delivered", outcome.status)
        if outcome.gone:
            return Tried("gone", outcome.status, "the push service says this subscription is gone")
        if outcome.retryable:
            wait = retry_delay(outcome.retry_after, now)
            reason = f"the push service answered {outcome.status}; tried again later"
            return Tried(wait if wait is not None else "retry", outcome.status, reason)
        log.warning("push service answered %s for device %s: not retried", outcome.status, device.id)
        return Tried("refused", outcome.status, f"the push service refused it ({outcome.status})")

    async def _send_native(self, device: PushDevice, said: push.Push) -> Tried:
        if self.native is None or not device.sns_endpoint_arn or not self.native.configured(device.platform):
            return Tried("refused", error="native push is not configured on this server")
        message = NativeMessage(
            title=said.title,
            body=said.body,
            data={"id": said.id, "type": said.type, "familyId": said.family_id},
            collapse=said.collapse,
            high=said.urgency == "high",
            ttl=said.ttl,
        )
        outcome = await self.native.publish(device.platform, device.sns_endpoint_arn, message)
        if outcome.delivered:
            return Tried("delivered")
        if outcome.gone:
            return Tried(
                "gone", error="SNS disabled or deleted the endpoint (its platform refused the token)"
            )
        if outcome.retryable:
            return Tried("retry", error="SNS did not take it; tried again later")
        return Tried("refused", error="SNS refused it")

    async def _pushed(self, device: PushDevice, said: push.Push, now: datetime, status: int | None) -> None:
        changes: dict[str, object] = {
            "lastPushedAt": iso(now),
            "lastDeliveryAt": iso(now),
            "lastDeliveryStatus": status,
            "lastDeliveryError": None,
        }
        if said.collapse:
            changes.update({"lastTopic": said.collapse, "lastTopicAt": iso(now)})
        try:
            await self.writes.update(Update(device.key, set=changes, condition=Exists()))
        except Exception:
            log.debug("device %s went while it was pushed to", device.id)

    async def _tried(self, device: PushDevice, tried: Tried, now: datetime) -> None:
        """A push that did not reach the device: its status and reason, on the
        device (a write only when a push fails)."""
        changes = {
            "lastDeliveryAt": iso(now),
            "lastDeliveryStatus": tried.status,
            "lastDeliveryError": tried.error,
        }
        try:
            await self.writes.update(Update(device.key, set=changes, condition=Exists()))
        except Exception:
            log.debug("device %s went while it was pushed to", device.id)

    async def _forget(self, device: PushDevice, tried: Tried, now: datetime) -> None:
        """Its push service let it go: kept, marked gone and no longer pushed
        to, so its owner sees why; its SNS endpoint is deleted. Registering it
        again (a new subscription, the app's token again) brings it back."""
        log.info("push device %s of %s is gone at its push service", device.id, device.user_id)
        changes: dict[str, object] = {
            "goneAt": iso(now),
            "lastDeliveryAt": iso(now),
            "lastDeliveryStatus": tried.status,
            "lastDeliveryError": f"{tried.error}: it must be registered again",
            "snsEndpointArn": None,
        }
        try:
            await self.table.update(Update(device.key, set=changes, condition=Exists()))
        except ConditionFailed:
            return  # unregistered meanwhile
        if self.native is not None and device.sns_endpoint_arn:
            await self.native.forget(device.sns_endpoint_arn)


def _open(item: Item) -> bool:
    return item.get("type") == Capsule.item_type() and Capsule.from_item(item).status in (
        CapsuleStatus.AVAILABLE,
        CapsuleStatus.ARCHIVED,
    )


# Running ---------------------------------------------------------------------------------


def _not_waiting(item: Item, now: datetime) -> bool:
    """A note of the outbox is due unless it waits for a retry."""
    return str(item.get("pushRetryAt") or "") <= iso(now)


# What a worker may claim: a note still in the push outbox (on GSI1), not
# waiting for a retry.
SPEC = LeaseSpec(
    "push",
    claimable=eq("GSI1PK", keys.PUSH_OUTBOX_PK),
    recover_from=keys.PUSH_OUTBOX_PK,
    recover_index="GSI1",
    due=_not_waiting,
)


@dataclass(frozen=True)
class Holding:
    """The lease of one claimed note, as the `Pusher` uses it."""

    lease: Lease

    def held(self) -> Condition:
        return self.lease.held()

    def finish(self, update: Update) -> Update:
        """The note's last write: it lets go of the lease, if still ours."""
        return Update(
            update.key,
            set={**update.set, **leases.CLEARED},
            remove=update.remove,
            add=update.add,
            condition=all_of(update.condition, self.held()) if update.condition else self.held(),
        )


class PushQueue:
    """The push worker of one process: a leased queue of notes (the one
    leased-worker primitive), fed by the broker's word of new notes and by a
    scan of the push outbox (GSI1) for the rest: a process that died, a queue
    that was full, a note handed back for later."""

    def __init__(
        self,
        pusher: Pusher,
        *,
        table: Table,
        broker: Broker | None,
        clock: Callable[[], datetime],
        lease: timedelta,
        workers: int,
        queue_size: int = 10_000,
        batch: int = BATCH,
    ) -> None:
        self.pusher = pusher
        self.table = table
        self.broker = broker
        self.clock = clock
        self.jobs = LeasedQueue(
            SPEC,
            table=table,
            clock=clock,
            lease=lease,
            handle_many=self._handle_many,
            batch=batch,
            workers=workers,
            queue_size=queue_size,
        )
        self.queue = self.jobs.queue
        self._listener: asyncio.Task[None] | None = None
        self._running = False

    @property
    def owner(self) -> str:
        return self.jobs.owner

    def submit(self, key: Key) -> None:
        self.jobs.submit(key)

    async def start(self) -> None:
        self._running = True
        await self.jobs.start()
        if self.broker is not None and self._listener is None:
            self._listener = asyncio.create_task(self._listen(self.broker), name="push-listener")

    async def stop(self) -> None:
        self._running = False
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
            self._listener = None
        await self.jobs.stop()
        await self.pusher.writes.stop()

    async def _listen(self, broker: Broker) -> None:
        async with broker.subscribe(notifications.PUSH_CHANNEL) as events:
            async for event in events:
                for user, created_at, note_id in event.get("notes", []):
                    self.submit(keys.notification(user, created_at, note_id))

    async def _handle_many(self, claims: list[Claim]) -> None:
        await self.pusher.handle_many([(claim.item, Holding(claim.lease)) for claim in claims])

    async def run(self, key: Key) -> bool:
        return await self.jobs.run(key)

    async def due(self) -> list[Key]:
        """The notes of the push outbox that no live lease holds and that are
        not waiting for a retry."""
        return await self.jobs.due()

    async def recover(self) -> int:
        """Queues what is due; nothing while stopped (its workers would not run it)."""
        if not self._running:
            return 0
        return await self.jobs.recover()
