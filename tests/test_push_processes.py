"""Web Push across two real server processes sharing one store (the SQLite
file of one data directory, or a table on moto_server): each device gets its push once, even when the
process that claimed the notification is SIGKILLed before its send got
through. The push service (tests/push_service.py) checks VAPID against the
servers' `webPushPublicKey` and decrypts every payload. On DynamoDB the two
are hosts of one deployment, each with a data directory of its own: they
sign with the key the deployment gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.core.auth import mint_token
from store import keys
from store.dynamodb import open_dynamo_table
from store.port import SortKey, all_items
from store.sqlite import SqliteTable
from tests.push_service import running_push_service
from tests.servers import SECRET, ServerProcess, engine_env, until

REGISTER = "mutation($i: RegisterPushDeviceInput!) { registerPushDevice(input: $i) { id } }"


async def call(
    client: httpx.AsyncClient, server: ServerProcess, person: str, query: str, **variables: Any
) -> Any:
    token = mint_token(SECRET, person, given_name=person.capitalize(), email=f"{person}@example.org")
    response = await client.post(
        f"{server.url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token}"},
    )
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


async def test_once_per_device_across_two_processes_with_a_sigkill_between_claim_and_send(
    tmp_path: Path, request: pytest.FixtureRequest, engine: str
) -> None:
    data_dir = tmp_path / "data"
    async with engine_env(engine, request) as engine_vars:
        if engine == "sqlite":
            data_dir.mkdir(parents=True)
            table: Any = SqliteTable(data_dir / "mifamilias.sqlite3")
            try:
                await run(tmp_path, data_dir, engine_vars, table)
            finally:
                await table.close()
        else:
            async with open_dynamo_table(
                engine_vars["MIFAMILIAS_TABLE_NAME"], engine_vars["MIFAMILIAS_DYNAMODB_ENDPOINT"], "us-east-1"
            ) as table:
                await run(tmp_path, data_dir, engine_vars, table)


@pytest.fixture(params=["sqlite", "dynamodb"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def run(tmp_path: Path, data_dir: Path, engine_vars: dict[str, str], table: Any) -> None:
    async def notes_of(person: str) -> list[dict[str, Any]]:
        """The person's notifications as the store holds them (read beside the servers)."""
        return await all_items(table, keys.user_pk(person), SortKey.begins_with(keys.NOTIFICATION_PREFIX))

    with running_push_service() as service:
        env = {
            **engine_vars,
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_PUSH_ALLOWED_ORIGINS": service.origin,
            "MIFAMILIAS_PUSH_LEASE_SECONDS": "2",
            "MIFAMILIAS_PUSH_RECOVERY_SECONDS": "0.3",
            "MIFAMILIAS_UNLOCK_POLL_SECONDS": "3600",
        }
        # SQLite: the store is the data directory's, shared. DynamoDB: two hosts.
        own_dir = data_dir if "MIFAMILIAS_DYNAMODB_ENDPOINT" not in env else tmp_path / "host-b"
        first = ServerProcess(data_dir, env, name="a").start()
        second = ServerProcess(own_dir, env, name="b").start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                key = (await call(client, first, "ana", "{ webPushPublicKey }"))["webPushPublicKey"]
                # One VAPID key: the data directory's, whichever process made it,
                # or the deployment's.
                assert (await call(client, second, "ana", "{ webPushPublicKey }"))["webPushPublicKey"] == key
                service.server_key = key
                family = (
                    await call(
                        client,
                        first,
                        "ana",
                        'mutation { createFamily(input: {name: "Los García", trustLevel: VOUCHED}) { inviteCode } }',
                    )
                )["createFamily"]
                phone, laptop = service.browser("phone"), service.browser("laptop")
                devices = {}
                for browser in (phone, laptop):
                    found = await call(client, second, "ana", REGISTER, i=browser.input())
                    devices[browser.name] = found["registerPushDevice"]["id"]
                released = service.hold_next("phone")

                # cy asks to join: MEMBER_PENDING to ana, pushed by the process that wrote it.
                await call(
                    client,
                    first,
                    "cy",
                    "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }",
                    c=family["inviteCode"],
                )

                async def laptop_recorded() -> bool:
                    found = await notes_of("ana")
                    reached = any(devices["laptop"] in note.get("pushedTo", []) for note in found)
                    return service.held == ["phone"] and reached

                await until(laptop_recorded, "the claim and one send")
                first.kill()  # the phone's push is on its way, unanswered
                released.set()

                async def settled() -> bool:
                    pending = [note for note in await notes_of("ana") if note.get("GSI1PK")]
                    return not pending and len(service.to("phone")) == 1

                await until(settled, "the other process to take over the push")
                assert service.problems == []
                for name in ("phone", "laptop"):
                    [got] = service.to(name)
                    assert got.payload["type"] == "MEMBER_PENDING"
                [note] = await notes_of("ana")
                assert sorted(note["pushedTo"]) == sorted(devices.values())
                # A later pass of the survivor sends nothing more.
                recovered = await call(client, second, "ana", "{ myPushDevices { id lastPushedAt } }")
                assert all(d["lastPushedAt"] for d in recovered["myPushDevices"])
                assert len(service.to("phone")) == 1 and len(service.to("laptop")) == 1
        finally:
            first.stop()
            second.stop()
