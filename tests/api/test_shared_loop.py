"""Large answers are built a piece at a time: a small query that arrives while
four large answers are being built is answered first.

This is the event loop's property, not the store's: it runs on the embedded
engine, whose reads take microseconds. Over moto, the small query's own round
trip takes longer than what is left of the large answers in a family of test
size, so what finishes first would say nothing about turns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from resolvers.core import turns
from tests.api import test_round_trips as round_trips
from tests.api.conftest import Api, running_api
from tests.servers import until
from tests.typical_calls import JOIN, make_family, settle, upload_text

FEEDS = 24
# Each with an author to load: a piece of work per object, so the large answers
# have far more pieces left than the small query's own round trips take.
CONTENTS = 20


@pytest.fixture
def every_piece_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # A slice of nothing, and never idle: each piece of work waits its turn, so
    # the order of turns, not the machine's speed, decides what finishes first.
    monkeypatch.setattr(turns.TURNS, "slice_seconds", 0.0)
    monkeypatch.setattr(turns.TURNS, "idle_seconds", float("inf"))


@pytest.mark.usefixtures("every_piece_waits")
async def test_a_small_query_is_answered_while_large_answers_are_built(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with running_api("sqlite", "local", tmp_path, request) as api:
        await _small_first(api)


async def _small_first(api: Any) -> None:
    family = await make_family(api, "ana", "Los García")
    await api.ok(JOIN, {"code": family["inviteCode"]}, as_="ben")
    for n in range(CONTENTS):
        await upload_text(api, "ana" if n % 2 else "ben", family["id"], f"nota {n}".encode(), title=f"n{n}")
    await settle(api)
    feeds = " ".join(
        f"f{n}: feed(first: {CONTENTS}) {{ edges {{ node {{ id title author {{ givenName }} }} }} }}"
        for n in range(FEEDS)
    )
    large = f"query($id: ID!) {{ family(id: $id) {{ {feeds} }} }}"

    building = [asyncio.create_task(api.ok(large, {"id": family["id"]}, as_="ben")) for _ in range(4)]
    await until(
        lambda: turns.TURNS.waiting >= 20 or any(task.done() for task in building),
        "the large answers to wait for turns",
        interval=0,
    )
    small = await api.ok("{ me { id } }", as_="cy")

    assert small == {"me": {"id": "cy"}}
    assert not any(task.done() for task in building), "a large answer was built before the small one"
    answers = await asyncio.gather(*building)
    for answer in answers:
        assert [len(answer["family"][f"f{n}"]["edges"]) for n in range(FEEDS)] == [CONTENTS] * FEEDS


@pytest.mark.usefixtures("every_piece_waits")
async def test_taking_turns_keeps_an_operations_batches(api: Api) -> None:
    """When every piece of an operation waits its turn (as under load), its
    batches are those `tests/api/test_round_trips.py` counts without turns:
    a loader's batch does not leave while pieces of its operation still wait."""
    await round_trips.test_my_families_is_one_store_call_per_level(api)
