"""Privacy follows membership: each finding of the adversarial run, as its own
test against a real server process (uvicorn, real HTTP, real WebSockets) on
each storage engine (SQLite, and DynamoDB on moto_server)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from resolvers.core.auth import mint_token
from tests.servers import SECRET, ServerProcess, engine_env, token, until, without_cost

GRAPHQL_TRANSPORT_WS = "graphql-transport-ws"
LEGACY_WS = "graphql-ws"


@pytest.fixture(params=["sqlite", "dynamodb"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ServerProcess]:
    env = {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.3"}
    async with engine_env(request.param, request) as engine:
        process = ServerProcess(tmp_path / "data", env | engine).start()
        try:
            yield process
        finally:
            process.stop()


async def post(
    server: ServerProcess, query: str, variables: dict[str, Any] | None = None, *, auth: str | None = None
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {auth}"} if auth else {}
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{server.url}/graphql", json={"query": query, "variables": variables or {}}, headers=headers
        )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def ok(server: ServerProcess, user: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    body = await post(server, query, variables, auth=token(user))
    assert "errors" not in body, body
    return body["data"]


async def code(
    server: ServerProcess, query: str, variables: dict[str, Any] | None = None, *, auth: str | None
) -> str:
    body = await post(server, query, variables, auth=auth)
    assert body.get("errors"), body
    found: str = body["errors"][0]["extensions"]["code"]
    return found


async def family(server: ServerProcess, admin: str, members: list[str]) -> str:
    made = await ok(
        server,
        admin,
        'mutation { createFamily(input: {name: "Los Ruiz", trustLevel: OPEN}) { id inviteCode } }',
    )
    for member in members:
        await ok(
            server,
            member,
            "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }",
            {"c": made["createFamily"]["inviteCode"]},
        )
    return str(made["createFamily"]["id"])


async def upload_text(
    server: ServerProcess, user: str, family_id: str, body: bytes, title: str, capsule_id: str | None = None
) -> str:
    created = await ok(
        server,
        user,
        """mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }""",
        {
            "i": {
                "familyId": family_id,
                "type": "TEXT",
                "mimeType": "text/plain",
                "sizeBytes": len(body),
                "title": title,
                "capsuleId": capsule_id,
            }
        },
    )
    async with httpx.AsyncClient() as client:
        put = await client.put(
            created["createUpload"]["uploadUrl"], content=body, headers={"Content-Type": "text/plain"}
        )
    assert put.status_code == 200
    content_id = str(created["createUpload"]["content"]["id"])
    await ok(server, user, "mutation($id: ID!) { completeUpload(contentId: $id) { id } }", {"id": content_id})
    return content_id


async def capsule_due_soon(
    server: ServerProcess, creator: str, family_id: str, recipients: list[str], seconds: float
) -> tuple[str, str]:
    """A LOCKED capsule around READY text, due `seconds` from now: (capsule, content)."""
    unlock = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
    made = await ok(
        server,
        creator,
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {
            "i": {
                "familyId": family_id,
                "title": "Para el futuro",
                "unlockDate": unlock,
                "recipientIds": recipients,
            }
        },
    )
    capsule_id = str(made["createCapsule"]["id"])
    await ok(
        server,
        creator,
        "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }",
        {"id": capsule_id},
    )
    content_id = await upload_text(server, creator, family_id, b"te quiero", "secreto", capsule_id)
    return capsule_id, content_id


CAPSULE = "query($id: ID!) { capsule(id: $id) { status content { id mediaUrl } } }"


async def wait_unlocked(server: ServerProcess, reader: str, capsule_id: str) -> None:
    async def available() -> bool:
        body = await post(server, CAPSULE, {"id": capsule_id}, auth=token(reader))
        return ((body.get("data") or {}).get("capsule") or {}).get("status") == "AVAILABLE"

    await until(available, "the capsule to unlock")


# A raw graphql-transport-ws client: what each frame is, not what a library makes of it.


class Socket:
    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    async def receive(self, seconds: float = 30) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.connection.recv(), seconds)
        message: dict[str, Any] = json.loads(raw)
        return message

    async def next_of(self, kind: str, seconds: float = 60) -> dict[str, Any]:
        """The next message of a kind; keep-alives ("ka", "ping") in between are skipped."""
        while True:
            message = await self.receive(seconds)
            if message.get("type") == kind:
                return message
            assert message.get("type") in ("ka", "ping", "pong"), message


async def open_socket(server: ServerProcess, auth: str, protocol: str = GRAPHQL_TRANSPORT_WS) -> Socket:
    connection = await websockets.connect(server.ws_url, subprotocols=[protocol])  # type: ignore[list-item]
    socket = Socket(connection)
    await socket.send({"type": "connection_init", "payload": {"Authorization": f"Bearer {auth}"}})
    assert (await socket.next_of("connection_ack"))["type"] == "connection_ack"
    return socket


UNLOCKED = "subscription { capsuleUnlocked { capsule { id title content { id mediaUrl } } unlockedAt } }"


# 1 and 2: a recipient who left, and a creator who was removed --------------------------


async def test_who_left_or_was_removed_reads_nothing_of_the_capsule_after_the_unlock(
    server: ServerProcess,
) -> None:
    family_id = await family(server, "ana", ["crm", "rleft", "rrem", "mem"])
    capsule_id, content_id = await capsule_due_soon(server, "crm", family_id, ["rleft", "rrem", "mem"], 8)
    # Everyone who will be asked is listening before anything changes.
    sockets = {person: await open_socket(server, token(person)) for person in ("crm", "rleft", "mem")}
    for socket in sockets.values():
        await socket.send({"id": "1", "type": "subscribe", "payload": {"query": UNLOCKED}})
    await ok(server, "rleft", "mutation($f: ID!) { leaveFamily(familyId: $f) }", {"f": family_id})
    for removed in ("crm", "rrem"):
        await ok(
            server,
            "ana",
            "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }",
            {"f": family_id, "u": removed},
        )
    await wait_unlocked(server, "mem", capsule_id)

    # The recipient who stayed gets the event, the content and a working media URL.
    event = await sockets["mem"].next_of("next")
    unlocked = event["payload"]["data"]["capsuleUnlocked"]["capsule"]
    assert unlocked["id"] == capsule_id and unlocked["content"]["mediaUrl"]
    async with httpx.AsyncClient() as client:
        media = await client.get(unlocked["content"]["mediaUrl"])
    assert media.status_code == 200 and media.content == b"te quiero"
    await ok(
        server,
        "mem",
        'mutation($c: ID!) { addComment(contentId: $c, body: "después") { id } }',
        {"c": content_id},
    )

    for person in ("rleft", "rrem", "crm"):
        auth = token(person)
        listed = await ok(
            server,
            person,
            "{ receivedCapsules { edges { node { id } } } myCapsules { edges { node { id } } } }",
        )
        assert listed == {"receivedCapsules": {"edges": []}, "myCapsules": {"edges": []}}, person
        assert await code(server, CAPSULE, {"id": capsule_id}, auth=auth) == "NOT_FOUND"
        assert (
            await code(
                server,
                "query($id: ID!) { content(id: $id) { id comments { edges { node { body } } } } }",
                {"id": content_id},
                auth=auth,
            )
            == "NOT_FOUND"
        )
        notes = await ok(
            server, person, "{ notifications { edges { node { type capsule { id } content { id } } } } }"
        )
        assert all(n["node"]["type"] != "CAPSULE_UNLOCKED" for n in notes["notifications"]["edges"]), person
        assert all(
            n["node"]["capsule"] is None and n["node"]["content"] is None
            for n in notes["notifications"]["edges"]
        )

    # The sockets of those who left: nothing came before the answer to a ping.
    for person in ("crm", "rleft"):
        await sockets[person].send({"type": "ping"})
        assert (await sockets[person].next_of("pong"))["type"] == "pong"
        # next_of would have failed on a "next" frame before the pong.
    for socket in sockets.values():
        await socket.connection.close()


async def test_whoever_rejoins_sees_what_any_member_sees(server: ServerProcess) -> None:
    family_id = await family(server, "ana", ["ben"])
    content_id = await upload_text(server, "ana", family_id, b"hola", "antes")
    code_now = await ok(
        server, "ana", "query($id: ID!) { family(id: $id) { inviteCode } }", {"id": family_id}
    )
    await ok(server, "ben", "mutation($f: ID!) { leaveFamily(familyId: $f) }", {"f": family_id})
    query = "query($id: ID!) { content(id: $id) { title } }"
    assert await code(server, query, {"id": content_id}, auth=token("ben")) == "NOT_FOUND"
    await ok(
        server,
        "ben",
        "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }",
        {"c": code_now["family"]["inviteCode"]},
    )
    assert (await ok(server, "ben", query, {"id": content_id}))["content"]["title"] == "antes"


# 3: sealed stays sealed in tagStatus -------------------------------------------------


async def test_tag_status_counts_tags_on_sealed_content_for_its_author_only(server: ServerProcess) -> None:
    family_id = await family(server, "ana", ["ben"])
    capsule_id, content_id = await capsule_due_soon(server, "ana", family_id, ["ben"], 6)
    await ok(
        server,
        "ana",
        'mutation($c: ID!) { setTags(contentId: $c, values: ["boda"], setName: "fiestas") { value } }',
        {"c": content_id},
    )
    status = (
        'query($f: ID!) { tagStatus(familyId: $f, setName: "fiestas") { taggedByAnyone taggedByViewer } }'
    )
    assert (await ok(server, "ben", status, {"f": family_id}))["tagStatus"] == {
        "taggedByAnyone": False,
        "taggedByViewer": False,
    }
    assert (await ok(server, "ana", status, {"f": family_id}))["tagStatus"] == {
        "taggedByAnyone": True,
        "taggedByViewer": True,
    }
    search = 'query($f: ID!) { searchTags(familyId: $f, prefix: "bo") { edges { node { value } } } }'
    assert (await ok(server, "ben", search, {"f": family_id}))["searchTags"]["edges"] == []
    # Once the capsule opens, the tag counts for everyone, as search shows it.
    await wait_unlocked(server, "ben", capsule_id)
    assert (await ok(server, "ben", status, {"f": family_id}))["tagStatus"]["taggedByAnyone"] is True
    assert len((await ok(server, "ben", search, {"f": family_id}))["searchTags"]["edges"]) == 1


# 4: no token, no lookups -----------------------------------------------------------


async def test_without_a_token_every_operation_is_unauthenticated_whether_or_not_the_id_exists(
    server: ServerProcess,
) -> None:
    family_id = await family(server, "ana", [])
    content_id = await upload_text(server, "ana", family_id, b"hola", "hola")
    for query, variables in [
        ("query($id: ID!) { content(id: $id) { id } }", {"id": content_id}),
        ("query($id: ID!) { content(id: $id) { id } }", {"id": uuid.uuid4().hex}),
        ('{ user(id: "x#USER") { id } }', {}),
        ("query($id: ID!) { family(id: $id) { id } }", {"id": family_id}),
        ("{ me { id } }", {}),
        ('mutation { joinFamily(inviteCode: "AAAAA-BBBBB") { role } }', {}),
    ]:
        body = await post(server, query, variables)
        assert body["data"] is None, body
        assert [e["extensions"]["code"] for e in body["errors"]] == ["UNAUTHENTICATED"], body
    # The answers are identical: nothing tells an existing id from a missing one.
    known = await post(server, "query($id: ID!) { content(id: $id) { id } }", {"id": content_id})
    unknown = await post(server, "query($id: ID!) { content(id: $id) { id } }", {"id": uuid.uuid4().hex})
    assert known == unknown
    # Introspection stays open, for GraphiQL's docs.
    schema_name = await post(server, "{ __schema { queryType { name } } }")
    assert without_cost(schema_name) == {"data": {"__schema": {"queryType": {"name": "Query"}}}}


# 5: tokens expire on sockets too ---------------------------------------------------------


async def test_a_socket_is_closed_when_its_token_expires(server: ServerProcess) -> None:
    await family(server, "ana", [])
    for protocol in (GRAPHQL_TRANSPORT_WS, LEGACY_WS):
        socket = await open_socket(server, token("ana", ttl_seconds=3), protocol)
        if protocol == GRAPHQL_TRANSPORT_WS:
            await socket.send({"id": "1", "type": "subscribe", "payload": {"query": UNLOCKED}})
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    message = await socket.receive(seconds=30)
                    assert message["type"] in ("ka", "ping", "pong"), message
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4403, "token expired")
        else:
            await socket.send({"id": "1", "type": "start", "payload": {"query": UNLOCKED}})
            errors = []
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    message = await socket.receive(seconds=30)
                    if message["type"] == "connection_error":
                        errors.append(message["payload"]["message"])
                    else:
                        assert message["type"] in ("ka",), message
            assert errors == ["token expired"]


async def test_nothing_runs_on_a_connection_after_its_token_expired(server: ServerProcess) -> None:
    """A mutation that reaches the server after the expiry is refused, even
    before the close: the expiry is checked at every operation."""
    await ok(server, "ana", "{ me { id } }")
    expired = token("ana", ttl_seconds=-5)  # verifies nowhere: expired at the handshake already
    connection = await websockets.connect(server.ws_url, subprotocols=[GRAPHQL_TRANSPORT_WS])  # type: ignore[list-item]
    socket = Socket(connection)
    await socket.send({"type": "connection_init", "payload": {"Authorization": f"Bearer {expired}"}})
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await socket.receive()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    me = await ok(server, "ana", "{ me { givenName } }")
    assert me["me"]["givenName"] == "Ana"


# 6: text that fools people or breaks keys ---------------------------------------------------


@pytest.mark.parametrize("subject", ["a\x00b", "evil\nUSER", "   ", "x" * 129, "a#USER", "tab\there"])
async def test_a_token_subject_that_cannot_be_an_id_is_unauthenticated(
    server: ServerProcess, subject: str
) -> None:
    assert await code(server, "{ me { id } }", auth=mint_token(SECRET, subject)) == "UNAUTHENTICATED"


async def test_display_text_that_fools_readers_is_refused_naming_the_field(server: ServerProcess) -> None:
    family_id = await family(server, "ana", [])
    update = "mutation($n: String!) { updateProfile(input: {givenName: $n}) { givenName } }"
    for bad in ("Ana\x00", "Ana\x1b[31m", "An\u0085a", "A\tna"):
        body = await post(server, update, {"n": bad}, auth=token("ana"))
        assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
        assert "givenName" in body["errors"][0]["message"]
    create = "mutation($n: String!) { createFamily(input: {name: $n}) { id } }"
    for bad in ("Los \u202eaicraG", "Los\u200bGarcía", "Los \u2066García\u2069"):
        body = await post(server, create, {"n": bad}, auth=token("ana"))
        assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT", bad
        assert "name" in body["errors"][0]["message"]
    # Emoji sequences joined by zero-width joiners are text people write.
    assert (await ok(server, "ana", update, {"n": "Ana 👩‍👩‍👧"}))["updateProfile"][
        "givenName"
    ] == "Ana 👩‍👩‍👧"
    content_id = await upload_text(server, "ana", family_id, b"hola", "hola")
    comment = "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { body } }"
    assert (await ok(server, "ana", comment, {"c": content_id, "b": "línea uno\nlínea dos"}))["addComment"][
        "body"
    ] == "línea uno\nlínea dos"
    body = await post(server, comment, {"c": content_id, "b": "hola\u202e"}, auth=token("ana"))
    assert (
        body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT" and "body" in body["errors"][0]["message"]
    )
    tags = 'mutation($c: ID!) { setTags(contentId: $c, values: ["a\u200bb"]) { value } }'
    body = await post(server, tags, {"c": content_id}, auth=token("ana"))
    assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


HIDDEN = {
    "line separator": "Ana\u2028López",
    "paragraph separator": "Ana\u2029López",
    "tag characters": "Ana\U000e0041\U000e0042",
    "a lone cancel tag": "Ana\U000e007f",
    "interlinear annotation": "Ana\ufff9López\ufffa\ufffb",
    "a left-to-right mark": "Ana\u200eLópez",
    "a right-to-left mark": "\u200fמרים",
    "an Arabic letter mark": "Ana\u061c",
    "a right-to-left override": "Ana\u202eLópez",
}


async def test_hidden_breaks_tags_annotations_and_bidi_marks_are_refused(
    server: ServerProcess,
) -> None:
    family_id = await family(server, "ana", [])
    content_id = await upload_text(server, "ana", family_id, b"hola", "hola")
    update = "mutation($n: String!) { updateProfile(input: {givenName: $n}) { givenName } }"
    create = "mutation($n: String!) { createFamily(input: {name: $n}) { id } }"
    comment = "mutation($c: ID!, $n: String!) { addComment(contentId: $c, body: $n) { body } }"
    for what, bad in HIDDEN.items():
        for query, field, extra in (
            (update, "givenName", {}),
            (create, "name", {}),
            (comment, "body", {"c": content_id}),
        ):
            body = await post(server, query, {"n": bad, **extra}, auth=token("ana"))
            assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT", (what, field)
            assert field in body["errors"][0]["message"], (what, field)
        # An invite mails its address, and the family's admins read it in the list of invites.
        invite = "mutation($f: ID!, $e: String!) { createInvite(input: {familyId: $f, email: $e}) { id } }"
        body = await post(server, invite, {"f": family_id, "e": f"{bad}@example.org"}, auth=token("ana"))
        assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT", (what, "email")
        assert "email" in body["errors"][0]["message"], (what, "email")
    # A right-to-left name shows by its letters' own direction; a subdivision flag is its tags.
    for fine in (
        "מרים",
        "Ana \U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    ):
        assert (await ok(server, "ana", update, {"n": fine}))["updateProfile"]["givenName"] == fine


async def test_a_token_name_that_would_fool_readers_is_not_taken_into_the_profile(
    server: ServerProcess,
) -> None:
    me = await ok(server, "eve", "{ me { givenName } }") if False else None
    assert me is None
    body = await post(
        server, "{ me { id givenName } }", auth=mint_token(SECRET, "eve", given_name="Eve\x1b[2J")
    )
    assert body["data"]["me"] == {"id": "eve", "givenName": None}


async def test_a_mime_type_must_follow_rfc_6838(server: ServerProcess) -> None:
    family_id = await family(server, "ana", [])
    create = """mutation($m: String!, $f: ID!) { createUpload(input: {familyId: $f, type: TEXT,
      mimeType: $m, sizeBytes: 4}) { content { id } } }"""
    for bad in (
        "text/plain\r\nx-evil: 1",
        "text/",
        "text/plain; charset=utf-8",
        "text/pl ain",
        "text/plain\x00",
    ):
        body = await post(server, create, {"m": bad, "f": family_id}, auth=token("ana"))
        assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT", bad
        assert "mimeType" in body["errors"][0]["message"] or "MIME" in body["errors"][0]["message"]
    for good in ("text/plain", "text/vnd.a+b", "TEXT/Markdown"):
        assert (await ok(server, "ana", create, {"m": good, "f": family_id}))["createUpload"]["content"]["id"]
