"""An app per test on a fresh table, on each storage engine, driven over HTTP."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import create_app
from resolvers.core.auth import mint_token
from resolvers.core.config import Settings
from resolvers.core.turns import TURNS
from store.port import Table
from tests.clock import FakeClock
from tests.counting import CountingTable, is_budget
from tests.servers import SECRET, after_the_start_up_pass, without_cost
from tests.typical_calls import PUSH_ORIGIN


class Api:
    def __init__(self, app: Any, client: httpx.AsyncClient, table: Table, clock: FakeClock) -> None:
        self.app = app
        self.client = client
        self.table = table
        self.clock = clock

    @property
    def services(self) -> Any:
        return self.app.state.services

    def token(self, user_id: str, **claims: Any) -> str:
        claims.setdefault("given_name", user_id.capitalize())
        claims.setdefault("email", f"{user_id}@example.org")
        return mint_token(SECRET, user_id, **claims)

    async def post(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        *,
        as_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        headers = dict(headers or {})
        if as_ is not None:
            headers["Authorization"] = f"Bearer {self.token(as_)}"
        response = await self.client.post(
            "/graphql", json={"query": query, "variables": variables or {}}, headers=headers
        )
        assert response.status_code in (200, 400), response.text
        body: dict[str, Any] = response.json()
        return body

    async def ok(self, query: str, variables: dict[str, Any] | None = None, *, as_: str) -> Any:
        body = await self.post(query, variables, as_=as_)
        assert "errors" not in body, body
        return body["data"]

    async def error(
        self, query: str, variables: dict[str, Any] | None = None, *, as_: str | None
    ) -> tuple[str, str]:
        body = await self.post(query, variables, as_=as_)
        assert body.get("errors"), body
        first = body["errors"][0]
        assert "Traceback" not in first["message"]
        assert "extensions" in first, body
        return first["extensions"]["code"], first["message"]

    async def sign_in(self, *users: str) -> None:
        """First requests create profiles; tests that compare snapshots make them first."""
        for user in users:
            await self.ok("{ me { id } }", as_=user)

    async def snapshot(self) -> dict[tuple[str, str], dict[str, Any]]:
        # The scheduler's checkpoint moves on its own clock; it is not the request's doing.
        # A person's cost bucket is the request's own bookkeeping (every operation takes
        # from it, a refused one too), not what the operation changed.
        return {
            key: item
            for key, item in (await dump(self.table)).items()
            if key[0] != "SCHEDULER" and not is_cost_bucket(key)
        }


def answer(response: httpx.Response) -> Any:
    """A response's body without `extensions.cost`, for tests about something else."""
    return without_cost(response.json())


def is_cost_bucket(key: tuple[str, str]) -> bool:
    return is_budget(key)


async def dump(table: Table) -> dict[tuple[str, str], dict[str, Any]]:
    """Every item in the table, for "nothing changed" assertions."""
    inner = getattr(table, "inner", table)
    from store.sqlite import SqliteTable

    if isinstance(inner, SqliteTable):
        import json

        rows = inner._db.execute("SELECT pk, sk, body FROM items").fetchall()
        return {(pk, sk): json.loads(body) for pk, sk, body in rows}
    from store.dynamodb import DynamoTable, deserialize_item

    assert isinstance(inner, DynamoTable)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    params: dict[str, Any] = {"TableName": inner.table_name, "ConsistentRead": True}
    while True:
        page = await inner.client.scan(**params)
        for raw in page["Items"]:
            item = deserialize_item(raw)
            found[(item["PK"], item["SK"])] = item
        if "LastEvaluatedKey" not in page:
            return found
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@contextlib.asynccontextmanager
async def open_table(engine: str, tmp_path: Path, moto_url: str | None) -> AsyncIterator[Table]:
    if engine == "sqlite":
        from store.sqlite import SqliteTable

        table = SqliteTable(tmp_path / "table.sqlite3")
        try:
            yield table
        finally:
            await table.close()
        return
    from store.dynamodb import create_table, open_dynamo_table

    name = f"t-{uuid.uuid4().hex[:12]}"
    async with open_dynamo_table(name, moto_url, "us-east-1") as dynamo:
        await create_table(dynamo.client, name)
        try:
            yield dynamo
        finally:
            # moto copies every table in each transaction: keep the server small.
            await dynamo.client.delete_table(TableName=name)


@contextlib.asynccontextmanager
async def running_api(
    engine: str,
    blobs: str,
    tmp_path: Path,
    request: pytest.FixtureRequest | None,
    *,
    tracer_provider: Any = None,
    clock: FakeClock | None = None,
    prepare: Callable[[Table], Awaitable[None]] | None = None,
    **changes: Any,
) -> AsyncIterator[Api]:
    """The app on `engine`'s table (`open_table`: a SQLite file already at
    tmp_path/table.sqlite3 is opened as it is), after `prepare` has had the
    table, on `clock` (from now when not given). `request` is only asked for
    moto_server."""
    needs_moto = engine == "dynamodb" or blobs == "s3"
    if needs_moto and request is None:
        raise ValueError("DynamoDB and S3 need the moto_server fixture")
    moto_url = request.getfixturevalue("moto_server") if needs_moto and request is not None else None
    clock = clock or FakeClock()
    changes.setdefault("push_allowed_origins", (PUSH_ORIGIN,))
    # The operation deadline is a production bound, tested where it is set on
    # purpose (tests/api/test_limits.py); elsewhere a machine busy with other
    # work must not turn a slow but correct operation into a refusal.
    changes.setdefault("operation_deadline_seconds", 120.0)
    settings = Settings(
        data_dir=tmp_path / "data",
        auth_secret=SECRET,
        unlock_poll_seconds=3600,
        s3_bucket=f"media-{uuid.uuid4().hex[:8]}" if blobs == "s3" else None,
        s3_endpoint=moto_url if blobs == "s3" else None,
        **changes,
    )
    async with open_table(engine, tmp_path, moto_url) as table:
        if prepare is not None:
            await prepare(table)
        counting = CountingTable(table)
        app = create_app(settings, table=counting, clock=clock, tracer_provider=tracer_provider)
        async with app.router.lifespan_context(app):
            await after_the_start_up_pass(app)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                yield Api(app, client, counting, clock)


@pytest.fixture
def turns_without_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that count store calls: the loop's turns (a slice of wall time
    each) never run out, so a loaded machine, whose process loses the CPU
    mid-slice, cannot split one level's batch across passes. The count is the
    code's, whatever the machine."""
    monkeypatch.setattr(TURNS, "_clock", lambda: 0.0)


@pytest.fixture(params=["sqlite", "dynamodb"])
async def api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    """The app on each storage engine, with the local blob store."""
    async with running_api(request.param, "local", tmp_path, request) as app:
        yield app


@pytest.fixture(params=[("sqlite", "local"), ("dynamodb", "s3")], ids=["sqlite-files", "dynamodb-s3"])
async def media_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    """Each storage engine and each blob store."""
    engine, blobs = request.param
    async with running_api(engine, blobs, tmp_path, request) as app:
        yield app
