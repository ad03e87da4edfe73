"""Each person's leaky bucket of cost points (`MIFAMILIAS_COST_BUDGET`,
`MIFAMILIAS_COST_RESTORE_RATE`), in process on both engines: an operation is
admitted by its requested cost and charged its actual cost (Shopify's
`extensions.cost`), subscription events (replayed or live) take their own cost
as they are delivered, and with the bucket short the answer is RATE_LIMITED
with `retryAfter` and the bucket's state (GitHub's `rateLimit` names too). On
the default settings, the home screen is admitted, a person at a human pace is
never throttled, and one hammering heavy queries is within seconds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Api, running_api
from tests.api.test_resume import NOTES, next_data, note_for, stream
from tests.factories import family_with_members, settle, upload
from tests.typical_calls import HOME_QUERY, VIEWERS, build_world

pytestmark = pytest.mark.usefixtures("turns_without_time")

BUDGET = 10
RESTORE = 1.0  # a point a second: the fake clock's own ticks (3 ms a reading) refill nothing whole
# `me` and `rateLimit` are one object each: 2 points.
ME = "{ me { id } rateLimit { limit cost used remaining resetAt } }"


@pytest.fixture(params=["sqlite", "dynamodb"])
async def budget_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(
        request.param, "local", tmp_path, request, cost_budget=BUDGET, cost_restore_rate=RESTORE
    ) as api:
        yield api


@pytest.fixture(params=["sqlite", "dynamodb"])
async def default_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    """The settings a fresh deployment gets."""
    async with running_api(request.param, "local", tmp_path, request) as api:
        yield api


async def test_operations_take_from_the_bucket_then_wait_for_it_to_refill(budget_api: Api) -> None:
    api = budget_api
    await api.sign_in("ana", "ben")
    api.clock.advance(seconds=BUDGET / RESTORE)  # the sign-ins' points are back: a full bucket
    states = [(await api.ok(ME, as_="ana"))["rateLimit"] for _ in range(BUDGET // 2)]
    assert [s["used"] for s in states] == [2, 4, 6, 8, 10]
    assert states[-1]["limit"] == BUDGET and states[-1]["cost"] == 2 and states[-1]["remaining"] == 0
    api.table.reset()  # type: ignore[attr-defined]
    body = await api.post(ME, as_="ana")
    assert body["data"] is None
    error = body["errors"][0]
    assert error["extensions"]["code"] == "RATE_LIMITED"
    assert error["extensions"]["retryAfter"] == 2  # two points, at a point a second
    assert (
        error["extensions"]["rateLimit"]["remaining"] == 0 and error["extensions"]["rateLimit"]["cost"] == 2
    )
    assert error["extensions"]["cost"]["throttleStatus"] == {
        "maximumAvailable": BUDGET,
        "currentlyAvailable": 0,
        "restoreRate": RESTORE,
    }
    # Only the bucket was touched: the operation did not run.
    assert dict(api.table.calls) == {}  # type: ignore[attr-defined]
    # Another person has a bucket of their own.
    assert (await api.ok(ME, as_="ben"))["rateLimit"]["used"] == 2
    api.clock.advance(seconds=2)
    assert (await api.ok(ME, as_="ana"))["rateLimit"]["remaining"] == 0


async def test_an_operation_over_the_whole_bucket_is_refused_without_a_retry(budget_api: Api) -> None:
    await budget_api.sign_in("ana")
    # The viewer, and 20 notifications that could come: 22 points, more than the bucket holds.
    query = "{ me { id } notifications(first: 20) { edges { node { id } } } }"
    body = await budget_api.post(query, as_="ana")
    error = body["errors"][0]
    assert error["extensions"]["code"] == "RATE_LIMITED" and "retryAfter" not in error["extensions"]
    assert "more than the 10 your budget holds" in error["message"]


@pytest.fixture(params=["sqlite", "dynamodb"])
async def still_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    """The default bucket, refilling too slowly to see (the fake clock ticks a
    little at every reading)."""
    async with running_api(request.param, "local", tmp_path, request, cost_restore_rate=0.0001) as api:
        yield api


async def test_a_short_list_is_charged_what_came_back_and_the_rest_refunded(still_api: Api) -> None:
    api = still_api
    family_id = await family_with_members(api, "ana", ["ben"])
    await upload(api, "ben", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    await api.sign_in("ana")
    feed = """query($id: ID!) { family(id: $id) { feed(first: 20) { edges { node { id
      author { givenName } comments(first: 5) { edges { node { id } } } } } } } }"""
    await api.services.rates.budget.drain()  # earlier operations' refunds, all in
    before = (await api.post("{ me { id } }", as_="ana"))["extensions"]["cost"]["throttleStatus"]
    body = await api.post(feed, {"id": family_id}, as_="ana")
    cost = body["extensions"]["cost"]
    # Requested: the family, its feed, 20 edges and nodes, their authors, their comment
    # pages and 5 edges and nodes in each. Actual: one post came back, with no comments.
    assert cost["requestedQueryCost"] == 1 + 1 + 20 * (1 + 1 + 1 + 1 + 5 + 5)
    assert cost["actualQueryCost"] == 1 + 1 + (1 + 1 + 1 + 1)
    # Taken: the actual cost, not the requested one.
    status = cost["throttleStatus"]
    assert status["currentlyAvailable"] == before["currentlyAvailable"] - cost["actualQueryCost"]
    assert status["maximumAvailable"] == api.services.settings.cost_budget
    # The refund is the bucket's, not only the answer's: the next operation sees it.
    await api.services.rates.budget.drain()
    after = (await api.post("{ me { id } }", as_="ana"))["extensions"]["cost"]["throttleStatus"]
    assert after["currentlyAvailable"] == status["currentlyAvailable"] - 1


# An event whose family has one member, but whose selection could hold twenty:
# requested 1 + 1 + 1 + 20 + 20 = 43, actual 1 + 1 + 1 + 1 + 1 = 5.
LISTED_NOTES = """subscription($after: ID) { notificationAdded(after: $after) { id
  family { id members(first: 20) { edges { node { role } } } } } }"""


async def test_subscription_events_are_charged_their_actual_cost(still_api: Api) -> None:
    api = still_api
    family_id = await family_with_members(api, "ana", [])
    first = await note_for(api, "ana", family_id)
    for _ in range(3):
        await note_for(api, "ana", family_id)
    await api.services.rates.budget.drain()
    before = (await api.post("{ me { id } }", as_="ana"))["extensions"]["cost"]["throttleStatus"]
    async with stream(api, LISTED_NOTES, first.id, "ana") as events:
        replayed = [await asyncio.wait_for(events.__anext__(), 30) for _ in range(3)]
    assert all(r.errors is None for r in replayed), [r.errors for r in replayed]
    assert all(len(r.data["notificationAdded"]["family"]["members"]["edges"]) == 1 for r in replayed)
    await api.services.rates.budget.drain()  # the stream's credit, given back as it closed
    after = (await api.post("{ me { id } }", as_="ana"))["extensions"]["cost"]["throttleStatus"]
    # Three events of 5, and the `me` that reads the bucket (1): not three of 43.
    assert after["currentlyAvailable"] == before["currentlyAvailable"] - 3 * 5 - 1


async def test_a_persons_replays_take_turns_and_nobody_elses_wait(still_api: Api) -> None:
    """At most MAX_REPLAYS_PER_PERSON (2) of one person's replays run at once;
    a third waits until one of them has sent what it replays, and another
    person's replay does not wait at all."""
    api = still_api
    turns = api.services.rates.replays
    assert turns.per_key == api.services.settings.max_replays_per_person == 2
    family_id = await family_with_members(api, "ana", ["ben"])
    first = {person: await note_for(api, person, family_id) for person in ("ana", "ben")}
    for _ in range(3):
        for person in ("ana", "ben"):
            await note_for(api, person, family_id)
    async with contextlib.AsyncExitStack() as streams:
        one, two, three = [
            await streams.enter_async_context(stream(api, NOTES, first["ana"].id, "ana")) for _ in range(3)
        ]
        for replaying in (one, two):
            assert (await next_data(replaying))["notificationAdded"]["type"] == "MEMBER_JOINED"
        third = asyncio.ensure_future(next_data(three))
        await until_true(lambda: turns.holders("ana") == 3)  # two replaying, the third waiting
        assert not third.done()
        # Another person's replay goes at once.
        async with stream(api, NOTES, first["ben"].id, "ben") as bens:
            assert (await next_data(bens))["notificationAdded"]["type"] == "MEMBER_JOINED"
        # The first sends the rest of its replay and goes on live: its turn is the third's.
        for _ in range(2):
            await next_data(one)
        live = asyncio.ensure_future(one.__anext__())
        assert (await asyncio.wait_for(third, 30))["notificationAdded"]["type"] == "MEMBER_JOINED"
        live.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await live
    assert turns.holders("ana") == 0


async def until_true(condition: Callable[[], bool]) -> None:
    """Lets the loop run until `condition` holds (a hang guard of 30 s)."""
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0)


async def test_the_home_screen_is_admitted_on_the_default_settings(default_api: Api) -> None:
    api = default_api
    await build_world(api, api.clock)
    for viewer in VIEWERS:
        body = await api.post(HOME_QUERY, as_=viewer)
        codes = [e["extensions"]["code"] for e in body.get("errors") or ()]
        assert "RATE_LIMITED" not in codes and "BAD_USER_INPUT" not in codes, (viewer, body.get("errors"))
        cost = body["extensions"]["cost"]
        assert cost["actualQueryCost"] <= cost["requestedQueryCost"] <= api.services.settings.max_query_cost


HEAVY = """query($id: ID!) { family(id: $id) { feed(first: 100) { edges { node { id
  author { givenName } reactions { emoji count } tags { value }
  comments(first: 8) { edges { node { body author { givenName } } } } } } } } }"""


async def test_a_person_at_human_pace_is_never_throttled_and_a_hammering_one_is(default_api: Api) -> None:
    api = default_api
    world = await build_world(api, api.clock)
    # The home screen twice a second for ten seconds.
    for _ in range(20):
        body = await api.post(HOME_QUERY, as_="ana")
        assert "errors" not in body, body["errors"]
        api.clock.advance(seconds=0.5)
    # The heaviest feed the limit admits, ten times a second: throttled within seconds.
    refused_at = None
    for n in range(100):
        body = await api.post(HEAVY, {"id": world["family"]}, as_="ben")
        if body.get("errors"):
            assert body["errors"][0]["extensions"]["code"] == "RATE_LIMITED", body["errors"]
            refused_at = n / 10
            break
        api.clock.advance(seconds=0.1)
    assert refused_at is not None and refused_at <= 3, refused_at


async def test_a_replay_spends_the_budget_event_by_event(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each event of `notificationAdded(after:)` costs what its selection does
    (1, a Notification); five replayed of a bucket of 3 stop at the fourth."""
    async with running_api(
        "sqlite", "local", tmp_path, request, cost_budget=3, cost_restore_rate=0.001
    ) as api:
        family_id = await family_with_members(api, "ana", [])
        first = await note_for(api, "ana", family_id)
        for _ in range(5):
            await note_for(api, "ana", family_id)
        api.clock.advance(seconds=10_000)  # the bucket is full again
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
