"""Web Push across two real server processes sharing one store (the SQLite
file of one data directory): each device gets its push once, even when the
process that claimed the notification is SIGKILLed before its send got
through. The push service (tests/push_service.py) checks VAPID against the
servers' `webPushPublicKey` and decrypts every payload."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx

from resolvers.core.auth import mint_token
from tests.push_service import running_push_service
from tests.servers import SECRET, ServerProcess, until

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


def notes_of(data_dir: Path, person: str) -> list[dict[str, Any]]:
    """The person's notifications as the store holds them (read beside the servers)."""
    with sqlite3.connect(data_dir / "mifamilias.sqlite3", timeout=30) as db:
        rows = db.execute(
            "SELECT body FROM items WHERE pk = ? AND sk LIKE 'NOTIF#%'", (f"USER#{person}",)
        ).fetchall()
    return [json.loads(body) for (body,) in rows]


async def test_once_per_device_across_two_processes_with_a_sigkill_between_claim_and_send(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with running_push_service() as service:
        env = {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_PUSH_ALLOWED_ORIGINS": service.origin,
            "MIFAMILIAS_PUSH_LEASE_SECONDS": "2",
            "MIFAMILIAS_PUSH_RECOVERY_SECONDS": "0.3",
            "MIFAMILIAS_UNLOCK_POLL_SECONDS": "3600",
        }
        first = ServerProcess(data_dir, env, name="a").start()
        second = ServerProcess(data_dir, env, name="b").start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                key = (await call(client, first, "ana", "{ webPushPublicKey }"))["webPushPublicKey"]
                # One data directory, one VAPID key, whichever process made it.
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

                def laptop_recorded() -> bool:
                    return any(
                        devices["laptop"] in note.get("pushedTo", []) for note in notes_of(data_dir, "ana")
                    )

                await until(lambda: service.held == ["phone"] and laptop_recorded(), "the claim and one send")
                first.kill()  # the phone's push is on its way, unanswered
                released.set()

                def settled() -> bool:
                    pending = [note for note in notes_of(data_dir, "ana") if note.get("GSI1PK")]
                    return not pending and len(service.to("phone")) == 1

                await until(settled, "the other process to take over the push")
                assert service.problems == []
                for name in ("phone", "laptop"):
                    [got] = service.to(name)
                    assert got.payload["type"] == "MEMBER_PENDING"
                [note] = notes_of(data_dir, "ana")
                assert sorted(note["pushedTo"]) == sorted(devices.values())
                # A later pass of the survivor sends nothing more.
                recovered = await call(client, second, "ana", "{ myPushDevices { id lastPushedAt } }")
                assert all(d["lastPushedAt"] for d in recovered["myPushDevices"])
                assert len(service.to("phone")) == 1 and len(service.to("laptop")) == 1
        finally:
            first.stop()
            second.stop()
