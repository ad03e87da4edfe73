"""One contract for every place the cost budget is counted: the table (each
engine), Redis, and Redis that does not answer (the table counts meanwhile)."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from resolvers.adapters.budget import RedisBudgetCounter
from resolvers.core.errors import RateLimited
from resolvers.core.ratelimit import BUDGET_SECONDS, BudgetCounter, CostBudget, TableBudgetCounter
from tests.api.conftest import open_table

WINDOW = 1_800_000_000 // BUDGET_SECONDS * BUDGET_SECONDS


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


async def test_points_are_spent_while_they_fit(counter: BudgetCounter) -> None:
    assert await counter.spend("ana", WINDOW, 4, 10) == 4
    assert await counter.spend("ana", WINDOW, 6, 10) == 10
    assert await counter.spend("ana", WINDOW, 1, 10) is None  # nothing more fits
    assert await counter.used("ana", WINDOW) == 10
    assert await counter.spend("ben", WINDOW, 10, 10) == 10  # a budget each
    assert await counter.spend("cy", WINDOW, 11, 10) is None  # more than a whole budget
    assert await counter.used("cy", WINDOW) == 0


async def test_a_new_minute_starts_from_nothing(counter: BudgetCounter) -> None:
    assert await counter.spend("ana", WINDOW, 10, 10) == 10
    later = WINDOW + BUDGET_SECONDS
    assert await counter.used("ana", later) == 0
    assert await counter.spend("ana", later, 3, 10) == 3


async def test_spends_at_once_never_overspend(counter: BudgetCounter) -> None:
    spent = await asyncio.gather(*(counter.spend("ana", WINDOW, 3, 30) for _ in range(25)))
    assert sum(1 for used in spent if used is not None) == 10
    assert await counter.used("ana", WINDOW) == 30


async def test_with_redis_the_table_counts_nothing(redis_url: str, tmp_path: Path) -> None:
    async with open_table("sqlite", tmp_path, None) as table:
        in_table = TableBudgetCounter(table)
        in_redis = RedisBudgetCounter(redis_url, fallback=in_table, prefix=f"test-{uuid.uuid4().hex[:8]}:")
        try:
            assert await in_redis.spend("ana", WINDOW, 4, 10) == 4
            assert await in_table.used("ana", WINDOW) == 0
        finally:
            await in_redis.close()


class Counted:
    """A counter that records each spend it is asked for."""

    def __init__(self, inner: BudgetCounter) -> None:
        self.inner = inner
        self.spends: list[int] = []

    async def spend(self, subject: str, window: int, cost: int, limit: int) -> int | None:
        self.spends.append(cost)
        return await self.inner.spend(subject, window, cost, limit)

    async def used(self, subject: str, window: int) -> int:
        return await self.inner.used(subject, window)


async def test_one_event_to_a_persons_subscriptions_is_one_spend(counter: BudgetCounter) -> None:
    counted = Counted(counter)
    budget = CostBudget(counted, 20)
    now = datetime.fromtimestamp(WINDOW + 1, UTC)
    await asyncio.gather(*(budget.charge_delivery("ana", 3, now) for _ in range(5)))
    assert counted.spends == [15]
    # The next event does not fit for all five: all five are refused, nothing is spent.
    refused = await asyncio.gather(
        *(budget.charge_delivery("ana", 3, now) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(error, RateLimited) for error in refused)
    assert await counter.used("ana", WINDOW) == 15
