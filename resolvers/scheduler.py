"""The unlock scheduler. It runs in every server process; conditional writes
make each capsule's unlock happen exactly once however many run.

One pass:
1. For each day from the checkpoint to today, and each shard, read the due
   entries of `UNLOCK#<day>#<shard>` on GSI2 (SCHEDULED, LOCKED, UNLOCKING).
2. LOCKED: win it with a conditional LOCKED -> UNLOCKING (the loser skips it).
3. UNLOCKING (just won, or left by a crash): once the content is READY, one
   transaction makes the capsule AVAILABLE, drops its GSI2 keys, puts the
   content in the feed, stamps the recipients and writes one notification per
   person with an id derived from the capsule, so a replay cannot duplicate it.
   Only the process whose transaction commits publishes the events.
4. SCHEDULED (no content by its date): stays closed; its creator is told once.
5. A past day with nothing left to open moves the checkpoint past it, so a
   server that was down for days catches up without scanning the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import date, timedelta

from resolvers.broker import Broker, user_channel
from resolvers.context import Services
from resolvers.notifications import announce, notification_id
from store import keys
from store.items import Capsule, Content, Notification, iso
from store.port import (
    Exists,
    Item,
    NotExists,
    Put,
    SortKey,
    StoreError,
    TransactionCancelled,
    Update,
    WriteOp,
    eq,
)

log = logging.getLogger("mifamilias.scheduler")

CONCURRENCY = 16
FIRST_LOOKBACK_DAYS = 1


@dataclass
class PassResult:
    unlocked: int = 0
    waiting: int = 0
    told_empty: int = 0


class UnlockScheduler:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.table = services.table
        self.shards = services.settings.unlock_shards

    @property
    def broker(self) -> Broker | None:
        broker: Broker | None = self.services.extras.get("broker")
        return broker

    async def run_once(self) -> PassResult:
        now = self.services.now()
        now_iso = iso(now)
        today = now.date()
        start = await self._checkpoint(today)
        result = PassResult()
        day = start
        while day <= today:
            leftover = await self._day(day, now_iso, result)
            if day < today and not leftover and day == start:
                await self._advance(start, day + timedelta(days=1))
                start = day + timedelta(days=1)
            day += timedelta(days=1)
        return result

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
                eq("day", old.isoformat()) if await self.table.get(key) else NotExists(),
            )

    # One day ----------------------------------------------------------------------

    async def _day(self, day: date, now_iso: str, result: PassResult) -> bool:
        """Handles one day's due capsules; True when some still wait there."""
        pages = await asyncio.gather(
            *(
                self._due(keys.unlock_day_shard(day.isoformat(), shard), now_iso)
                for shard in range(self.shards)
            )
        )
        due = [item for page in pages for item in page]
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(item: Item) -> bool:
            async with limit:
                try:
                    return await self._capsule(Capsule.from_item(item), now_iso, result)
                except Exception:
                    log.exception("unlock of capsule %s failed; the next pass retries", item.get("id"))
                    return True

        leftovers = await asyncio.gather(*(one(item) for item in due))
        # Not-yet-due entries of today stay for later passes; past days are all due.
        return any(leftovers)

    async def _due(self, partition: str, now_iso: str) -> list[Item]:
        found: list[Item] = []
        cursor: str | None = None
        while True:
            # The sort key starts with the unlock date: everything up to now is due.
            page = await self.table.query(
                partition, SortKey("<=", now_iso + "~"), index="GSI2", limit=500, cursor=cursor
            )
            found += page.items
            if page.cursor is None:
                return found
            cursor = page.cursor

    async def _capsule(self, capsule: Capsule, now_iso: str, result: PassResult) -> bool:
        if capsule.unlock_date > now_iso:
            return True
        if capsule.status == "SCHEDULED":
            await self._tell_empty(capsule, now_iso, result)
            return False
        if capsule.status == "LOCKED":
            won = await self._win(capsule, now_iso)
            if won is None:
                return False  # another process has it
            capsule = won
        if capsule.status != "UNLOCKING":
            return False
        return not await self._finish(capsule, result)

    async def _win(self, capsule: Capsule, now_iso: str) -> Capsule | None:
        try:
            item = await self.table.update(
                Update(
                    capsule.key,
                    set={"status": "UNLOCKING", "unlockingAt": now_iso},
                    condition=eq("status", "LOCKED"),
                )
            )
        except StoreError:
            return None
        return Capsule.from_item(item)

    async def _finish(self, capsule: Capsule, result: PassResult) -> bool:
        """True when the capsule is AVAILABLE (by us or by another process)."""
        item = await self.table.get(capsule.key)
        if item is None or item["status"] != "UNLOCKING":
            return True
        unlocking_at = item.get("unlockingAt") or capsule.unlock_date
        content_item = await self.table.get(keys.content(capsule.content_id)) if capsule.content_id else None
        content = Content.from_item(content_item) if content_item else None
        if content is None or content.status not in ("READY", "DELIVERED"):
            result.waiting += 1
            return False  # the content is still processing (or failed): wait
        people = list(dict.fromkeys([*capsule.recipient_ids, capsule.creator_id]))
        notes = [
            Notification(
                user_id=user,
                id=notification_id("CAPSULE_UNLOCKED", capsule.id, user),
                type="CAPSULE_UNLOCKED",
                created_at=unlocking_at,
                family_id=capsule.family_id,
                content_id=content.id,
                capsule_id=capsule.id,
            )
            for user in people
        ]
        ops: list[WriteOp] = [
            Update(
                capsule.key,
                set={"status": "AVAILABLE", "notificationSent": True, "unlockedAt": unlocking_at},
                remove=["GSI2PK", "GSI2SK"],
                condition=eq("status", "UNLOCKING"),
            ),
            Update(content.key, set=content.feed_keys(), condition=Exists()),
            *(
                Update(keys.recipient(capsule.id, user), set={"notifiedAt": unlocking_at}, condition=Exists())
                for user in capsule.recipient_ids
            ),
            *(Put(note.to_item(), NotExists()) for note in notes),
        ]
        try:
            await self.table.transact(ops)
        except TransactionCancelled:
            return True  # another process finished it first; it publishes
        result.unlocked += 1
        await self._publish(capsule, unlocking_at, people, notes)
        return True

    async def _publish(
        self, capsule: Capsule, unlocked_at: str, people: list[str], notes: list[Notification]
    ) -> None:
        broker = self.broker
        if broker is None:
            return
        for user in people:
            await broker.publish(
                user_channel(user), {"kind": "capsule", "capsuleId": capsule.id, "unlockedAt": unlocked_at}
            )
        await announce(broker, notes)

    async def _tell_empty(self, capsule: Capsule, now_iso: str, result: PassResult) -> None:
        if capsule.creator_told_empty:
            return
        note = Notification(
            user_id=capsule.creator_id,
            id=notification_id("CAPSULE_EMPTY", capsule.id),
            type="CAPSULE_EMPTY",
            created_at=capsule.unlock_date,
            family_id=capsule.family_id,
            capsule_id=capsule.id,
        )
        try:
            await self.table.transact(
                [
                    Update(capsule.key, set={"creatorToldEmpty": True}, condition=eq("status", "SCHEDULED")),
                    Put(note.to_item(), NotExists()),
                ]
            )
        except TransactionCancelled:
            return
        result.told_empty += 1
        await announce(self.broker, [note])
