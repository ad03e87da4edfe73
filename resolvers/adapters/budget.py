"""The cost budget's counter in Redis, where Redis is configured: one key per
person and minute, spent by a script so that the check and the increment are
one step for every process (a budget is charged on every operation, and a
Redis round trip is cheaper than a conditional write to the table).

If Redis does not answer, the budget is counted in the table until it does:
the budget still holds, though a person could spend up to a second budget
during the minute Redis went or came back. It never turns a request away
because Redis is down."""

from __future__ import annotations

import logging
from typing import Any

from resolvers.core.ratelimit import BUDGET_SECONDS, BudgetCounter

log = logging.getLogger(__name__)

# KEYS[1]: the person's minute; ARGV: cost, limit, when the key expires.
SPEND = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local cost = tonumber(ARGV[1])
if used + cost > tonumber(ARGV[2]) then
  return -1
end
used = redis.call('INCRBY', KEYS[1], cost)
redis.call('EXPIREAT', KEYS[1], tonumber(ARGV[3]))
return used
"""
# A stalled Redis must not stall every operation behind it.
TIMEOUT_SECONDS = 1.0


class RedisBudgetCounter:
    def __init__(self, url: str, fallback: BudgetCounter, prefix: str = "mifamilias:") -> None:
        import redis.asyncio as redis

        self._redis: Any = redis.from_url(
            url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS
        )
        self._spend = self._redis.register_script(SPEND)
        self._fallback = fallback
        self._prefix = prefix
        self._down = False
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)

    def _key(self, subject: str, window: int) -> str:
        return f"{self._prefix}budget:{subject}:{window}"

    async def spend(self, subject: str, window: int, cost: int, limit: int) -> int | None:
        # The key outlives its minute by one more, for processes whose clocks differ a little.
        expires = window + 2 * BUDGET_SECONDS
        try:
            used = int(await self._spend(keys=[self._key(subject, window)], args=[cost, limit, expires]))
        except self._errors as error:
            self._went(error)
            return await self._fallback.spend(subject, window, cost, limit)
        self._back()
        return None if used < 0 else used

    async def used(self, subject: str, window: int) -> int:
        try:
            found = await self._redis.get(self._key(subject, window))
        except self._errors as error:
            self._went(error)
            return await self._fallback.used(subject, window)
        self._back()
        return int(found or 0)

    def _went(self, error: BaseException) -> None:
        if not self._down:
            self._down = True
            log.warning("Redis is not answering (%s); the cost budget is counted in the table", error)

    def _back(self) -> None:
        if self._down:
            self._down = False
            log.warning("Redis answers again; the cost budget is counted there")

    async def close(self) -> None:
        await self._redis.aclose()
