"""A budget of cost points per person and minute (`MIFAMILIAS_COST_BUDGET`),
in process on both engines: operations spend their estimate, subscription
events (replayed or live) spend their own cost as they are delivered, and
past the budget the answer is RATE_LIMITED with `retryAfter` and the budget's
state, GitHub's `rateLimit` model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Api, running_api
from tests.api.test_resume import NOTES, note_for, stream
from tests.factories import family_with_members

pytestmark = pytest.mark.usefixtures("turns_without_time")

BUDGET = 10
# `me` and `rateLimit` are one object each: 2 points.
ME = "{ me { id } rateLimit { limit cost used remaining resetAt } }"


def next_minute(api: Api) -> None:
    """The fake clock at the start of the next minute: a fresh budget."""
    api.clock.advance(seconds=60 - api.clock().timestamp() % 60)


@pytest.fixture(params=["sqlite", "dynamodb"])
async def budget_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(request.param, "local", tmp_path, request, cost_budget=BUDGET) as api:
        yield api


async def test_operations_spend_the_budget_then_are_refused_until_the_minute_turns(budget_api: Api) -> None:
    api = budget_api
    await api.sign_in("ana", "ben")
    next_minute(api)
    states = [(await api.ok(ME, as_="ana"))["rateLimit"] for _ in range(BUDGET // 2)]
    assert [s["used"] for s in states] == [2, 4, 6, 8, 10]
    assert states[-1] == {
        "limit": BUDGET,
        "cost": 2,
        "used": 10,
        "remaining": 0,
        "resetAt": states[0]["resetAt"],
    }
    api.table.reset()  # type: ignore[attr-defined]
    body = await api.post(ME, as_="ana")
    assert body["data"] is None
    error = body["errors"][0]
    assert error["extensions"]["code"] == "RATE_LIMITED"
    assert error["extensions"]["retryAfter"] == 60
    assert (
        error["extensions"]["rateLimit"]["remaining"] == 0 and error["extensions"]["rateLimit"]["cost"] == 2
    )
    # Only the budget was touched: the operation did not run.
    assert set(api.table.calls) <= {"update", "get"}  # type: ignore[attr-defined]
    # Another person has a budget of their own.
    assert (await api.ok(ME, as_="ben"))["rateLimit"]["used"] == 2
    api.clock.advance(seconds=60)
    assert (await api.ok(ME, as_="ana"))["rateLimit"]["used"] == 2


async def test_an_operation_over_the_whole_budget_is_refused(budget_api: Api) -> None:
    await budget_api.sign_in("ana")
    next_minute(budget_api)
    # 20 memberships and their 20 families: 40 points, more than a minute holds.
    code, message = await budget_api.error("{ myFamilies { family { id name } } }", as_="ana")
    assert code == "RATE_LIMITED" and "costs 40 points" in message and "10 of your 10" in message


async def test_a_replay_spends_the_budget_event_by_event(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each event of `notificationAdded(after:)` costs what its selection does
    (1, a Notification); five replayed of a budget of 3 stop at the fourth."""
    async with running_api("sqlite", "local", tmp_path, request, cost_budget=3) as api:
        family_id = await family_with_members(api, "ana", [])
        first = await note_for(api, "ana", family_id)
        for _ in range(5):
            await note_for(api, "ana", family_id)
        next_minute(api)
        async with stream(api, NOTES, first.id, "ana") as events:
            results: list[Any] = []
            for _ in range(4):
                results.append(await asyncio.wait_for(events.__anext__(), 30))
    assert [r.errors is None for r in results] == [True, True, True, False]
    refusal = results[3].errors[0]
    assert refusal.extensions["code"] == "RATE_LIMITED"
    assert refusal.extensions["rateLimit"]["used"] == 3


async def test_a_replay_is_bounded_by_what_its_events_cost(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A replay may send events worth ten operations at the cost limit: with a
    limit of 3 and events of 1, thirty; the thirty-first missed is refused with
    a reason, and the stream ends."""
    async with running_api("sqlite", "local", tmp_path, request, max_query_cost=3) as api:
        family_id = await family_with_members(api, "ana", [])
        first = await note_for(api, "ana", family_id)
        for _ in range(30):
            await note_for(api, "ana", family_id)
        async with stream(api, NOTES, first.id, "ana") as events:
            replayed = [await asyncio.wait_for(events.__anext__(), 30) for _ in range(30)]
        assert all(r.errors is None for r in replayed)
        await note_for(api, "ana", family_id)
        async with stream(api, NOTES, first.id, "ana") as events:
            refused = await asyncio.wait_for(events.__anext__(), 30)
    assert refused.errors[0].extensions["code"] == "BAD_USER_INPUT"
    assert "more than 30 notifications" in refused.errors[0].message
