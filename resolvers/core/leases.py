"""A lease on one table item: which process works on it, and until when.

Background work (content in the media pipeline, data exports, account
deletions, emails to send) is claimed by a conditional write that stamps the
item with its holder and an expiry. The holder renews it while it works and
clears it when done or handed back; a holder that died lets go when the expiry
passes, and any process may then claim the item again. Every user of a lease
writes the same three attributes, so one set of conditions serves them all.
"""

from __future__ import annotations

from collections.abc import Mapping
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
)

UNTIL = "leaseUntil"
OWNER = "leaseOwner"
# How many times the item was claimed: work that keeps killing its process
# (a file that crashes the decoder, say) is given up after a few.
ATTEMPTS = "leaseAttempts"

# What a finished or handed-back item is set to.
CLEARED: Mapping[str, Any] = {UNTIL: None, OWNER: None}


def free(now: datetime) -> Condition:
    """Nobody holds the item: never leased, handed back, or run out."""
    return any_of(NotExists(UNTIL), eq(UNTIL, None), Compare(UNTIL, "<", iso(now)))


def is_live(item: Item, now: datetime) -> bool:
    """Whether someone holds the item now (as a query read it)."""
    until = item.get(UNTIL)
    return bool(until) and str(until) > iso(now)


def held_by(owner: str | None) -> Condition:
    """The item's lease is `owner`'s: the condition of every write that renews,
    finishes or hands back."""
    return eq(OWNER, owner)


def attempts(item: Item) -> int:
    return int(item.get(ATTEMPTS, 0))


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
    ) -> Item | None:
        """Takes the item if nobody holds it (or, with `also_mine`, if this holder
        already does) and `when` holds; the item as it now is, or None."""
        available = any_of(free(now), self.held()) if also_mine else free(now)
        condition = all_of(Exists(), available, *([when] if when is not None else []))
        try:
            return await table.update(
                Update(
                    key,
                    set={**(changes or {}), **self.stamp(now)},
                    add={ATTEMPTS: 1} if count else {},
                    condition=condition,
                )
            )
        except ConditionFailed:
            return None  # done, gone, or held by another

    async def take(self, table: Table, key: Key, now: datetime) -> bool:
        """Takes the item whoever holds it: for a request, whose person asked
        just now and outranks a background run (every step is conditional)."""
        try:
            await table.update(Update(key, set=self.stamp(now), condition=Exists()))
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

    async def release(self, table: Table, key: Key, *, when: Condition | None = None) -> bool:
        """Hands the item back, so that the next recovery pass (on any process)
        takes it up at once instead of after the expiry."""
        condition = all_of(self.held(), when) if when is not None else self.held()
        try:
            await table.update(Update(key, set=dict(CLEARED), condition=condition))
        except ConditionFailed:
            return False
        return True
