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

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from resolvers.core.errors import RateLimited
from store import keys
from store.port import (
    TTL_ATTRIBUTE,
    Compare,
    ConditionFailed,
    NotExists,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
    all_of,
    any_of,
    eq,
)


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
    # Wrong invite codes from one client address, whoever is signed in.
    "join-address": Limit(30, 600),
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


class RateLimiter:
    def __init__(self, table: Table, limits: Mapping[str, Limit]) -> None:
        self.table = table
        self.limits = limits

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
        self, subject: str, action: str, now: datetime, ops: Sequence[WriteOp], seen: int | None = None
    ) -> None:
        """Runs the transaction `ops` with one more `action` counted in it, under
        the condition that the window has room: RATE_LIMITED when it has none,
        and then nothing of `ops` is written either."""
        found = self._window(action, now)
        if found is None:
            await self.table.transact(ops)
            return
        limit, window, moment = found
        key = keys.rate(subject, action)
        add, start = self._updates(subject, action, limit, window)
        order = (add, start) if seen == window else (start, add)
        for _ in range(ATTEMPTS):
            for update in order:
                try:
                    await self.table.transact([*ops, update])
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


def _refusal(limit: Limit, window: int, moment: float) -> RateLimited:
    retry_after = max(1, math.ceil(window + limit.seconds - moment))
    return RateLimited(
        f"too many at once ({limit.count} per {_span(limit.seconds)}); try again in {retry_after} s",
        retryAfter=retry_after,
    )


def _span(seconds: int) -> str:
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
