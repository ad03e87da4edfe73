"""Which unlock shards a process reads.

Each shard of the unlock schedule (`UNLOCK#<day>#<shard>` and its outbox
partition) is leased to one process at a time through `resolvers.core.leases`,
so only its holder reads the shard's due capsules, races for them and wakes at
their dates; the other processes neither read nor race for them. At every pass
a process reads the leases (one query: they share the scheduler's partition),
renews its own once a third of their length has passed, claims free shards up
to its fair share (the shards over the processes holding any, itself counted),
and takes one from the busiest holder while that holder has two more than it
has, which is how a process that has just started gets its share. A process
that dies keeps its shards until their leases run out; then the others claim
them. One that stops hands them back (`release`), so the next pass elsewhere
takes them at once.

The leases only spare work. Every step of an unlock is a conditional write, so
two processes reading one shard for a while (a lease taken mid-pass, a pass
longer than the lease) still open each capsule exactly once.
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from resolvers.core import leases
from resolvers.core.leases import Lease
from store import keys
from store.items import iso
from store.port import Item, SortKey, Table, all_items

log = logging.getLogger("mifamilias.scheduler")


def fair_share(shards: int, others: int) -> int:
    """The most shards a process should hold when `others` other processes hold some."""
    return math.ceil(shards / (others + 1))


class ShardLeases:
    def __init__(self, *, table: Table, shards: int, lease: Lease, clock: Callable[[], datetime]) -> None:
        self.table = table
        self.shards = shards
        self.lease = lease
        self.clock = clock
        # What the last pass held: handed back by `release`.
        self.held: list[int] = []

    async def mine(self) -> list[int]:
        """The shards this process reads this pass, after renewing, claiming and
        taking what its share says (in order)."""
        now = self.clock()
        holders: dict[int, Item] = {}
        for item in await all_items(
            self.table, keys.SCHEDULER_PK, SortKey.begins_with(keys.UNLOCK_SHARD_LEASE_PREFIX)
        ):
            shard = int(item.get("shard", -1))
            if 0 <= shard < self.shards and leases.is_live(item, now):
                holders[shard] = item
        me = self.lease.owner
        held: list[int] = []
        # Renewed once a third of the lease has passed, as a leased worker's heartbeat.
        renew_before = now + self.lease.length * 2 / 3
        for shard, item in holders.items():
            if item.get(leases.OWNER) != me:
                continue
            if str(item[leases.UNTIL]) > iso(renew_before) or await self.lease.renew(
                self.table, keys.unlock_shard_lease(shard), now
            ):
                held.append(shard)
        theirs: dict[str, list[int]] = {}
        for shard, item in holders.items():
            owner = str(item.get(leases.OWNER))
            if owner != me:
                theirs.setdefault(owner, []).append(shard)
        share = fair_share(self.shards, len(theirs))
        free = [shard for shard in range(self.shards) if shard not in holders]
        # In a random order: processes claiming at the same moment meet less often.
        random.shuffle(free)
        for shard in free:
            if len(held) >= share:
                break
            if await self.lease.claim(
                self.table, keys.unlock_shard_lease(shard), now, changes={"shard": shard}, create=True
            ):
                held.append(shard)
        counts = Counter({owner: len(shards) for owner, shards in theirs.items()})
        while counts:
            owner, most = counts.most_common(1)[0]
            if most <= len(held) + 1:
                break
            shard = theirs[owner].pop()
            counts[owner] -= 1
            if await self.lease.take_from(self.table, keys.unlock_shard_lease(shard), now, owner):
                log.info("unlock shard %d taken from a busier process", shard)
                held.append(shard)
        self.held = sorted(held)
        return self.held

    async def release(self) -> None:
        """Hands back the shards this process held, for the next pass on another
        process to claim at once (a stop, not a crash)."""
        held, self.held = self.held, []
        for shard in held:
            try:
                await self.lease.release(self.table, keys.unlock_shard_lease(shard))
            except Exception:
                log.exception("could not hand back unlock shard %d; its lease runs out", shard)
