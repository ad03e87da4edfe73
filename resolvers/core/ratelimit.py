"""Write rate limits, shared by every server process through the table.

One counter item per subject (a person, or a client address) and action holds
the current fixed window's start and count. An operation checks the counter
beside its first read and counts itself beside its write, so a limit costs no
extra round trip and an operation refused before its write (bad input, no
right) counts nothing.
Over the limit, the answer is RATE_LIMITED with `extensions.retryAfter`, the
seconds until the window turns. Requests racing at the very edge of a window
may pass the check together, so the limit can be exceeded by the number of
operations one person has in flight at once.

The defaults are generous for a real family and are set per action with
`MIFAMILIAS_RATE_LIMITS`, e.g. `comment=30/60,upload=60/3600` (count/seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from resolvers.core.errors import RateLimited
from store import keys
from store.port import (
    MAX_TRANSACTION_ITEMS,
    TTL_ATTRIBUTE,
    Compare,
    ConditionFailed,
    Key,
    NotExists,
    StoreError,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
    all_of,
    any_of,
    eq,
)

# Commits one transaction of these writes.
Transact = Callable[[list[WriteOp]], Awaitable[None]]


@dataclass(frozen=True)
class Limit:
    count: int
    seconds: int


DEFAULT_LIMITS: Mapping[str, Limit] = {
    "comment": Limit(30, 60),
    "reaction": Limit(120, 60),
    "upload": Limit(60, 3600),
    "capsule": Limit(30, 3600),
    # Data exports: each reads everything a person has and copies their media.
    "export": Limit(3, 24 * 3600),
    # Persisted queries one person stores (a client has a few fixed documents).
    "persist": Limit(200, 24 * 3600),
    # Invites that carry an email address: each mails someone outside the family.
    "invite-email": Limit(20, 24 * 3600),
    # Wrong invite codes from one client address, whoever is signed in: a
    # backstop across accounts, far above one person's own limit (ten), since a
    # whole NAT or carrier network may share the address.
    "join-address": Limit(300, 600),
}

ATTEMPTS = 4


def parse_limits(text: str | None) -> dict[str, Limit]:
    """`action=count/seconds,...` over the defaults; a bad entry names itself."""
    limits = dict(DEFAULT_LIMITS)
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        try:
            action, spec = entry.split("=", 1)
            count, seconds = spec.split("/", 1)
            limits[action.strip()] = Limit(int(count), int(seconds))
        except ValueError as error:
            raise ValueError(
                f"MIFAMILIAS_RATE_LIMITS: {entry.strip()!r} is not action=count/seconds"
            ) from error
    return limits


log = logging.getLogger("mifamilias.limits")


class RateLimiter:
    def __init__(
        self,
        table: Table,
        limits: Mapping[str, Limit],
        *,
        cost_bucket: Bucket | None = None,
        budget_counter: BudgetCounter | None = None,
        streams_per_person: int = 50,
        replays_per_person: int = 2,
    ) -> None:
        self.table = table
        self.limits = limits
        self.budget = CostBudget(budget_counter or TableBudgetCounter(table), cost_bucket or Bucket(0, 1))
        self.streams = StreamSlots(table, streams_per_person)
        self.replays = Turns(replays_per_person)

    def _window(self, action: str, now: datetime) -> tuple[Limit, int, float] | None:
        limit = self.limits.get(action)
        if limit is None or limit.count <= 0:
            return None
        moment = now.timestamp()
        return limit, int(moment // limit.seconds * limit.seconds), moment

    async def check(self, subject: str, action: str, now: datetime) -> int | None:
        """RateLimited when `subject` has used up this window's `action`s; a
        point read, so it can join the operation's first reads. Answers the
        window the counter was in, which tells `count` which write to try first."""
        found = self._window(action, now)
        if found is None:
            return None
        limit, window, moment = found
        item = await self.table.get(keys.rate(subject, action))
        seen = int(item["window"]) if item is not None and "window" in item else None
        if seen == window and item is not None and int(item.get("count", 0)) >= limit.count:
            raise _refusal(limit, window, moment)
        return seen

    def _updates(self, subject: str, action: str, limit: Limit, window: int) -> tuple[Update, Update]:
        """The two writes that count one more: in this window while it has room,
        or starting this window (no counter yet, or one of an older window)."""
        key = keys.rate(subject, action)
        add = Update(
            key,
            add={"count": 1},
            condition=all_of(eq("window", window), Compare("count", "<", limit.count)),
        )
        # A counter means nothing once its window is over, so DynamoDB's TTL may
        # delete it then (one counter per client address would otherwise pile up).
        start = Update(
            key,
            set={"window": window, "count": 1, TTL_ATTRIBUTE: window + limit.seconds},
            condition=any_of(NotExists(), Compare("window", "<", window)),
        )
        return add, start

    async def counted(
        self,
        subject: str,
        action: str,
        now: datetime,
        ops: Sequence[WriteOp],
        seen: int | None = None,
        transact: Transact | None = None,
    ) -> None:
        """Runs the transaction `ops` with one more `action` counted in it, under
        the condition that the window has room: RATE_LIMITED when it has none,
        and then nothing of `ops` is written either. `transact` commits the
        writes (the table's own by default; a writer that adds writes of its
        own to the same transaction, such as the notifications')."""
        transact = transact or self.table.transact
        found = self._window(action, now)
        if found is None:
            await transact(list(ops))
            return
        limit, window, moment = found
        key = keys.rate(subject, action)
        add, start = self._updates(subject, action, limit, window)
        order = (add, start) if seen == window else (start, add)
        for _ in range(ATTEMPTS):
            for update in order:
                try:
                    await transact([*ops, update])
                    return
                except TransactionCancelled as error:
                    if not error.failed_on(key):
                        raise  # one of the operation's own conditions
            item = await self.table.get(key)
            if item is not None and item.get("window") == window and int(item.get("count", 0)) >= limit.count:
                raise _refusal(limit, window, moment)
        raise _refusal(limit, window, moment)  # others kept taking the room meanwhile

    async def count(self, subject: str, action: str, now: datetime, seen: int | None = None) -> None:
        """Counts one `action` that happened with no write of its own (a wrong
        invite code), while the window has room; a full window stays full. The
        write the check's reading calls for goes first (one write, as a rule)."""
        found = self._window(action, now)
        if found is None:
            return
        limit, window, _ = found
        add, start = self._updates(subject, action, limit, window)
        order = (add, start) if seen == window else (start, add)
        for _ in range(ATTEMPTS):
            for update in order:
                try:
                    await self.table.update(update)
                    return
                except ConditionFailed:
                    continue  # another process moved it meanwhile: the other write fits


# The cost budget ------------------------------------------------------------------

MICROS = 1_000_000


@dataclass(frozen=True)
class Bucket:
    """A leaky bucket of cost points, Shopify's model: it holds `size` points,
    an operation takes what it costs, and `restore_rate` points a second flow
    back in."""

    size: int
    restore_rate: float

    @property
    def enabled(self) -> bool:
        return self.size > 0 and self.restore_rate > 0

    def micros(self, points: int) -> int:
        """How long `points` take to flow back, in microseconds."""
        return math.ceil(points * MICROS / self.restore_rate)

    def available(self, full_at: int, now: int) -> int:
        """Points in the bucket at `now` when it is full again at `full_at`
        (both in microseconds since the epoch)."""
        missing = max(0, full_at - now) * self.restore_rate / MICROS
        return max(0, self.size - math.ceil(missing))


@dataclass(frozen=True)
class BudgetState:
    """A person's bucket after a charge: what it cost, what is left, and when
    the bucket is full again. Shopify's `throttleStatus`, and GitHub's
    `rateLimit` names for `Query.rateLimit`."""

    bucket: Bucket
    cost: int
    available: int
    full_at: float  # seconds since the epoch

    @property
    def limit(self) -> int:
        return self.bucket.size

    @property
    def remaining(self) -> int:
        return self.available

    @property
    def used(self) -> int:
        return self.bucket.size - self.available

    @property
    def reset_at(self) -> int:
        return math.ceil(self.full_at)

    def refunded(self, points: int) -> BudgetState:
        return BudgetState(
            self.bucket,
            self.cost - points,
            min(self.bucket.size, self.available + points),
            self.full_at - points / self.bucket.restore_rate,
        )

    def throttle_status(self) -> dict[str, object]:
        return {
            "maximumAvailable": self.bucket.size,
            "currentlyAvailable": self.available,
            "restoreRate": self.bucket.restore_rate,
        }

    def extensions(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "cost": self.cost,
            "used": self.used,
            "remaining": self.remaining,
            "resetAt": datetime.fromtimestamp(self.reset_at, UTC).isoformat(),
        }


class BudgetCounter(Protocol):
    """Where each person's bucket is kept, for every process. A bucket is one
    number, the moment it is full again (`full_at`, microseconds since the
    epoch): the generic cell rate algorithm, so that a charge is one atomic
    step and nothing has to drip."""

    async def spend(self, subject: str, cost: int, bucket: Bucket, now: int) -> int | None:
        """Takes `cost` points if the bucket holds them at `now`, atomically:
        `full_at` after, or None when they do not fit (nothing taken)."""
        ...

    async def spend_many(self, costs: Mapping[str, int], bucket: Bucket, now: int) -> dict[str, int | None]:
        """`spend` for each person of `costs` (person to points) at once, in as
        few store calls as the store allows: each person's points are taken or
        refused as `spend` would, on their own (one refused takes nothing from
        the others)."""
        ...

    async def refund(self, subject: str, points: int, bucket: Bucket, now: int) -> None:
        """Gives back `points` taken by a charge (never above a full bucket)."""
        ...

    async def full_at(self, subject: str) -> int:
        """When the bucket is full again (0: never charged, or long ago)."""
        ...


class TableBudgetCounter:
    """One item per person holding `full_at`, written under a condition that
    the points fit, so processes racing cannot overspend it. A charge is one
    conditional write: onto a bucket that is full (start from now), or onto
    one that is not (add the cost's time), whichever it is."""

    def __init__(self, table: Table) -> None:
        self.table = table

    async def spend(self, subject: str, cost: int, bucket: Bucket, now: int) -> int | None:
        if cost > bucket.size:
            return None
        key = keys.rate(subject, "cost")
        took = bucket.micros(cost)
        # The latest `full_at` with room for `cost`: the bucket then holds size - cost.
        latest = now + bucket.micros(bucket.size - cost)
        # DynamoDB's TTL may delete the item once the bucket is full anyway.
        expires = (now + bucket.micros(bucket.size)) // MICROS + 2
        onto_full = Update(
            key,
            set={"fullAt": now + took, TTL_ATTRIBUTE: expires},
            condition=any_of(NotExists(), Compare("fullAt", "<=", now)),
        )
        onto_partial = Update(
            key,
            add={"fullAt": took},
            set={TTL_ATTRIBUTE: expires},
            condition=all_of(Compare("fullAt", ">", now), Compare("fullAt", "<=", latest)),
        )
        for _ in range(ATTEMPTS):
            for update in (onto_partial, onto_full):
                try:
                    item = await self.table.update(update)
                except ConditionFailed:
                    continue
                return int(item["fullAt"])
            if await self.full_at(subject) > latest:
                return None
        return None

    async def spend_many(self, costs: Mapping[str, int], bucket: Bucket, now: int) -> dict[str, int | None]:
        """The buckets read in one batch and written in one transaction, a
        hundred people at a time: each write is conditional on the bucket
        being as it was read, so a charge that raced it makes the transaction
        read and try again, and nobody is overspent."""
        spent: dict[str, int | None] = {
            subject: None for subject, cost in costs.items() if cost > bucket.size
        }
        fitting = [subject for subject, cost in costs.items() if cost <= bucket.size]
        chunks = [
            {subject: costs[subject] for subject in fitting[start : start + MAX_TRANSACTION_ITEMS]}
            for start in range(0, len(fitting), MAX_TRANSACTION_ITEMS)
        ]
        for part in await asyncio.gather(*(self._spend_together(chunk, bucket, now) for chunk in chunks)):
            spent.update(part)
        return spent

    async def _spend_together(
        self, costs: Mapping[str, int], bucket: Bucket, now: int
    ) -> dict[str, int | None]:
        spent: dict[str, int | None] = {}
        left = dict(costs)
        expires = (now + bucket.micros(bucket.size)) // MICROS + 2
        for _ in range(ATTEMPTS):
            found = await self.table.batch_get([keys.rate(subject, "cost") for subject in left])
            writes: dict[str, tuple[Update, int]] = {}
            for subject, cost in left.items():
                key = keys.rate(subject, "cost")
                item = found.get(key)
                seen = int(item["fullAt"]) if item is not None and "fullAt" in item else None
                if seen is not None and seen > now + bucket.micros(bucket.size - cost):
                    spent[subject] = None  # the points are not there: nothing is written
                    continue
                full_at = max(seen or 0, now) + bucket.micros(cost)
                unchanged = NotExists("fullAt") if seen is None else eq("fullAt", seen)
                writes[subject] = (
                    Update(key, set={"fullAt": full_at, TTL_ATTRIBUTE: expires}, condition=unchanged),
                    full_at,
                )
            if not writes:
                return spent
            try:
                await self.table.transact([update for update, _ in writes.values()])
            except TransactionCancelled:
                # A bucket moved since it was read (an operation's charge, a
                # refund, another process's pass): nothing was written; read again.
                left = {subject: left[subject] for subject in writes}
                continue
            spent.update({subject: full_at for subject, (_, full_at) in writes.items()})
            return spent
        # Others kept moving these buckets: one at a time, as an operation's charge is.
        for subject, cost in left.items():
            spent[subject] = await self.spend(subject, cost, bucket, now)
        return spent

    async def refund(self, subject: str, points: int, bucket: Bucket, now: int) -> None:
        # Below `now` it means a full bucket, as any `full_at` in the past does.
        with contextlib.suppress(ConditionFailed):
            await self.table.update(
                Update(
                    keys.rate(subject, "cost"),
                    add={"fullAt": -bucket.micros(points)},
                    condition=Compare("fullAt", ">", now),
                )
            )

    async def full_at(self, subject: str) -> int:
        item = await self.table.get(keys.rate(subject, "cost"))
        return int(item["fullAt"]) if item is not None and "fullAt" in item else 0


def _micros(moment: datetime) -> int:
    return int(moment.timestamp() * MICROS)


class CostBudget:
    """Each person's bucket of cost points, across every operation and every
    subscription event delivered to them, shared by every process through
    `counter` (the table's, or Redis's where it is configured).

    An operation is admitted by what it could cost and charged that before it
    runs; what it did not use (lists that came back short) is refunded after.
    A refund is not waited for: the answer already says what it gave back."""

    def __init__(self, counter: BudgetCounter, bucket: Bucket) -> None:
        self.counter = counter
        self.bucket = bucket
        # Deliveries being charged together, by person (`charge_delivery`):
        # this pass of the loop's, spent together when it ends.
        self._deliveries: dict[str, _Deliveries] = {}
        self._passes: set[asyncio.Task[None]] = set()
        # Points a person's events were charged beyond their actual cost
        # (`credit`), taken off their next delivery's charge.
        self._credit: dict[str, int] = {}
        self._refunds: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self.bucket.enabled

    async def charge(self, subject: str, cost: int, now: datetime) -> BudgetState | None:
        """Takes `cost` points of `subject`'s bucket; RATE_LIMITED with
        `retryAfter`, `rateLimit` and `cost.throttleStatus` when they are not
        there. None when there is no budget."""
        if not self.enabled:
            return None
        moment = _micros(now)
        full_at = await self.counter.spend(subject, cost, self.bucket, moment)
        if full_at is not None:
            return BudgetState(self.bucket, cost, self.bucket.available(full_at, moment), full_at / MICROS)
        raise await self._refusal(subject, cost, now)

    async def _refusal(self, subject: str, cost: int, now: datetime) -> RateLimited:
        """RATE_LIMITED for `cost` points `subject`'s bucket did not hold, with
        what it holds now."""
        state = await self.state(subject, now)
        if cost > self.bucket.size:
            return RateLimited(
                f"this costs {cost} points, more than the {self.bucket.size} your budget holds; "
                "ask for smaller pages (first) or fewer nested lists",
                rateLimit=replace(state, cost=cost).extensions(),
                cost={"requestedQueryCost": cost, "throttleStatus": state.throttle_status()},
            )
        retry_after = max(1, math.ceil((cost - state.available) / self.bucket.restore_rate))
        return RateLimited(
            f"this costs {cost} points and {state.available} of your {self.bucket.size} are there "
            f"({_rate(self.bucket.restore_rate)} come back a second); try again in {retry_after} s",
            retryAfter=retry_after,
            rateLimit=replace(state, cost=cost).extensions(),
            cost={"requestedQueryCost": cost, "throttleStatus": state.throttle_status()},
        )

    def refund(self, subject: str, state: BudgetState, points: int, now: datetime) -> BudgetState:
        """Gives back `points` of a charge that cost less than it could; the
        state after, at once (the write follows on its own)."""
        if points <= 0:
            return state
        self._give_back(subject, points, now)
        return state.refunded(points)

    def _give_back(self, subject: str, points: int, now: datetime) -> None:
        async def give_back() -> None:
            try:
                await self.counter.refund(subject, points, self.bucket, _micros(now))
            except Exception as error:  # the store's failure: the person paid a little more, nothing else
                log.warning("could not refund %d cost points: %s", points, error)

        task = asyncio.get_running_loop().create_task(give_back())
        self._refunds.add(task)
        task.add_done_callback(self._refunds.discard)

    async def charge_delivery(self, subject: str, cost: int, now: datetime) -> None:
        """`charge` for one subscription event, together with every other event
        delivered in the same pass of the loop: one event reaches all of a
        person's subscriptions at once (their devices, their tabs), so theirs
        are one spend, fitting together or refused together; and it reaches
        every subscriber at once, so the pass's spends, each person's on its
        own, are one call of the counter (`BudgetCounter.spend_many`), not
        one each."""
        if not self.enabled:
            return
        pending = self._deliveries.get(subject)
        if pending is None:
            if not self._deliveries:
                asyncio.get_running_loop().call_soon(self._spend_deliveries)
            pending = _Deliveries(asyncio.get_running_loop().create_future(), now)
            pending.done.add_done_callback(_retrieved)
            self._deliveries[subject] = pending
        pending.cost += cost
        try:
            await asyncio.shield(pending.done)
        except Exception as error:
            # One error for every waiter: each raises it afresh, its traceback not grown by the others.
            raise error.with_traceback(None) from None

    def credit(self, subject: str, points: int) -> None:
        """Points an event was charged beyond what it really cost (its
        actual cost, known once it ran): its person's next delivery costs
        that much less, so events are charged their actual cost without a
        write of their own (`settle_credit` gives back what is left)."""
        if self.enabled and points > 0:
            self._credit[subject] = self._credit.get(subject, 0) + points

    def settle_credit(self, subject: str, now: datetime) -> None:
        """Gives back the credit a person's streams have left, as a refund."""
        points = self._credit.pop(subject, 0)
        if points > 0:
            self._give_back(subject, points, now)

    def _spend_deliveries(self) -> None:
        passed, self._deliveries = self._deliveries, {}
        owed: dict[str, _Deliveries] = {}
        for subject, pending in passed.items():
            credit = self._credit.pop(subject, 0)
            if credit >= pending.cost:
                # Paid already, by what earlier events were charged beyond their cost.
                if credit > pending.cost:
                    self._credit[subject] = credit - pending.cost
                pending.done.set_result(None)
                continue
            pending.cost -= credit
            owed[subject] = pending
        if owed:
            task = asyncio.get_running_loop().create_task(self._spend_pass(owed))
            self._passes.add(task)
            task.add_done_callback(self._passes.discard)

    async def _spend_pass(self, owed: dict[str, _Deliveries]) -> None:
        # The pass's moment: its deliveries were all asked for within it.
        now = min(pending.now for pending in owed.values())
        try:
            spent = await self.counter.spend_many(
                {subject: pending.cost for subject, pending in owed.items()}, self.bucket, _micros(now)
            )
        except Exception as error:  # the store's failure: every waiter's
            for pending in owed.values():
                pending.done.set_exception(error)
            return
        refused = [subject for subject in owed if spent.get(subject) is None]
        for subject, pending in owed.items():
            if subject not in refused:
                pending.done.set_result(None)

        async def refuse(pending: _Deliveries, subject: str) -> None:
            try:
                pending.done.set_exception(await self._refusal(subject, pending.cost, now))
            except Exception as error:  # the store's failure reading the bucket: refused all the same
                pending.done.set_exception(error)

        await asyncio.gather(*(refuse(owed[subject], subject) for subject in refused))

    async def state(self, subject: str, now: datetime) -> BudgetState:
        full_at = await self.counter.full_at(subject)
        moment = _micros(now)
        return BudgetState(
            self.bucket, 0, self.bucket.available(full_at, moment), max(full_at, moment) / MICROS
        )

    async def drain(self) -> None:
        """Waits for the refunds on their way (a server stopping, a test)."""
        while self._refunds:
            await asyncio.gather(*list(self._refunds), return_exceptions=True)


def _rate(points: float) -> str:
    return f"{points:g}"


@dataclass
class _Deliveries:
    done: asyncio.Future[None]
    now: datetime
    cost: int = 0


def _retrieved(future: asyncio.Future[None]) -> None:
    # Its waiters may all have gone (their streams closed): nothing to log then.
    if not future.cancelled():
        future.exception()


# Live subscriptions at once --------------------------------------------------------

STREAM_LEASE_SECONDS = 60.0
PROBES = 3


class Turns:
    """At most `per_key` holders of one key at a time, in this process; the
    others wait in the order they came. A key nobody holds or waits for
    takes no memory."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._keys: dict[str, _Turn] = {}

    async def take(self, key: str) -> Callable[[], None]:
        """Waits for a turn of `key`'s; what gives it back (once, however often called)."""
        turn = self._keys.get(key)
        if turn is None:
            turn = self._keys[key] = _Turn(asyncio.Semaphore(self.per_key))
        turn.users += 1
        try:
            await turn.slots.acquire()
        except BaseException:
            self._leave(key, turn)
            raise
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                turn.slots.release()
                self._leave(key, turn)

        return give_back

    def holders(self, key: str) -> int:
        """How many hold a turn of `key`'s or wait for one."""
        turn = self._keys.get(key)
        return 0 if turn is None else turn.users

    def _leave(self, key: str, turn: _Turn) -> None:
        turn.users -= 1
        if turn.users == 0:
            del self._keys[key]


@dataclass
class _Turn:
    slots: asyncio.Semaphore
    users: int = 0  # holding a turn or waiting for one


class StreamSlots:
    """At most `per_person` live subscriptions per person, across every
    connection, transport and process.

    A person has `per_person` slots in the table; a subscription holds one as
    a lease (its owner and an expiry), renewed by its process while it lives
    and deleted when it ends. A process that dies holds nothing past one lease:
    a slot whose lease ran out is free again. Taking a slot is a conditional
    write (free, or its lease over), so two processes never hold the same one.
    A process renews every slot it holds together (`renew`), a hundred
    conditional writes to a transaction: thousands of streams are tens of
    writes a period, not thousands."""

    def __init__(
        self,
        table: Table,
        per_person: int,
        lease_seconds: float = STREAM_LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table = table
        self.per_person = per_person
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.held: dict[Key, str] = {}
        self._renewing: asyncio.Task[None] | None = None

    async def hold(self, subject: str) -> Key:
        """A slot for one more subscription of `subject`; RATE_LIMITED when
        every slot is held. A few slots picked at random are tried first (a
        person holds a handful, so the first is free as a rule: one write);
        then the person's slots are read and the free ones tried."""
        owner = uuid.uuid4().hex
        for slot in random.sample(range(self.per_person), min(PROBES, self.per_person)):
            if await self._claim(keys.stream_slot(subject, slot), owner):
                return keys.stream_slot(subject, slot)
        now = self.clock()
        page = await self.table.query(keys.stream_slots_pk(subject), limit=self.per_person)
        taken = {str(item["SK"]) for item in page.items if float(item.get(TTL_ATTRIBUTE, 0)) > now}
        for slot in range(self.per_person):
            key = keys.stream_slot(subject, slot)
            if key[1] not in taken and await self._claim(key, owner):
                return key
        raise RateLimited(
            f"you have {self.per_person} live subscriptions open, the most there may be; "
            "end one before starting another",
            limit=self.per_person,
        )

    async def _claim(self, key: Key, owner: str) -> bool:
        """Takes the slot if it is free or its lease ran out (a conditional write)."""
        now = self.clock()
        claim = Update(
            key,
            set={"owner": owner, TTL_ATTRIBUTE: int(now + self.lease_seconds) + 1},
            condition=any_of(NotExists(), Compare(TTL_ATTRIBUTE, "<", int(now))),
        )
        try:
            await self.table.update(claim)
        except ConditionFailed:
            return False  # held by another subscription
        self.held[key] = owner
        self._renew_while_held()
        return True

    async def release(self, key: Key) -> None:
        owner = self.held.pop(key, None)
        if owner is None:
            return
        with contextlib.suppress(ConditionFailed):
            await self.table.delete(key, eq("owner", owner))

    def _renew_while_held(self) -> None:
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while self.held:
            await asyncio.sleep(self.lease_seconds / 3)
            await self.renew()

    async def renew(self) -> None:
        """Extends the lease of every slot this process holds, each still under
        the condition that it is this stream's: a transaction of a hundred
        slots at a time (one call and, on the embedded engine, one commit).
        A slot that ran out and was taken, or was released meanwhile, fails
        its condition: it is no longer ours, and the others are renewed
        without it. What the store fails to renew is tried again next period,
        within the lease."""
        expires = int(self.clock() + self.lease_seconds) + 1
        held = list(self.held.items())
        for start in range(0, len(held), MAX_TRANSACTION_ITEMS):
            if start:
                await asyncio.sleep(0)  # an engine that answers at once still lets requests in
            try:
                await self._renew_together(held[start : start + MAX_TRANSACTION_ITEMS], expires)
            except Exception:
                log.exception("could not renew a hundred subscriptions' slots")

    async def _renew_together(self, slots: list[tuple[Key, str]], expires: int) -> None:
        for _ in range(ATTEMPTS):
            # Those released since (or lost, below) are not renewed.
            slots = [(key, owner) for key, owner in slots if self.held.get(key) == owner]
            if not slots:
                return
            ops: list[WriteOp] = [
                Update(key, set={TTL_ATTRIBUTE: expires}, condition=eq("owner", owner))
                for key, owner in slots
            ]
            try:
                await self.table.transact(ops)
                return
            except TransactionCancelled as error:
                lost = {r.key for r in error.reasons if r.reason == "ConditionalCheckFailed"}
            for key, owner in slots:
                if key in lost and self.held.get(key) == owner:
                    del self.held[key]  # it ran out and was taken: not ours to renew
        raise StoreError(f"{len(slots)} slots' renewal kept being cancelled")

    async def stop(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
        for key in list(self.held):
            with contextlib.suppress(Exception):
                await self.release(key)


def _refusal(limit: Limit, window: int, moment: float) -> RateLimited:
    retry_after = max(1, math.ceil(window + limit.seconds - moment))
    return RateLimited(
        f"too many at once ({limit.count} per {_span(limit.seconds)}); try again in {retry_after} s",
        retryAfter=retry_after,
    )


def _span(seconds: int) -> str:
    if seconds % 86400 == 0:
        days = seconds // 86400
        return "day" if days == 1 else f"{days} days"
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return "hour" if hours == 1 else f"{hours} hours"
    if seconds % 60 == 0:
        minutes = seconds // 60
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds} s"


def client_address(peer: str | None, forwarded_for: str | None, trusted: Sequence[str]) -> str:
    """The client's address: the peer's, or, when the peer is a trusted proxy,
    the last address in X-Forwarded-For that is not itself a trusted proxy."""
    networks = [ipaddress.ip_network(entry, strict=False) for entry in trusted]

    def is_trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in network for network in networks)

    address = peer or "unknown"
    if not forwarded_for or not is_trusted(address):
        return address
    for hop in reversed([part.strip() for part in forwarded_for.split(",") if part.strip()]):
        if not is_trusted(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return address  # a malformed hop: the proxy's own address is all we know
        address = hop
    return address
