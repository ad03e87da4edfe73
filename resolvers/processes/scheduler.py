"""The unlock scheduler. It runs in every server process; conditional writes
make each capsule's unlock happen exactly once however many run. The shards
are divided between the processes (`resolvers.processes.shards`, a lease per
shard): a process reads, races for and wakes for its own shards only.

One pass:
1. For each day from the checkpoint to today, and each of this process's
   shards, read the entries
   of `UNLOCK#<day>#<shard>` on GSI2 (SCHEDULED, LOCKED, UNLOCKING) due up to
   one poll ahead: the due ones are handled now, the earliest of the others
   says when to wake next (so delivery follows the unlock date, not the poll).
2. LOCKED, in batches taken in a random order: one batch get per batch
   (contents, tag summaries, memberships, and the unread counters and device
   counts the notes need), then for each capsule whose content is READY:
   - a capsule for a few people: one transaction, conditioned on LOCKED (so it
     is the win: a loser's is cancelled), writes one notification per person
     (counted unread, ids derived from the capsule), the recipients'
     `notifiedAt` stamps, makes the capsule AVAILABLE, puts the content in the
     feed, unseals its tags, and writes an outbox item naming who is to be told;
   - a larger one is won first, with a conditional LOCKED -> UNLOCKING (a
     loser skips it), then opened in steps that can each be replayed: the
     notifications in batches of conditional puts and the stamps, then that
     same transaction without them;
   - one whose content is not READY yet is won (UNLOCKING: its date has come)
     and waits.
3. UNLOCKING (won here, or left by a crash): once the content is READY, as
   above, the transaction conditioned on UNLOCKING;
   - the events go out in one batched publish; once a batch's capsules are
     done, their outbox items go in one batch write.
   A process that dies anywhere leaves either an UNLOCKING capsule (taken
   over once abandoned) or an outbox item (published again by the next pass
   on any process): delivery is at least once, and streams drop repeats.
4. SCHEDULED (no content by its date): stays closed; its creator is told once.
5. A past day with nothing left to open moves the checkpoint past it, so a
   server that was down for days catches up without scanning the table. Past
   days are read in every shard, to know that; only this process's are opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import TypeVar

from resolvers.adapters.broker import Broker, user_channel
from resolvers.core.config import Settings
from resolvers.core.leases import Lease
from resolvers.core.metrics import Metrics
from resolvers.core.ports import Event
from resolvers.core.slices import built, in_slices
from resolvers.domain import notifications
from resolvers.domain.access import READERS
from resolvers.domain.tags import unseal_ops
from resolvers.processes.shards import ShardLeases
from store import keys
from store.enums import CapsuleStatus, ContentStatus
from store.items import Capsule, Content, iso, parse_iso
from store.port import (
    ConditionFailed,
    Exists,
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
    all_items,
    any_of,
    eq,
    op_key,
)

log = logging.getLogger("mifamilias.scheduler")
T = TypeVar("T")

CONCURRENCY = 8
FIRST_LOOKBACK_DAYS = 1
# LOCKED capsules a process wins at a time before finishing them: 8 while few
# are due, so that a pass's first openings come soon and processes reading one
# shard (a lease changing hands) interleave their batches; more in a burst, up
# to 64, whose wins, transactions and outbox clearings then share commits on
# the embedded store, and whose reads share batch gets.
CLAIM_BATCH = 8
MAX_CLAIM_BATCH = 64
# Items per write transaction (DynamoDB's limit is 100).
TRANSACTION_ITEMS = 100
# An outbox item this old has lost its publisher (a crash): any pass publishes it.
OUTBOX_GRACE = timedelta(seconds=5)
# How often a process logs its lag (`schedulerLagSeconds`), for the alarm.
LAG_REPORT_SECONDS = 60.0


def claim_batch(due: int) -> int:
    """How many LOCKED capsules a pass wins at a time, `due` being due in it."""
    return max(CLAIM_BATCH, min(MAX_CLAIM_BATCH, due // CLAIM_BATCH))


@dataclass
class PassResult:
    unlocked: int = 0
    waiting: int = 0
    told_empty: int = 0
    failed: int = 0
    # The unlock date of the oldest due capsule this pass left short of AVAILABLE.
    oldest_pending: str | None = None
    # The earliest unlock date seen ahead of now (within a poll): when to wake.
    next_due: str | None = None
    republished: int = 0

    def pending(self, unlock_date: str) -> None:
        if self.oldest_pending is None or unlock_date < self.oldest_pending:
            self.oldest_pending = unlock_date

    def upcoming(self, unlock_date: str) -> None:
        if self.next_due is None or unlock_date < self.next_due:
            self.next_due = unlock_date


@dataclass
class DueReads:
    """What one batch get told a pass about its capsules."""

    contents: dict[str, Content] = field(default_factory=dict)
    readers: dict[str, set[str]] = field(default_factory=dict)  # family -> current MEMBERs and ADMINs
    summaries: dict[str, Item] = field(default_factory=dict)  # content -> its tag summary
    # For capsules that may open in one transaction: each of their people's
    # first unread counter and push device count (`notifications.reads_for_user`),
    # what `notifications.write` would otherwise read in a batch get of its own.
    counts: dict[Key, Item] = field(default_factory=dict)


def everyone(capsule: Capsule) -> list[str]:
    """Whom an opening may tell: its recipients and its creator, once each."""
    return list(dict.fromkeys([*capsule.recipient_ids, capsule.creator_id]))


def may_open_at_once(capsule: Capsule) -> bool:
    """Whether the capsule's notes (one per person, each counted) and its
    recipients' stamps may fit beside its opening in one transaction, within
    `notifications.write`'s bound: those capsules' counts are read in the
    batch get. One whose tags then take the room left opens in steps."""
    return len(everyone(capsule)) + len(capsule.recipient_ids) < notifications.WRITTEN_PER_TRANSACTION


class UnlockScheduler:
    def __init__(
        self,
        *,
        table: Table,
        broker: Broker | None,
        settings: Settings,
        clock: Callable[[], datetime],
        metrics: Metrics | None = None,
    ) -> None:
        self.table = table
        self.metrics = metrics or Metrics.disabled()
        self.broker = broker
        self.clock = clock
        self.shards = settings.unlock_shards
        self.poll = timedelta(seconds=settings.unlock_poll_seconds)
        # How long an UNLOCKING capsule may sit before another process finishes it.
        self.abandoned_after = timedelta(seconds=settings.abandoned_unlock_seconds)
        # Capsules this process won and has not finished yet.
        self._mine: set[str] = set()
        self._next_due: str | None = None
        # Passes completed here: how a caller sees the start-up pass behind it
        # (its reads and opening done) before it counts or opens on its own.
        self.passes = 0
        self._lag_reported = -LAG_REPORT_SECONDS  # the first pass reports
        # A dead process's shards are taken over when its capsules would be:
        # after the time an UNLOCKING capsule is left before it counts as abandoned.
        self.leases = ShardLeases(
            table=table, shards=self.shards, lease=Lease(uuid.uuid4().hex, self.abandoned_after), clock=clock
        )

    async def release(self) -> None:
        """Hands back this process's shards (it stops), for another to read at once."""
        await self.leases.release()

    async def run_once(self) -> PassResult:
        now = self.clock()
        now_iso = iso(now)
        today = now.date()
        start = await self._checkpoint(today)
        mine = await self.leases.mine()
        result = PassResult()
        result.republished = await self._republish(now, mine)
        ahead = iso(now + self.poll)
        day = start
        while day <= (now + self.poll).date():
            leftover = await self._day(day, now_iso, ahead, result, mine)
            if day < today and not leftover and day == start:
                await self._advance(start, day + timedelta(days=1))
                start = day + timedelta(days=1)
            day += timedelta(days=1)
        self._next_due = result.next_due
        self.passes += 1
        lag = 0.0
        if result.oldest_pending is not None:
            lag = (now - parse_iso(result.oldest_pending)).total_seconds()
        self.metrics.scheduler_pass(lag)
        if time.monotonic() >= self._lag_reported + LAG_REPORT_SECONDS:
            # The deployment's lag alarm reads this field (deploy/cloudformation.yaml):
            # a line a minute per process, so a silent scheduler alarms too.
            self._lag_reported = time.monotonic()
            log.info("scheduler lag %.1f s", lag, extra={"schedulerLagSeconds": round(lag, 3)})
        if result.unlocked or result.waiting or result.told_empty or result.republished:
            log.info(
                "unlock pass: %d opened, %d waiting for content, %d creators told their capsule is empty, "
                "%d published again from the outbox",
                result.unlocked,
                result.waiting,
                result.told_empty,
                result.republished,
            )
        return result

    def seconds_to_next_pass(self) -> float:
        """Until the next capsule due within a poll, or a poll: what a process
        waits between passes, so that a capsule opens at its date, not up to a
        poll later."""
        poll = self.poll.total_seconds()
        if self._next_due is None:
            return poll
        # A hair past the date, so that the pass finds it due.
        wait = (parse_iso(self._next_due) - self.clock()).total_seconds() + 0.005
        return max(0.0, min(poll, wait))

    # The checkpoint: the first day that may still hold something to open ------------

    async def _checkpoint(self, today: date) -> date:
        item = await self.table.get(keys.unlock_checkpoint())
        if item is None:
            return today - timedelta(days=FIRST_LOOKBACK_DAYS)
        return date.fromisoformat(item["day"])

    async def _advance(self, old: date, new: date) -> None:
        key = keys.unlock_checkpoint()
        with contextlib.suppress(StoreError):  # another process moved it; the next pass reads theirs
            await self.table.put(
                {"PK": key[0], "SK": key[1], "day": new.isoformat()},
                any_of(NotExists(), eq("day", old.isoformat())),
            )

    # One day ----------------------------------------------------------------------

    async def _day(self, day: date, now_iso: str, ahead: str, result: PassResult, mine: list[int]) -> bool:
        """Handles one day's due capsules in this process's shards (`mine`);
        True when some still wait there. A past day is read in every shard, so
        that True means nothing is left in any (the checkpoint moves on that).

        In phases, so each capsule costs a few writes and a share of one batch
        get: finish what this process owns or what was abandoned, then win the
        LOCKED ones a small batch at a time, read each batch's content at once,
        and finish each capsule of it."""
        failed_before = result.failed
        read = range(self.shards) if day < parse_iso(now_iso).date() else mine
        pages = await asyncio.gather(
            *(self._due(keys.unlock_day_shard(day.isoformat(), shard), ahead) for shard in read)
        )
        due: list[Capsule] = []
        others: list[Capsule] = []  # due in another process's shard: theirs to open
        for shard, page in zip(read, pages, strict=True):
            for item in page:
                capsule = Capsule.from_item(item)
                if shard not in mine:
                    if capsule.unlock_date <= now_iso:
                        others.append(capsule)
                elif capsule.unlock_date <= now_iso:
                    due.append(capsule)
                elif capsule.status == CapsuleStatus.LOCKED:
                    result.upcoming(capsule.unlock_date)
        for capsule in due:
            if capsule.status == CapsuleStatus.SCHEDULED:
                await self._guarded(capsule, self._tell_empty(capsule, result), result)
        # UNLOCKING capsules another process won a moment ago are theirs to finish;
        # only those left alone for a while (a crash) are taken over.
        abandoned = iso(self.clock() - self.abandoned_after)
        unlocking = [
            c
            for c in due
            if c.status == CapsuleStatus.UNLOCKING
            and (c.id in self._mine or (c.unlocking_at or c.unlock_date) < abandoned)
        ]
        locked = [c for c in due if c.status == CapsuleStatus.LOCKED]
        random.shuffle(locked)  # processes racing for a burst meet less often
        opened: set[str] = set()
        size = claim_batch(len(locked))
        batches = [unlocking] + [locked[n : n + size] for n in range(0, len(locked), size)]
        for batch in batches:
            if not batch:
                continue
            reads = await self._due_reads(batch)
            published: list[Key] = []
            finished = await self._each(
                batch,
                functools.partial(
                    self._finish, reads=reads, result=result, published=published, now_iso=now_iso
                ),
                result,
            )
            await self._clear_outbox(published)
            opened.update(c.id for c, done in zip(batch, finished, strict=True) if done is True)
        # Due and not AVAILABLE yet: whatever was LOCKED or UNLOCKING and did not
        # finish here (waiting for content, failed, or another process's to finish).
        # A SCHEDULED capsule never opens (no content by its date): it does not count.
        left = False
        for capsule in (*due, *others):
            if capsule.status in (CapsuleStatus.LOCKED, CapsuleStatus.UNLOCKING) and capsule.id not in opened:
                result.pending(capsule.unlock_date)
                left = True
        return result.failed > failed_before or left

    async def _each(
        self, capsules: list[Capsule], step: Callable[[Capsule], Awaitable[T]], result: PassResult
    ) -> list[T | None]:
        # A whole batch at once (its steps commit together on the embedded
        # store), at least CONCURRENCY and at most a batch's largest.
        limit = asyncio.Semaphore(min(max(CONCURRENCY, len(capsules)), MAX_CLAIM_BATCH))

        async def one(capsule: Capsule) -> T | None:
            async with limit:
                return await self._guarded(capsule, step(capsule), result)

        return list(await asyncio.gather(*(one(capsule) for capsule in capsules)))

    async def _guarded(self, capsule: Capsule, work: Awaitable[T], result: PassResult) -> T | None:
        try:
            return await work
        except Exception:
            result.failed += 1
            log.exception("unlock of capsule %s failed; the next pass retries", capsule.id)
            return None

    async def _due_reads(self, capsules: list[Capsule]) -> DueReads:
        """Every capsule's content (with its tag summary, for `unseal_ops`), who
        of its people may read the family now (resolvers.domain.access's rule),
        and for a capsule that may open in one transaction its people's unread
        counters and device counts, in one batch get."""
        wanted = [keys.content(c.content_id) for c in capsules if c.content_id]
        wanted += [keys.content_tags(c.content_id) for c in capsules if c.content_id]
        wanted += [
            keys.member(c.family_id, person) for c in capsules for person in (*c.recipient_ids, c.creator_id)
        ]
        counted = {
            key
            for c in capsules
            if may_open_at_once(c)
            for person in everyone(c)
            for key in notifications.reads_for_user(person)
        }
        wanted += counted
        reads = DueReads()
        if not wanted:
            return reads
        async for found in in_slices(list((await self.table.batch_get(wanted)).items())):
            for key, item in found:
                if key in counted:
                    reads.counts[key] = item
                elif item.get("type") == "Membership":
                    if item.get("role") in READERS:
                        reads.readers.setdefault(item["familyId"], set()).add(item["userId"])
                elif item.get("type") == "Content":
                    reads.contents[item["id"]] = Content.from_item(item)
                else:
                    reads.summaries[item["contentId"]] = item
        return reads

    async def _due(self, partition: str, until: str) -> list[Item]:
        # The sort key starts with the unlock date: everything up to `until`.
        return await all_items(self.table, partition, SortKey("<=", until + "~"), index="GSI2", page_size=500)

    async def _win(self, capsule: Capsule, now_iso: str) -> Capsule | None:
        """LOCKED -> UNLOCKING, this process's to finish; None if another won it."""
        try:
            item = await self.table.update(
                Update(
                    capsule.key,
                    set={"status": CapsuleStatus.UNLOCKING, "unlockingAt": now_iso},
                    condition=eq("status", CapsuleStatus.LOCKED),
                )
            )
        except ConditionFailed:
            return None  # another process won it
        won = Capsule.from_item(item)
        self._mine.add(won.id)
        return won

    async def _finish(
        self, capsule: Capsule, reads: DueReads, result: PassResult, published: list[Key], now_iso: str
    ) -> bool:
        """True when the capsule is AVAILABLE (by us or by another process).
        Once its events are out, its outbox item's key joins `published`, for
        the batch's one delete. A LOCKED capsule is won by its one opening
        transaction, or first by `_win` should its opening take steps."""
        content = reads.contents.get(capsule.content_id or "")
        readers = reads.readers.get(capsule.family_id, set())
        ready = content is not None and content.status in (ContentStatus.READY, ContentStatus.DELIVERED)
        if capsule.status == CapsuleStatus.LOCKED and not (ready and may_open_at_once(capsule)):
            # Won first: its date has come (UNLOCKING says so while its content
            # is processed), or it opens in steps, replayable under that win's date.
            won = await self._win(capsule, now_iso)
            if won is None:
                return False  # another process won it, and finishes it
            capsule = won
        if content is None or not ready:
            result.waiting += 1
            return False  # the content is still processing (or failed): wait
        # Its notes are dated when it was won: now, if this transaction wins it.
        if capsule.status == CapsuleStatus.LOCKED:
            unlocking_at = now_iso
        else:
            unlocking_at = capsule.unlocking_at or capsule.unlock_date
        # The capsule stays the family's and opens for its recipients; only those
        # who are its MEMBERs or ADMINs now are told (a creator who was removed
        # is not, and a recipient who left is not).
        people = [p for p in everyone(capsule) if p in readers]
        notes = await notifications.unlocked_notes(capsule, content.id, people, unlocking_at)
        stamps: list[WriteOp] = await built(
            [user for user in capsule.recipient_ids if user in readers],
            lambda user: Update(
                keys.recipient(capsule.id, user), set={"notifiedAt": unlocking_at}, condition=Exists()
            ),
        )
        outbox = keys.unlock_outbox(iso(self.clock()), capsule.id, self.shards)
        opening: list[WriteOp] = [
            Update(
                capsule.key,
                set={"status": CapsuleStatus.AVAILABLE, "notificationSent": True, "unlockedAt": unlocking_at},
                remove=["GSI2PK", "GSI2SK"],
                condition=eq("status", capsule.status),
            ),
            Update(content.key, set=content.feed_keys(), condition=Exists()),
            # The content leaves its capsule: its tags now count for everyone.
            *await unseal_ops(self.table, content, reads.summaries.get(content.id)),
        ]

        def outbox_item(push_to: list[str]) -> Put:
            # Who is to be told, committed with the opening: if this process dies
            # before its publish is out, a later pass publishes from here.
            return Put(
                {
                    "PK": outbox[0],
                    "SK": outbox[1],
                    "type": "UnlockOutbox",
                    "capsuleId": capsule.id,
                    "unlockedAt": unlocking_at,
                    "people": people,
                    "pushTo": push_to,
                },
                NotExists(),
            )

        commit: Callable[[], Awaitable[object]]
        if may_open_at_once(capsule) and (
            len(notes) + len(stamps) + len(opening) + 1 <= notifications.WRITTEN_PER_TRANSACTION
        ):
            # A capsule for a few people opens in one transaction: its notes,
            # their counts (and so the mail and push outboxes, which are the
            # notes), the stamps, AVAILABLE and the outbox item. The notes'
            # reads came in the batch get; a replay (an UNLOCKING capsule taken
            # over, whose notes may be there) or an epoch that moved is
            # cancelled by the notes' own conditions, and `write` reads again.
            prepared = notifications.prepared_from(notes, reads.counts)
            # Whose notes go in the push outbox, as read; should `write` read
            # again, a wake for a note not in it costs the push workers a lost
            # claim, and one it misses is found by their recovery scan.
            push_to = [note.user_id for note in prepared.fresh if note.user_id in prepared.with_devices]
            commit = functools.partial(
                notifications.write,
                self.table,
                self.broker,
                notes,
                prepared=prepared,
                beside=[*opening, outbox_item(push_to), *stamps],
                announce=False,
            )
        elif capsule.status == CapsuleStatus.LOCKED:
            # Its tags leave no room for it to open at once: won first, as above.
            won = await self._win(capsule, now_iso)
            if won is None:
                return False  # another process won it, and finishes it
            return await self._finish(won, reads, result, published, now_iso)
        else:
            # Before the capsule opens, in replayable batches: a capsule of any
            # size. Each note is counted unread with it; a replay finds its note
            # and leaves it out, so nothing is written or counted twice.
            written, _ = await asyncio.gather(
                notifications.write(self.table, self.broker, notes, announce=False), self._stamp(stamps)
            )
            # Whose notes wait in the push outbox (a replay's were written before:
            # the push workers' recovery scan finds those).
            push_to = [note.user_id for note in written if note.push_pending]
            commit = functools.partial(self.table.transact, [*opening, outbox_item(push_to)])
        try:
            await commit()
        except TransactionCancelled as error:
            if error.failed_on(capsule.key):
                self._mine.discard(capsule.id)
                # Another process finished it first, and publishes; or, if it was
                # LOCKED here, it may only have won it: left for the next pass to see.
                return capsule.status != CapsuleStatus.LOCKED
            if any(error.failed_on(op_key(stamp)) for stamp in stamps):
                raise  # a recipient's item is gone: as when stamped on its own
            # Its tags changed meanwhile: still ours, the next pass reads again.
            result.waiting += 1
            return False
        self._mine.discard(capsule.id)
        result.unlocked += 1
        self.metrics.capsule_unlocked()
        await self._publish(capsule.id, unlocking_at, people, push_to)
        published.append(outbox)
        return True

    async def _stamp(self, stamps: Sequence[WriteOp]) -> None:
        """The recipients' `notifiedAt`, in transactions of up to 100 (replaying one sets the same)."""
        await asyncio.gather(
            *(
                self.table.transact(stamps[n : n + TRANSACTION_ITEMS])
                for n in range(0, len(stamps), TRANSACTION_ITEMS)
            )
        )

    async def _publish(
        self, capsule_id: str, unlocked_at: str, people: Sequence[str], push_to: Sequence[str] = ()
    ) -> None:
        """Every person's two events in one batched publish. The caller then
        deletes the outbox item (`_clear_outbox`), with its batch's others."""
        broker = self.broker
        if broker is not None:
            events: list[tuple[str, Event]] = []
            async for some in in_slices(people):
                for user in some:
                    events.append(
                        (
                            user_channel(user, "capsules"),
                            {"kind": "capsule", "capsuleId": capsule_id, "unlockedAt": unlocked_at},
                        )
                    )
                    events.append(
                        notifications.announcement(
                            user, unlocked_at, notifications.unlocked_id(capsule_id, user)
                        )
                    )
            if push_to:
                told = await built(
                    push_to, lambda user: (user, unlocked_at, notifications.unlocked_id(capsule_id, user))
                )
                events.append(notifications.push_wake(told))
            await broker.publish_many(events)

    async def _clear_outbox(self, published: Sequence[Key]) -> None:
        """The outbox items of openings whose events are out, in one batch write
        (a batch's capsules, or what a republish sent): one call, not a delete
        each. An item left by a crash or a failure here is published again by
        a later pass, whose events the streams drop as repeats."""
        if not published:
            return
        try:
            await self.table.batch_write(deletes=published)
        except StoreError:
            log.warning("%d published unlock outbox items not deleted; a later pass does", len(published))

    async def _republish(self, now: datetime, mine: list[int]) -> int:
        """Publishes what a process committed and did not get out (it died in
        between): outbox items older than the grace a live publisher needs, in
        this process's shards (an outbox item is in its capsule's shard)."""
        stale = iso(now - OUTBOX_GRACE)
        pages = await asyncio.gather(
            *(
                self.table.query(keys.unlock_outbox_pk(shard), SortKey("<", stale), limit=100)
                for shard in mine
            )
        )
        published: list[Key] = []
        for item in (item for page in pages for item in page.items):
            try:
                await self._publish(
                    item["capsuleId"], item["unlockedAt"], list(item["people"]), list(item.get("pushTo", []))
                )
            except Exception:
                log.exception("could not publish the unlock of capsule %s again", item.get("capsuleId"))
                continue
            published.append((item["PK"], item["SK"]))
        await self._clear_outbox(published)
        return len(published)

    async def _tell_empty(self, capsule: Capsule, result: PassResult) -> None:
        if capsule.creator_told_empty:
            return
        note = notifications.empty_note(capsule)
        creator = await self.table.get(keys.member(capsule.family_id, capsule.creator_id))
        # A creator who is no longer in the family is not told; the flag is set
        # all the same, so no later pass asks again.
        tell = creator is not None and creator.get("role") in READERS
        ops: list[WriteOp] = [
            Update(
                capsule.key, set={"creatorToldEmpty": True}, condition=eq("status", CapsuleStatus.SCHEDULED)
            )
        ]
        try:
            await notifications.write(self.table, self.broker, [note] if tell else [], beside=ops)
        except TransactionCancelled:
            return  # told already: the flag is set
        if tell:
            result.told_empty += 1
