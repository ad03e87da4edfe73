"""The cost budget's buckets in Redis, where Redis is configured: one key per
person holding when their bucket is full again, charged by a script so that
the check and the charge are one step for every process (a budget is charged
on every operation, and a Redis round trip is cheaper than a conditional write
to the table).

If Redis does not answer, the buckets are kept in the table until it does:
the budget still holds, though a person could spend up to a second bucket
while Redis went or came back. It never turns a request away because Redis is
down. Nor does it make every request wait for Redis's timeout: after a
failure, the table keeps the buckets for `RETRY_SECONDS`, and then one call
alone tries Redis again (a circuit breaker), so a frozen Redis costs a process
one timeout per interval, not one per operation."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from resolvers.core.ratelimit import Bucket, BudgetCounter

log = logging.getLogger(__name__)

# KEYS[1]: the person's bucket; ARGV: now, the cost's time, the latest full_at
# with room for it (all microseconds). The key expires once the bucket is full.
SPEND = """
local now = tonumber(ARGV[1])
local full_at = tonumber(redis.call('GET', KEYS[1]) or '0')
if full_at > tonumber(ARGV[3]) then
  return -1
end
if full_at < now then
  full_at = now
end
full_at = full_at + tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%d', full_at), 'PXAT', math.floor(full_at / 1000) + 1000)
return full_at
"""
# KEYS[1]: the person's bucket; ARGV: now, the refund's time.
REFUND = """
local full_at = tonumber(redis.call('GET', KEYS[1]) or '0')
if full_at <= tonumber(ARGV[1]) then
  return 0
end
full_at = full_at - tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%d', full_at), 'KEEPTTL')
return 1
"""
# A stalled Redis must not stall every operation behind it.
TIMEOUT_SECONDS = 1.0
# After a failure, how long the table alone keeps the buckets before one call
# tries Redis again.
RETRY_SECONDS = 5.0


class RedisBudgetCounter:
    def __init__(
        self,
        url: str,
        fallback: BudgetCounter,
        prefix: str = "mifamilias:",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis.asyncio as redis
        from redis.exceptions import NoScriptError

        self._redis: Any = redis.from_url(
            url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS
        )
        self._spend = self._redis.register_script(SPEND)
        self._refund = self._redis.register_script(REFUND)
        self._fallback = fallback
        self._prefix = prefix
        self._down = False
        self._monotonic = monotonic
        self._retry_at = 0.0
        self._probing = False
        self._probe_started = 0.0
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._no_script: type[BaseException] = NoScriptError

    def _key(self, subject: str) -> str:
        return f"{self._prefix}bucket:{subject}"

    async def spend(self, subject: str, cost: int, bucket: Bucket, now: int) -> int | None:
        if cost > bucket.size:
            return None
        latest = now + bucket.micros(bucket.size - cost)
        if not self._use_redis():
            return await self._fallback.spend(subject, cost, bucket, now)
        try:
            full_at = int(
                await self._spend(keys=[self._key(subject)], args=[now, bucket.micros(cost), latest])
            )
        except self._errors as error:
            self._went(error)
            return await self._fallback.spend(subject, cost, bucket, now)
        self._back()
        return None if full_at < 0 else full_at

    async def spend_many(self, costs: Mapping[str, int], bucket: Bucket, now: int) -> dict[str, int | None]:
        """One round trip: the script for each person, pipelined (each still
        checks and charges its own bucket in one step)."""
        spent: dict[str, int | None] = {
            subject: None for subject, cost in costs.items() if cost > bucket.size
        }
        fitting = {subject: cost for subject, cost in costs.items() if cost <= bucket.size}
        if not fitting:
            return spent
        if not self._use_redis():
            spent.update(await self._fallback.spend_many(fitting, bucket, now))
            return spent
        try:
            answers = await self._spend_pipelined(fitting, bucket, now)
        except self._errors as error:
            self._went(error)
            spent.update(await self._fallback.spend_many(fitting, bucket, now))
            return spent
        self._back()
        for subject, answer in zip(fitting, answers, strict=True):
            spent[subject] = None if int(answer) < 0 else int(answer)
        return spent

    async def _spend_pipelined(self, costs: Mapping[str, int], bucket: Bucket, now: int) -> list[Any]:
        # By the script's hash alone (redis-py's own pipelining of a script asks
        # Redis first whether it has it: a second round trip every time). A
        # Redis that lost its scripts answers NOSCRIPT to every one of them, so
        # nothing was spent, and the pass is sent again once it has the script.
        for attempt in range(2):
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for subject, cost in costs.items():
                        latest = now + bucket.micros(bucket.size - cost)
                        pipe.evalsha(self._spend.sha, 1, self._key(subject), now, bucket.micros(cost), latest)
                    return list(await pipe.execute())
            except self._no_script:
                if attempt:
                    raise
                self._spend.sha = await self._redis.script_load(SPEND)
        raise AssertionError("unreachable")  # pragma: no cover

    async def refund(self, subject: str, points: int, bucket: Bucket, now: int) -> None:
        if not self._use_redis():
            await self._fallback.refund(subject, points, bucket, now)
            return
        try:
            await self._refund(keys=[self._key(subject)], args=[now, bucket.micros(points)])
        except self._errors as error:
            self._went(error)
            await self._fallback.refund(subject, points, bucket, now)
            return
        self._back()

    async def full_at(self, subject: str) -> int:
        if not self._use_redis():
            return await self._fallback.full_at(subject)
        try:
            found = await self._redis.get(self._key(subject))
        except self._errors as error:
            self._went(error)
            return await self._fallback.full_at(subject)
        self._back()
        return int(found or 0)

    def _use_redis(self) -> bool:
        """Whether this call goes to Redis: always while it answers; after a
        failure, none until the retry time, then the first call alone."""
        if not self._down:
            return True
        now = self._monotonic()
        # A probe that neither failed nor answered (its operation was cancelled)
        # stops counting after two timeouts.
        probing = self._probing and now - self._probe_started < 2 * TIMEOUT_SECONDS
        if probing or now < self._retry_at:
            return False
        self._probing, self._probe_started = True, now
        return True

    def _went(self, error: BaseException) -> None:
        self._probing = False
        self._retry_at = self._monotonic() + RETRY_SECONDS
        if not self._down:
            self._down = True
            log.warning("the cost budget's Redis fails (%s); its buckets are kept in the table", error)

    def _back(self) -> None:
        self._probing = False
        if self._down:
            self._down = False
            log.warning("the cost budget's Redis is back; its buckets are kept there")

    async def close(self) -> None:
        await self._redis.aclose()
