"""A lease on one table item: which process works on it, and until when.

Background work (content in the media pipeline, data exports, account
deletions, emails to send) is claimed by a conditional write that stamps the
item with its holder and an expiry. The holder renews it while it works and
clears it when done or handed back; a holder that died lets go when the expiry
passes, and any process may then claim the item again. Every user of a lease
writes the same three attributes, so one set of conditions serves them all.

For one release, the previous format's lease (`store.formats`, format 1) is
honoured too: the mailer leased a note under names of its own, and a process of
the previous release may hold one during a rolling upgrade. While that lease
lives the item is not free; once it has run out, the claim that takes the item
clears those names in the same conditional write, so that process's last write
(conditioned on `mailOwner`) can no longer land.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from store.items import iso
from store.port import (
    Compare,
    Condition,
    ConditionFailed,
    Exists,
    Item,
    Key,
    NotExists,
    Table,
    Update,
    all_of,
    any_of,
    eq,
    update_each,
)

UNTIL = "leaseUntil"
OWNER = "leaseOwner"
# How many times the item was claimed: work that keeps killing its process
# (a file that crashes the decoder, say) is given up after a few.
ATTEMPTS = "leaseAttempts"

# What a finished or handed-back item is set to.
CLEARED: Mapping[str, Any] = {UNTIL: None, OWNER: None}

# The previous format's lease, read for one release: the mailer's own names
# (its count, `mailAttempts`, is its spec's `previous_attempts`).
PREVIOUS_UNTIL = "mailLeaseUntil"
PREVIOUS_OWNER = "mailOwner"
# What a claim or a take removes: the previous holder's names go with its lease.
PREVIOUS_NAMES = (PREVIOUS_UNTIL, PREVIOUS_OWNER)


def _run_out(until: str, now: datetime) -> Condition:
    return any_of(NotExists(until), eq(until, None), Compare(until, "<", iso(now)))


def free(now: datetime) -> Condition:
    """Nobody holds the item: never leased, handed back, or run out, under this
    format's names and the previous one's."""
    return all_of(_run_out(UNTIL, now), _run_out(PREVIOUS_UNTIL, now))


def is_live(item: Item, now: datetime) -> bool:
    """Whether someone holds the item now (as a query read it), under this
    format's names or the previous one's."""
    moment = iso(now)
    return any(bool(until) and str(until) > moment for until in (item.get(UNTIL), item.get(PREVIOUS_UNTIL)))


def held_by(owner: str | None) -> Condition:
    """The item's lease is `owner`'s: the condition of every write that renews,
    finishes or hands back."""
    return eq(OWNER, owner)


def attempts(item: Item, previous: str | None = None) -> int:
    """How many times the item was claimed: this format's count, plus the one a
    process of the previous format kept under `previous` (the exports'
    `attempts`, the mailer's `mailAttempts`). A claim leaves that count where it
    is, so the two add up to every claim whichever release made it."""
    count = int(item.get(ATTEMPTS) or 0)
    if previous is not None:
        count += int(item.get(previous) or 0)
    return count


@dataclass(frozen=True)
class Lease:
    """One holder's leases: `owner` names the holder (a process, or a request),
    `length` how long a claim or a renewal lasts."""

    owner: str
    length: timedelta

    def held(self) -> Condition:
        return held_by(self.owner)

    def stamp(self, now: datetime) -> dict[str, Any]:
        return {UNTIL: iso(now + self.length), OWNER: self.owner}

    async def claim(
        self,
        table: Table,
        key: Key,
        now: datetime,
        *,
        when: Condition | None = None,
        also_mine: bool = False,
        count: bool = False,
        changes: Mapping[str, Any] | None = None,
        create: bool = False,
    ) -> Item | None:
        """Takes the item if nobody holds it (or, with `also_mine`, if this holder
        already does) and `when` holds; the item as it now is, or None. With
        `create`, a missing item is made by the claim: a lease on a name (a
        unit of work no record stands for), not on a record that must exist."""
        available = any_of(free(now), self.held()) if also_mine else free(now)
        parts = [*([] if create else [Exists()]), available, *([when] if when is not None else [])]
        # One condition alone is not wrapped: DynamoDB refuses redundant parentheses.
        condition = parts[0] if len(parts) == 1 else all_of(*parts)
        try:
            return await table.update(self._taking(key, now, condition, count, changes))
        except ConditionFailed:
            return None  # done, gone, or held by another

    def _taking(
        self, key: Key, now: datetime, condition: Condition, count: bool, changes: Mapping[str, Any] | None
    ) -> Update:
        """The write that takes `key` for this holder when `condition` holds."""
        return Update(
            key,
            set={**(changes or {}), **self.stamp(now)},
            remove=PREVIOUS_NAMES,
            add={ATTEMPTS: 1} if count else {},
            condition=condition,
        )

    async def claim_many(
        self,
        table: Table,
        keys: Sequence[Key],
        now: datetime,
        *,
        when: Condition | None = None,
        count: bool = False,
        changes: Mapping[str, Any] | None = None,
    ) -> dict[Key, Item]:
        """`claim` for many items in few calls: one conditional write per item,
        up to a hundred to a transaction (`store.port.update_each`), then one
        read of those taken. Each item is taken or not on its own condition,
        as by `claim`; the items this holder now holds, as they now are. A
        holder that dies after this holds them until their lease runs out, as
        after `claim`: nothing was done with them yet, so the next claim does
        it all, once."""
        wanted = list(dict.fromkeys(keys))
        if len(wanted) == 1:
            one = await self.claim(table, wanted[0], now, when=when, count=count, changes=changes)
            return {wanted[0]: one} if one is not None else {}
        condition = all_of(Exists(), free(now), *([when] if when is not None else []))
        refused = await update_each(
            table, [self._taking(key, now, condition, count, changes) for key in wanted]
        )
        taken = [key for key in wanted if key not in refused]
        if not taken:
            return {}
        # A transaction answers nothing of the items: one read of them all. An
        # item deleted since (its person's account, say) is simply not handed out.
        found = await table.batch_get(taken)
        return {key: found[key] for key in taken if key in found}

    async def take(self, table: Table, key: Key, now: datetime) -> bool:
        """Takes the item whoever holds it: for a request, whose person asked
        just now and outranks a background run (every step is conditional)."""
        try:
            await table.update(Update(key, set=self.stamp(now), remove=PREVIOUS_NAMES, condition=Exists()))
        except ConditionFailed:
            return False
        return True

    async def take_from(self, table: Table, key: Key, now: datetime, holder: str) -> bool:
        """Takes the item from `holder` if its lease is still that holder's:
        work moved between live processes to even out their shares. The holder
        finds it gone at its next read or renewal."""
        try:
            await table.update(
                Update(
                    key,
                    set=self.stamp(now),
                    remove=PREVIOUS_NAMES,
                    condition=all_of(Exists(), held_by(holder)),
                )
            )
        except ConditionFailed:
            return False
        return True

    async def renew(self, table: Table, key: Key, now: datetime, *, when: Condition | None = None) -> bool:
        """Extends the lease while it is still this holder's; False once it is not."""
        condition = all_of(self.held(), when) if when is not None else self.held()
        try:
            await table.update(Update(key, set={UNTIL: iso(now + self.length)}, condition=condition))
        except ConditionFailed:
            return False
        return True

    async def renew_many(
        self, table: Table, keys: Sequence[Key], now: datetime, *, when: Condition | None = None
    ) -> list[Key]:
        """`renew` for many items in few calls; the keys still this holder's."""
        condition = all_of(self.held(), when) if when is not None else self.held()
        until = iso(now + self.length)
        refused = await update_each(
            table, [Update(key, set={UNTIL: until}, condition=condition) for key in keys]
        )
        return [key for key in keys if key not in refused]

    async def release(self, table: Table, key: Key, *, when: Condition | None = None) -> bool:
        """Hands the item back, so that the next recovery pass (on any process)
        takes it up at once instead of after the expiry."""
        condition = all_of(self.held(), when) if when is not None else self.held()
        try:
            await table.update(Update(key, set=dict(CLEARED), condition=condition))
        except ConditionFailed:
            return False
        return True
