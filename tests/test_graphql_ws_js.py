"""Resume and exactly-once with graphql-ws from npm, the client most frontends
use, over real sockets to real server processes: on the embedded store, and on
DynamoDB (moto_server) with Redis across two processes."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from store.dynamodb import DynamoTable
from tests.factories import capsule_rows, family_rows
from tests.js_clients import GraphqlWs
from tests.servers import SECRET, ServerProcess, subscriptions_running, until
from tests.servers import token as person_token
from tests.test_live import capsule_for, http, make_family, upload
from tests.test_unlocks import (  # noqa: F401  (fixtures)
    SHARDS,
    moto_server,
    scan,
    server_env,
    servers,
    shared_table,
)

NOTES = "subscription($after: ID) { notificationAdded(after: $after) { id type } }"
CAPSULES = "subscription($after: ID) { capsuleUnlocked(after: $after) { id capsule { id } } }"
LIST = "{ notifications(first: 50) { edges { node { id type capsule { id } } } } }"


# Every person here has an address: mail is part of what these tests follow.
token = functools.partial(person_token, email=True)


@pytest.fixture(params=["sqlite", "dynamodb"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    env = {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5"}
    if request.param == "dynamodb":
        table: DynamoTable = request.getfixturevalue("shared_table")
        env = server_env(request.getfixturevalue("moto_server"), table, None) | env
    process = ServerProcess(tmp_path / "server", env).start()
    try:
        yield process
    finally:
        process.stop()


async def notification_ids(server: ServerProcess, user: str) -> list[dict[str, Any]]:
    """The user's notifications, oldest first."""
    edges = (await http(server, user, LIST))["notifications"]["edges"]
    return [edge["node"] for edge in reversed(edges)]


async def test_resume_after_a_disconnect_with_graphql_ws(server: ServerProcess) -> None:
    family_id = await make_family(server, "ana", ["ben"])
    await upload(server, "ana", family_id, "TEXT", b"hola", "text/plain", title="antes")

    async def count_is(n: int) -> bool:
        return len(await notification_ids(server, "ben")) == n

    await until(lambda: count_is(1))
    # Connected: ben hears one notification, then the client goes away.
    first = await GraphqlWs(server.ws_url, token("ben"), NOTES, {"after": None}, 1).start()
    await until(lambda: subscriptions_running([server], "notificationAdded", 1))
    await upload(server, "ana", family_id, "TEXT", b"uno", "text/plain", title="uno")
    heard = [r["data"]["notificationAdded"] for r in await first.results()]
    last_seen = heard[0]["id"]
    # Offline: a capsule opens for ben and two more notifications arrive. Its
    # date leaves a loaded machine time to seal it: one that passes first
    # refuses the note, and the capsule stays closed for good.
    capsule_id = await capsule_for(server, family_id, "Para Ben", datetime.now(UTC) + timedelta(seconds=6))
    await upload(server, "ana", family_id, "TEXT", b"dentro", "text/plain", capsule_id=capsule_id)
    await upload(server, "ana", family_id, "TEXT", b"dos", "text/plain", title="dos")
    await upload(server, "ana", family_id, "TEXT", b"tres", "text/plain", title="tres")

    await until(lambda: count_is(5))
    listed = await notification_ids(server, "ben")
    ids = [n["id"] for n in listed]
    missed = ids[ids.index(last_seen) + 1 :]
    assert len(missed) == 3 and "CAPSULE_UNLOCKED" in [n["type"] for n in listed[-3:]]
    # Back online with `after`: the three missed, oldest first, then live.
    again = await GraphqlWs(server.ws_url, token("ben"), NOTES, {"after": last_seen}, 4).start()
    capsules = await GraphqlWs(server.ws_url, token("ben"), CAPSULES, {"after": last_seen}, 1).start()
    await until(lambda: subscriptions_running([server], "notificationAdded", 1))
    await upload(server, "ana", family_id, "TEXT", b"cuatro", "text/plain", title="cuatro")
    resumed = [r["data"]["notificationAdded"]["id"] for r in await again.results()]
    live = (await notification_ids(server, "ben"))[-1]["id"]
    assert resumed == [*missed, live]
    (opened,) = [r["data"]["capsuleUnlocked"] for r in await capsules.results()]
    unlocked_note = next(n for n in listed if n["type"] == "CAPSULE_UNLOCKED")
    assert opened == {"id": unlocked_note["id"], "capsule": {"id": capsule_id}}


async def test_exactly_once_across_two_processes_with_graphql_ws(
    moto_server: str,  # noqa: F811
    redis_url: str,
    shared_table: DynamoTable,  # noqa: F811
    servers: list[ServerProcess],  # noqa: F811
    tmp_path: Path,
) -> None:
    run = uuid.uuid4().hex[:6]
    creator, recipients = f"creator{run}", [f"r{n}x{run}" for n in range(6)]
    family_id = f"fam{run}"
    env = server_env(moto_server, shared_table, redis_url)
    servers += [ServerProcess(tmp_path / "a", env).start(), ServerProcess(tmp_path / "b", env).start()]
    await shared_table.batch_write(family_rows(family_id, creator, recipients))
    clients = [
        await GraphqlWs(servers[n % 2].ws_url, token(person), CAPSULES, {"after": None}, 2).start()
        for n, person in enumerate(recipients)
    ]
    try:
        await until(lambda: subscriptions_running(servers, "capsuleUnlocked", len(recipients)))
        capsule_id, rows = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC) + timedelta(seconds=1), SHARDS, tag="once"
        )
        await shared_table.batch_write(rows)
        capsule_key = next((r["PK"], r["SK"]) for r in rows if r["type"] == "Capsule")

        async def opened_and_published() -> bool:
            capsule = await shared_table.get(capsule_key)
            outbox = [i for i in await scan(shared_table) if str(i["PK"]).startswith("OUTBOX#")]
            return bool(capsule and capsule["status"] == "AVAILABLE" and not outbox)

        await until(opened_and_published)
        # A sentinel due now: a duplicate of the first would come before it.
        sentinel, more = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC), SHARDS, tag="sentinel"
        )
        await shared_table.batch_write(more)
        heard = await asyncio.gather(*(client.results() for client in clients))
    finally:
        for client in clients:
            client.stop()
    for results in heard:
        assert [r["data"]["capsuleUnlocked"]["capsule"]["id"] for r in results] == [capsule_id, sentinel]
