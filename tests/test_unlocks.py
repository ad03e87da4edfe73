"""The unlock scheduler across real server processes on one DynamoDB endpoint
(moto_server) and one Redis: exactly once, even when a process dies mid-batch."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport

from resolvers.core.auth import mint_token
from store.dynamodb import DynamoTable, create_table, deserialize_item, open_dynamo_table
from tests.factories import capsule_rows, family_rows
from tests.servers import SECRET, ServerProcess, running_moto_server

# moto answers a GSI query by reading every item, so fewer shards and a slower
# poll keep two polling servers from saturating it; production uses 8 and 5 s.
SHARDS = 2


def seed_capsules(
    count: int, unlock: datetime, family_id: str, creator: str, recipients: list[str]
) -> tuple[list[dict[str, Any]], dict[str, set[str]]]:
    """`count` LOCKED capsules, two recipients each; and which capsules each person must hear about."""
    rows: list[dict[str, Any]] = []
    expected: dict[str, set[str]] = {person: {*()} for person in [creator, *recipients]}
    for n in range(count):
        chosen = (recipients[n % len(recipients)], recipients[(n + 1) % len(recipients)])
        capsule_id, more = capsule_rows(family_id, creator, chosen, unlock, SHARDS, tag=f"{n:04d}")
        rows += more
        for person in (*chosen, creator):
            expected[person].add(capsule_id)
    return rows, expected


async def scan(table: DynamoTable) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"TableName": table.table_name}
    while True:
        page = await table.client.scan(**params)
        found += [deserialize_item(raw) for raw in page["Items"]]
        if "LastEvaluatedKey" not in page:
            return found
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@pytest.fixture
def moto_server(aws_env: None, tmp_path: Path) -> Iterator[str]:
    """A moto_server of this test's own: moto copies every table of the server in
    each transaction, so a big session table would slow these runs down."""
    with running_moto_server(tmp_path) as url:
        yield url


@pytest.fixture
async def shared_table(moto_server: str) -> AsyncIterator[DynamoTable]:
    name = f"unlocks-{uuid.uuid4().hex[:8]}"
    async with open_dynamo_table(name, moto_server, "us-east-1") as table:
        assert isinstance(table, DynamoTable)
        await create_table(table.client, name)
        yield table


def server_env(moto_server: str, table: DynamoTable, redis_url: str | None) -> dict[str, str]:
    env = {
        "MIFAMILIAS_AUTH_SECRET": SECRET,
        "MIFAMILIAS_DYNAMODB_ENDPOINT": moto_server,
        "MIFAMILIAS_AWS_REGION": "us-east-1",
        "MIFAMILIAS_TABLE_NAME": table.table_name,
        "MIFAMILIAS_UNLOCK_POLL_SECONDS": "1",
        "MIFAMILIAS_UNLOCK_SHARDS": str(SHARDS),
        "MIFAMILIAS_ABANDONED_UNLOCK_SECONDS": "3",
    }
    if redis_url:
        env["MIFAMILIAS_REDIS_URL"] = redis_url
    return env


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


async def test_two_processes_unlock_300_capsules_exactly_once(
    moto_server: str, redis_url: str, shared_table: DynamoTable, servers: list[ServerProcess], tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    creator, recipients = f"creator{run}", [f"r{n}x{run}" for n in range(6)]
    family_id = f"fam{run}"
    env = server_env(moto_server, shared_table, redis_url)
    servers += [ServerProcess(tmp_path / "a", env).start(), ServerProcess(tmp_path / "b", env).start()]
    await shared_table.batch_write(family_rows(family_id, creator, recipients))
    unlock = datetime.now(UTC) + timedelta(seconds=6)
    rows, expected = seed_capsules(300, unlock, family_id, creator, recipients)
    await shared_table.batch_write(rows)

    received: dict[str, list[str]] = {person: [] for person in expected}
    subscription = GraphQLRequest("subscription { capsuleUnlocked { capsule { id status } } }")

    async def listen(person: str, server: ServerProcess) -> None:
        token = mint_token(SECRET, person)
        transport = WebsocketsTransport(url=server.ws_url, init_payload={"Authorization": f"Bearer {token}"})
        async with Client(transport=transport) as session:
            async for event in session.subscribe(subscription):
                assert event["capsuleUnlocked"]["capsule"]["status"] == "AVAILABLE"
                received[person].append(event["capsuleUnlocked"]["capsule"]["id"])

    listeners = [asyncio.create_task(listen(person, servers[n % 2])) for n, person in enumerate(expected)]
    try:
        deadline = time.monotonic() + 300  # bounds a failure only
        while any(len(received[p]) < len(expected[p]) for p in expected) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        # One more capsule for everyone, due once all the others are open: a
        # duplicate of theirs would come on each stream before this sentinel.
        sentinel, more = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC), SHARDS, tag="sentinel"
        )
        await shared_table.batch_write(more)
        while any(sentinel not in received[p] for p in expected) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        for task in listeners:
            task.cancel()
    everything = await scan(shared_table)
    capsules = [
        i
        for i in everything
        if i.get("type") == "Capsule" and i["familyId"] == family_id and i["id"] != sentinel
    ]
    assert len(capsules) == 300 and {c["status"] for c in capsules} == {"AVAILABLE"}
    for person, capsule_ids in expected.items():
        assert received[person][-1] == sentinel, person
        assert Counter(received[person][:-1]) == Counter(capsule_ids), person  # each exactly once

    assert all(c["notificationSent"] and "GSI2PK" not in c for c in capsules)
    notes = Counter(
        (i["userId"], i["capsuleId"])
        for i in everything
        if i.get("type") == "Notification"
        and i["notificationType"] == "CAPSULE_UNLOCKED"
        and i["familyId"] == family_id
        and i["capsuleId"] != sentinel
    )
    assert set(notes.values()) == {1}
    assert sum(notes.values()) == 300 * 3
    contents = [i for i in everything if i.get("type") == "Content" and i["familyId"] == family_id]
    # (the sentinel's content included)
    assert all("GSI1PK" in c for c in contents)  # every one is in the feed now


async def test_a_process_killed_mid_batch_is_finished_by_the_next(
    moto_server: str, shared_table: DynamoTable, servers: list[ServerProcess], tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    creator, recipients = f"creator{run}", [f"r{n}x{run}" for n in range(4)]
    family_id = f"fam{run}"
    env = server_env(moto_server, shared_table, None)
    await shared_table.batch_write(family_rows(family_id, creator, recipients))
    unlock = datetime.now(UTC) + timedelta(seconds=1)
    rows, _ = seed_capsules(200, unlock, family_id, creator, recipients)
    await shared_table.batch_write(rows)
    capsule_keys = [(r["PK"], r["SK"]) for r in rows if r["type"] == "Capsule"]

    async def statuses() -> Counter[str]:
        found = await shared_table.batch_get(capsule_keys)
        return Counter(item["status"] for item in found.values())

    first = ServerProcess(tmp_path / "first", env)
    servers.append(first)
    first.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (await statuses())["AVAILABLE"] >= 1:
            break
        await asyncio.sleep(0.02)
    first.kill()  # SIGKILL: no clean shutdown
    at_kill = await statuses()
    assert 0 < at_kill["AVAILABLE"] < 200, at_kill

    second = ServerProcess(tmp_path / "second", env)
    servers.append(second)
    second.start()
    deadline = time.monotonic() + 60
    while (await statuses())["AVAILABLE"] < 200 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert await statuses() == Counter({"AVAILABLE": 200})
    everything = await scan(shared_table)
    notes = Counter(
        (i["userId"], i["capsuleId"])
        for i in everything
        if i.get("type") == "Notification"
        and i["notificationType"] == "CAPSULE_UNLOCKED"
        and i["familyId"] == family_id
    )
    assert set(notes.values()) == {1} and sum(notes.values()) == 200 * 3
