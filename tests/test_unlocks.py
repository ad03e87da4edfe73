"""The unlock scheduler across real server processes on one DynamoDB endpoint
(moto_server) and one Redis: exactly once, even when a process dies mid-batch."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport

from resolvers.adapters.webpush import new_private_key
from resolvers.core.auth import mint_token
from store.dynamodb import DynamoTable, create_table, deserialize_item, open_dynamo_table
from tests.factories import capsule_rows, family_rows
from tests.servers import SECRET, ServerProcess, running_moto_server, subscriptions_running, until

# moto answers a GSI query by reading every item, so fewer shards and a slower
# poll keep two polling servers from saturating it; production uses 8 and 5 s.
SHARDS = 2
# How long a listener's connection and its ack may take on a loaded machine.
WAIT_SECONDS = 60


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


# How long the 300 openings may take to reach every stream before the run is
# called hung: a bound, not a speed claim. On a slow two-core machine this test
# took five and a half minutes alone (the same with the code before prepared
# operations), and ran out of 300 s in a whole-suite run, every stream short by
# a few openings that were still on their way.
DELIVERY_DEADLINE = 900


@pytest.fixture
async def shared_table(moto_server: str) -> AsyncIterator[DynamoTable]:
    name = f"unlocks-{uuid.uuid4().hex[:8]}"
    async with open_dynamo_table(name, moto_server, "us-east-1") as table:
        assert isinstance(table, DynamoTable)
        await create_table(table.client, name)
        yield table


VAPID_KEY = new_private_key()


def server_env(moto_server: str, table: DynamoTable, redis_url: str | None) -> dict[str, str]:
    env = {
        "MIFAMILIAS_AUTH_SECRET": SECRET,
        "MIFAMILIAS_DYNAMODB_ENDPOINT": moto_server,
        "MIFAMILIAS_AWS_REGION": "us-east-1",
        "MIFAMILIAS_TABLE_NAME": table.table_name,
        # What a deployment gives every host: each of these shares the table.
        "MIFAMILIAS_VAPID_PRIVATE_KEY": VAPID_KEY,
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
        transport = ws_transport(server, token)
        async with Client(transport=transport) as session:
            async for event in session.subscribe(subscription):
                assert event["capsuleUnlocked"]["capsule"]["status"] == "AVAILABLE"
                received[person].append(event["capsuleUnlocked"]["capsule"]["id"])

    listeners = [asyncio.create_task(listen(person, servers[n % 2])) for n, person in enumerate(expected)]
    try:
        await until(
            lambda: all(len(received[p]) >= len(expected[p]) for p in expected),
            lambda: (
                f"every capsule on every stream: {[(len(received[p]), len(expected[p])) for p in expected]}"
            ),
            DELIVERY_DEADLINE,
            interval=0.2,
        )
        # One more capsule for everyone, due once all the others are open: a
        # duplicate of theirs would come on each stream before this sentinel.
        sentinel, more = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC), SHARDS, tag="sentinel"
        )
        await shared_table.batch_write(more)
        await until(
            lambda: all(sentinel in received[p] for p in expected),
            "the sentinel on every stream",
            DELIVERY_DEADLINE,
            0.2,
        )
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

    async def some_unlocked() -> bool:
        return (await statuses())["AVAILABLE"] >= 1

    await until(some_unlocked, "a first unlock", 60, interval=0.02)
    first.kill()  # SIGKILL: no clean shutdown
    at_kill = await statuses()
    assert 0 < at_kill["AVAILABLE"] < 200, at_kill

    second = ServerProcess(tmp_path / "second", env)
    servers.append(second)
    second.start()

    async def all_unlocked() -> bool:
        return (await statuses())["AVAILABLE"] == 200

    # A bound on a failure only: late in the whole suite the shared moto_server
    # holds every earlier test's tables and answers slowly.
    await until(all_unlocked, "every unlock", 240, interval=0.2)
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


def ws_transport(server: ServerProcess, token: str) -> WebsocketsTransport:
    # The 10 s that gql and websockets give the connection and its ack are a
    # quiet machine's: on a loaded one they can run out before the subscription
    # starts.
    return WebsocketsTransport(
        url=server.ws_url,
        init_payload={"Authorization": f"Bearer {token}"},
        connect_timeout=WAIT_SECONDS,
        ack_timeout=WAIT_SECONDS,
        connect_args={"open_timeout": WAIT_SECONDS},
    )


async def subscribed(
    listeners: Sequence[asyncio.Task[None]], servers: Sequence[ServerProcess], count: int
) -> bool:
    """Whether `count` listeners' subscriptions run; a listener that ended
    raises its own error here, rather than leaving the wait to time out."""
    for listener in listeners:
        if listener.done():
            listener.result()
            raise AssertionError("a listener ended before its subscription started")
    return await subscriptions_running(servers, "capsuleUnlocked", count)


async def listen_for(server: ServerProcess, person: str, received: dict[str, list[str]], query: str) -> None:
    token = mint_token(SECRET, person)
    transport = ws_transport(server, token)
    async with Client(transport=transport) as session:
        async for event in session.subscribe(GraphQLRequest(query)):
            received[person].append(event["capsuleUnlocked"]["capsule"]["id"])


async def test_a_capsule_for_300_opens_once_under_two_processes(
    moto_server: str, redis_url: str, shared_table: DynamoTable, servers: list[ServerProcess], tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    creator, recipients = f"creator{run}", [f"r{n:03d}x{run}" for n in range(300)]
    family_id = f"fam{run}"
    env = server_env(moto_server, shared_table, redis_url)
    servers += [ServerProcess(tmp_path / "a", env).start(), ServerProcess(tmp_path / "b", env).start()]
    await shared_table.batch_write(family_rows(family_id, creator, recipients))
    received: dict[str, list[str]] = {person: [] for person in recipients}
    query = "subscription { capsuleUnlocked { id capsule { id } } }"
    listeners = [
        asyncio.create_task(listen_for(servers[n % 2], person, received, query))
        for n, person in enumerate(recipients)
    ]
    try:
        await until(lambda: subscribed(listeners, servers, len(recipients)))
        capsule_id, rows = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC) + timedelta(seconds=1), SHARDS, tag="big"
        )
        await shared_table.batch_write(rows)

        async def everyone_heard() -> bool:
            return all(capsule_id in got for got in received.values())

        await until(everyone_heard)
        # A sentinel capsule for everyone: a duplicate would come before it.
        sentinel, more = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC), SHARDS, tag="sentinel"
        )
        await shared_table.batch_write(more)

        async def sentinel_heard() -> bool:
            return all(sentinel in got for got in received.values())

        await until(sentinel_heard)
    finally:
        for task in listeners:
            task.cancel()
    assert all(got == [capsule_id, sentinel] for got in received.values())
    everything = await scan(shared_table)
    notes = Counter(
        i["userId"]
        for i in everything
        if i.get("type") == "Notification" and i.get("capsuleId") == capsule_id
    )
    assert notes == Counter({person: 1 for person in [creator, *recipients]})
    assert not [i for i in everything if str(i["PK"]).startswith("OUTBOX#")]


class FreezableProxy:
    """A TCP proxy to Redis that can stop passing bytes: a process whose
    publish goes through it is held between its commit and its publish."""

    def __init__(self, target: str) -> None:
        address = target.split("//", 1)[1].split("/", 1)[0]
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.port)
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer), return_exceptions=True
        )
        writer.close()
        upstream_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self.flowing.wait()
            writer.write(data)
            await writer.drain()

    def close(self) -> None:
        self.flowing.set()
        if self.server is not None:
            self.server.close()


async def test_a_process_killed_between_commit_and_publish_is_delivered_by_recovery(
    moto_server: str, redis_url: str, shared_table: DynamoTable, servers: list[ServerProcess], tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    creator, recipients = f"creator{run}", [f"r{n}x{run}" for n in range(4)]
    family_id = f"fam{run}"
    await shared_table.batch_write(family_rows(family_id, creator, recipients))
    # The subscribers' server: its scheduler sleeps an hour after a first pass
    # that finds nothing, so it opens nothing here.
    host = ServerProcess(
        tmp_path / "host",
        server_env(moto_server, shared_table, redis_url) | {"MIFAMILIAS_UNLOCK_POLL_SECONDS": "3600"},
    )
    servers.append(host.start())
    received: dict[str, list[str]] = {person: [] for person in recipients}
    query = "subscription { capsuleUnlocked { id capsule { id } } }"
    listeners = [asyncio.create_task(listen_for(host, person, received, query)) for person in recipients]
    proxy = FreezableProxy(redis_url)
    try:
        # The committing server publishes through the proxy, which stops passing
        # bytes before the capsule is due: it commits, then hangs in its publish.
        committer = ServerProcess(
            tmp_path / "committer", server_env(moto_server, shared_table, await proxy.start())
        )
        servers.append(committer)
        # Started off the loop: the listeners are connecting meanwhile.
        await committer.started()
        proxy.flowing.clear()
        await until(lambda: subscribed(listeners, [host], len(recipients)))
        capsule_id, rows = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC) + timedelta(seconds=1), SHARDS, tag="kill"
        )
        await shared_table.batch_write(rows)
        capsule_key = next((r["PK"], r["SK"]) for r in rows if r["type"] == "Capsule")

        async def committed() -> bool:
            capsule = await shared_table.get(capsule_key)
            outbox = [i for i in await scan(shared_table) if str(i["PK"]).startswith("OUTBOX#")]
            return bool(capsule and capsule["status"] == "AVAILABLE" and outbox)

        await until(committed)
        committer.kill()  # SIGKILL, its publish still held in the proxy
        assert received == {person: [] for person in recipients}
        # Any other process's pass publishes what the outbox holds.
        rescuer = ServerProcess(tmp_path / "rescuer", server_env(moto_server, shared_table, redis_url))
        servers.append(rescuer)
        await rescuer.started()

        async def everyone_heard() -> bool:
            return all(capsule_id in got for got in received.values())

        await until(everyone_heard)
        sentinel, more = capsule_rows(
            family_id, creator, recipients, datetime.now(UTC), SHARDS, tag="sentinel"
        )
        await shared_table.batch_write(more)

        async def sentinel_heard() -> bool:
            return all(sentinel in got for got in received.values())

        await until(sentinel_heard)
    finally:
        proxy.close()
        for task in listeners:
            task.cancel()
    assert all(got == [capsule_id, sentinel] for got in received.values()), received
    assert not [i for i in await scan(shared_table) if str(i["PK"]).startswith("OUTBOX#")]
