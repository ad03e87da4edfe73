"""One contract for every place the cost buckets are kept: the table (each
engine), Redis, and Redis that does not answer (the table keeps them meanwhile)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from resolvers.adapters.budget import RETRY_SECONDS, RedisBudgetCounter
from resolvers.core.errors import RateLimited
from resolvers.core.ratelimit import MICROS, Bucket, BudgetCounter, CostBudget, TableBudgetCounter
from store import keys
from store.port import MAX_TRANSACTION_ITEMS, Table
from tests.api.conftest import open_table
from tests.counting import CountingTable
from tests.servers import RedisProcess


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["sqlite", "dynamodb", "redis", "redis-down"])
async def counter(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BudgetCounter]:
    engine = "dynamodb" if request.param == "dynamodb" else "sqlite"
    moto_url = request.getfixturevalue("moto_server") if engine == "dynamodb" else None
    async with open_table(engine, tmp_path, moto_url) as table:
        in_table = TableBudgetCounter(table)
        if not request.param.startswith("redis"):
            yield in_table
            return
        url = (
            request.getfixturevalue("redis_url")
            if request.param == "redis"
            else f"redis://127.0.0.1:{closed_port()}/0"
        )
        in_redis = RedisBudgetCounter(url, fallback=in_table, prefix=f"test-{uuid.uuid4().hex[:8]}:")
        try:
            yield in_redis
        finally:
            await in_redis.close()


NOW = 1_800_000_000 * MICROS
BUCKET = Bucket(10, 1.0)  # ten points, one back a second


async def test_points_are_taken_while_they_are_there(counter: BudgetCounter) -> None:
    assert BUCKET.available(await counter.full_at("ana"), NOW) == 10
    full_at = await counter.spend("ana", 4, BUCKET, NOW)
    assert full_at is not None and BUCKET.available(full_at, NOW) == 6
    full_at = await counter.spend("ana", 6, BUCKET, NOW)
    assert full_at is not None and BUCKET.available(full_at, NOW) == 0
    assert await counter.spend("ana", 1, BUCKET, NOW) is None  # nothing more is there
    assert BUCKET.available(await counter.full_at("ana"), NOW) == 0
    assert await counter.spend("ben", 10, BUCKET, NOW) is not None  # a bucket each
    assert await counter.spend("cy", 11, BUCKET, NOW) is None  # more than a whole bucket
    assert await counter.full_at("cy") == 0


async def test_the_bucket_refills_at_its_rate_and_never_past_full(counter: BudgetCounter) -> None:
    assert await counter.spend("ana", 10, BUCKET, NOW) is not None
    three_seconds = NOW + 3 * MICROS
    assert BUCKET.available(await counter.full_at("ana"), three_seconds) == 3
    assert await counter.spend("ana", 4, BUCKET, three_seconds) is None
    assert await counter.spend("ana", 3, BUCKET, three_seconds) is not None
    much_later = NOW + 3600 * MICROS
    assert BUCKET.available(await counter.full_at("ana"), much_later) == 10
    full_at = await counter.spend("ana", 10, BUCKET, much_later)
    assert full_at is not None and BUCKET.available(full_at, much_later) == 0


async def test_a_refund_gives_back_what_was_not_used(counter: BudgetCounter) -> None:
    assert await counter.spend("ana", 8, BUCKET, NOW) is not None
    await counter.refund("ana", 5, BUCKET, NOW)
    assert BUCKET.available(await counter.full_at("ana"), NOW) == 7
    # Never past a full bucket, and nothing for a bucket already full.
    await counter.refund("ana", 50, BUCKET, NOW)
    assert BUCKET.available(await counter.full_at("ana"), NOW) == 10
    await counter.refund("ben", 5, BUCKET, NOW)
    assert await counter.spend("ben", 10, BUCKET, NOW) is not None
    assert await counter.spend("ben", 1, BUCKET, NOW) is None


async def test_spends_at_once_never_overspend(counter: BudgetCounter) -> None:
    bucket = Bucket(30, 1.0)
    spent = await asyncio.gather(*(counter.spend("ana", 3, bucket, NOW) for _ in range(25)))
    assert sum(1 for full_at in spent if full_at is not None) == 10
    assert bucket.available(await counter.full_at("ana"), NOW) == 0


async def test_with_redis_the_table_counts_nothing(redis_url: str, tmp_path: Path) -> None:
    async with open_table("sqlite", tmp_path, None) as table:
        in_table = TableBudgetCounter(table)
        in_redis = RedisBudgetCounter(redis_url, fallback=in_table, prefix=f"test-{uuid.uuid4().hex[:8]}:")
        try:
            assert await in_redis.spend("ana", 4, BUCKET, NOW) is not None
            assert await in_table.full_at("ana") == 0
        finally:
            await in_redis.close()


class Counted:
    """A counter that records each spend it is asked for."""

    def __init__(self, inner: BudgetCounter) -> None:
        self.inner = inner
        self.spends: list[int] = []

    async def spend(self, subject: str, cost: int, bucket: Bucket, now: int) -> int | None:
        self.spends.append(cost)
        return await self.inner.spend(subject, cost, bucket, now)

    async def spend_many(self, costs: Mapping[str, int], bucket: Bucket, now: int) -> dict[str, int | None]:
        self.spends += costs.values()
        return await self.inner.spend_many(costs, bucket, now)

    async def refund(self, subject: str, points: int, bucket: Bucket, now: int) -> None:
        await self.inner.refund(subject, points, bucket, now)

    async def full_at(self, subject: str) -> int:
        return await self.inner.full_at(subject)


async def test_one_event_to_a_persons_subscriptions_is_one_spend(counter: BudgetCounter) -> None:
    counted = Counted(counter)
    bucket = Bucket(20, 0.001)
    budget = CostBudget(counted, bucket)
    now = datetime.fromtimestamp(NOW / MICROS, UTC)
    await asyncio.gather(*(budget.charge_delivery("ana", 3, now) for _ in range(5)))
    assert counted.spends == [15]
    # The next event does not fit for all five: all five are refused, nothing is spent.
    refused = await asyncio.gather(
        *(budget.charge_delivery("ana", 3, now) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(error, RateLimited) for error in refused)
    assert bucket.available(await counter.full_at("ana"), NOW) == 5


class CountingTableCounter(TableBudgetCounter):
    spends = 0

    async def spend(self, subject: str, cost: int, bucket: Bucket, now: int) -> int | None:
        self.spends += 1
        return await super().spend(subject, cost, bucket, now)


async def test_a_frozen_redis_costs_one_timeout_per_interval_not_one_per_operation(tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path / "redis").start()
    assert redis.process is not None
    clock = [1000.0]
    async with open_table("sqlite", tmp_path, None) as table:
        fallback = CountingTableCounter(table)
        counter = RedisBudgetCounter(redis.url, fallback=fallback, monotonic=lambda: clock[0])
        tried = []
        script = counter._spend

        async def counted(**kwargs: Any) -> Any:
            tried.append(clock[0])
            return await script(**kwargs)

        counter._spend = counted  # type: ignore[assignment]  # counts the calls that reach Redis
        try:
            assert await counter.spend("ana", 1, BUCKET, NOW) is not None
            os.kill(redis.process.pid, signal.SIGSTOP)  # frozen, not dead: it accepts and never answers
            for _ in range(10):
                assert await counter.spend("ana", 0, BUCKET, NOW) is not None
            assert (len(tried), fallback.spends) == (2, 10)  # one timeout, then the table alone
            clock[0] += RETRY_SECONDS
            await asyncio.gather(*(counter.spend("ana", 0, BUCKET, NOW) for _ in range(5)))
            assert (len(tried), fallback.spends) == (3, 15)  # one call alone tried it again
            os.kill(redis.process.pid, signal.SIGCONT)
            clock[0] += RETRY_SECONDS
            for _ in range(3):
                assert await counter.spend("ana", 0, BUCKET, NOW) is not None
            assert (len(tried), fallback.spends) == (6, 15)  # back in Redis
        finally:
            os.kill(redis.process.pid, signal.SIGCONT)
            await counter.close()
            redis.stop()


async def test_spends_together_take_each_persons_points_on_their_own(counter: BudgetCounter) -> None:
    assert await counter.spend("ana", 8, BUCKET, NOW) is not None
    spent = await counter.spend_many({"ana": 4, "ben": 4, "cy": 11}, BUCKET, NOW)
    assert spent["ana"] is None  # two left: refused, nothing taken
    assert spent["cy"] is None  # more than a whole bucket
    ben = spent["ben"]
    assert ben is not None and BUCKET.available(ben, NOW) == 6
    assert BUCKET.available(await counter.full_at("ana"), NOW) == 2
    assert BUCKET.available(await counter.full_at("cy"), NOW) == 10


async def test_spends_together_and_alone_at_once_never_overspend(counter: BudgetCounter) -> None:
    bucket = Bucket(30, 1.0)
    together = [counter.spend_many({"ana": 3, f"other{n}": 1}, bucket, NOW) for n in range(12)]
    alone = [counter.spend("ana", 3, bucket, NOW) for _ in range(13)]
    passes = await asyncio.gather(*together)
    spent = [*(found["ana"] for found in passes), *await asyncio.gather(*alone)]
    assert sum(1 for full_at in spent if full_at is not None) == 10
    assert bucket.available(await counter.full_at("ana"), NOW) == 0
    assert all(found[f"other{n}"] is not None for n, found in enumerate(passes))


async def test_a_person_past_their_budget_is_refused_alone_in_a_pass(counter: BudgetCounter) -> None:
    bucket = Bucket(10, 0.001)
    budget = CostBudget(counter, bucket)
    now = datetime.fromtimestamp(NOW / MICROS, UTC)
    await budget.charge("ana", 9, now)
    delivered = await asyncio.gather(
        budget.charge_delivery("ana", 2, now),
        budget.charge_delivery("ben", 2, now),
        budget.charge_delivery("ben", 2, now),
        return_exceptions=True,
    )
    assert isinstance(delivered[0], RateLimited) and "retryAfter" in delivered[0].extensions
    assert list(delivered[1:]) == [None, None]
    assert bucket.available(await counter.full_at("ana"), NOW) == 1
    assert bucket.available(await counter.full_at("ben"), NOW) == 6


PEOPLE = 250
SUBSCRIPTIONS = 1_000


async def test_one_event_to_many_subscribers_is_a_few_store_calls_not_one_per_person(table: Table) -> None:
    """An event reaching 1,000 subscriptions of 250 people in one pass of the
    loop: each person charged once, all of them in a read and a transaction
    per hundred people."""
    counting = CountingTable(table)
    bucket = Bucket(1_000, 50.0)
    budget = CostBudget(TableBudgetCounter(counting), bucket)
    now = datetime.fromtimestamp(NOW / MICROS, UTC)
    people = [f"fan{n}" for n in range(PEOPLE)]
    await asyncio.gather(*(budget.charge_delivery(people[n % PEOPLE], 2, now) for n in range(SUBSCRIPTIONS)))
    calls = sum(counting.budget_calls.values()) + counting.total_calls
    assert calls <= 2 * math.ceil(PEOPLE / MAX_TRANSACTION_ITEMS), counting.budget_calls
    buckets = await table.batch_get([keys.rate(person, "cost") for person in people])
    assert len(buckets) == PEOPLE
    each = SUBSCRIPTIONS // PEOPLE * 2
    assert {bucket.available(int(item["fullAt"]), NOW) for item in buckets.values()} == {1_000 - each}
