"""The cost bucket is one per person across every server process: two real
processes on one table (each engine), or on one Redis, the bucket emptied on
one, refused on the other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.core.auth import mint_token
from tests.servers import SECRET, ServerProcess, engine_env

BUDGET = 6
ME = "{ me { id } rateLimit { cost used remaining resetAt } }"  # 2 points


@pytest.fixture(params=["sqlite", "dynamodb", "sqlite-redis"])
async def pair(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[ServerProcess, ServerProcess]]:
    engine, _, counted_in = request.param.partition("-")
    async with engine_env(engine, request) as env:
        settings = {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_COST_BUDGET": str(BUDGET),
            # A point back every thousand seconds: nothing refills during the test.
            "MIFAMILIAS_COST_RESTORE_RATE": "0.001",
            **env,
        }
        if counted_in == "redis":
            settings["MIFAMILIAS_REDIS_URL"] = request.getfixturevalue("redis_url")
        a = ServerProcess(tmp_path / "data", settings, name="a").start()
        try:
            b = ServerProcess(tmp_path / "data", settings, name="b").start()
            try:
                yield a, b
            finally:
                b.stop()
        finally:
            a.stop()


async def ask(server: ServerProcess, user: str) -> Any:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{server.url}/graphql",
            json={"query": ME},
            headers={"Authorization": f"Bearer {mint_token(SECRET, user, given_name='Ana')}"},
        )
    assert response.status_code == 200, response.text
    return response.json()


async def test_the_budget_spent_on_one_process_is_refused_on_the_other(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    states = [await ask(server, "ana") for server in (a, b, a)]
    refusal = await ask(b, "ana")
    assert [s["data"]["rateLimit"]["used"] for s in states] == [2, 4, 6]
    assert refusal["data"] is None
    error = refusal["errors"][0]
    assert error["extensions"]["code"] == "RATE_LIMITED"
    assert error["extensions"]["retryAfter"] >= 1
    assert error["extensions"]["rateLimit"]["remaining"] == 0
    assert error["extensions"]["cost"]["throttleStatus"]["currentlyAvailable"] == 0
