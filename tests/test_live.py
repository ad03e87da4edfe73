"""End to end against a real uvicorn process: the gql client over HTTP and over
WebSockets (graphql-transport-ws and the legacy graphql-ws), real uploads,
the real pipeline and the real unlock scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from gql import Client, GraphQLRequest
from gql.transport.httpx import HTTPXAsyncTransport
from gql.transport.websockets import WebsocketsTransport
from websockets.typing import Subprotocol

from tests import media_factory
from tests.servers import ServerProcess, metric_total, until
from tests.servers import token as person_token

# Every person here has an address: mail is part of what these tests follow.
token = functools.partial(person_token, email=True)


def ws_client(server: ServerProcess, user: str | None, legacy: bool = False) -> Client:
    transport = WebsocketsTransport(
        url=server.ws_url,
        init_payload={"Authorization": f"Bearer {token(user)}"} if user else {},
        subprotocols=[
            WebsocketsTransport.APOLLO_SUBPROTOCOL if legacy else WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL
        ],
    )
    return Client(transport=transport)


async def http(server: ServerProcess, user: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    transport = HTTPXAsyncTransport(
        url=f"{server.url}/graphql", headers={"Authorization": f"Bearer {token(user)}"}
    )
    async with Client(transport=transport) as session:
        return await session.execute(GraphQLRequest(query, variable_values=variables or {}))


async def make_family(server: ServerProcess, admin: str, members: list[str]) -> str:
    created = await http(server, admin, 'mutation { createFamily(input: {name: "Live"}) { id inviteCode } }')
    for member in members:
        await http(
            server,
            member,
            "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }",
            {"c": created["createFamily"]["inviteCode"]},
        )
    return str(created["createFamily"]["id"])


async def upload(
    server: ServerProcess,
    user: str,
    family_id: str,
    kind: str,
    body: bytes,
    mime: str,
    capsule_id: str | None = None,
    complete: bool = True,
    title: str | None = None,
) -> str:
    created = await http(
        server,
        user,
        """mutation($i: CreateUploadInput!) {
        createUpload(input: $i) { uploadUrl content { id } } }""",
        {
            "i": {
                "familyId": family_id,
                "type": kind,
                "mimeType": mime,
                "sizeBytes": len(body),
                "capsuleId": capsule_id,
                "title": title,
            }
        },
    )
    async with httpx.AsyncClient() as client:
        response = await client.put(
            created["createUpload"]["uploadUrl"], content=body, headers={"Content-Type": mime}
        )
        assert response.status_code == 200
    content_id = str(created["createUpload"]["content"]["id"])
    if complete:
        await http(
            server,
            user,
            "mutation($id: ID!) { completeUpload(contentId: $id) { status } }",
            {"id": content_id},
        )
    return content_id


async def collect(events: AsyncIterator[dict[str, Any]], last: Any, seconds: float) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def run() -> None:
        async for event in events:
            found.append(event)
            if last(event):
                return

    await asyncio.wait_for(run(), seconds)
    return found


async def test_foundation_operations_over_gql_http(live_server: ServerProcess) -> None:
    family_id = await make_family(live_server, "ana", ["ben"])
    data = await http(
        live_server,
        "ben",
        """query($id: ID!) { me { id email } family(id: $id) {
        name viewerRole members { edges { node { role user { givenName } } } } } }""",
        {"id": family_id},
    )
    assert data["me"] == {"id": "ben", "email": "ben@example.org"}
    assert data["family"]["viewerRole"] == "MEMBER"
    assert sorted(e["node"]["user"]["givenName"] for e in data["family"]["members"]["edges"]) == [
        "Ana",
        "Ben",
    ]


@pytest.mark.parametrize("legacy", [False, True], ids=["graphql-transport-ws", "graphql-ws"])
async def test_content_status_walks_to_ready_over_websocket(
    live_server: ServerProcess, legacy: bool, tmp_path: Path
) -> None:
    family_id = await make_family(live_server, "ana", ["ben"])
    video = media_factory.make_video_with_tone(tmp_path).read_bytes()
    created = await http(
        live_server,
        "ana",
        """mutation($i: CreateUploadInput!) {
        createUpload(input: $i) { uploadUrl content { id } } }""",
        {"i": {"familyId": family_id, "type": "VIDEO", "mimeType": "video/mp4", "sizeBytes": len(video)}},
    )
    content_id = created["createUpload"]["content"]["id"]
    subscription = GraphQLRequest(
        "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }",
        variable_values={"id": content_id},
    )
    async with ws_client(live_server, "ben", legacy) as session:
        events = session.subscribe(subscription)
        first = await asyncio.wait_for(anext(events), 10)
        assert first == {"contentStatusChanged": {"status": "UPLOADING"}}
        async with httpx.AsyncClient() as client:
            response = await client.put(
                created["createUpload"]["uploadUrl"], content=video, headers={"Content-Type": "video/mp4"}
            )
            assert response.status_code == 200
        await http(
            live_server,
            "ana",
            "mutation($id: ID!) { completeUpload(contentId: $id) { status } }",
            {"id": content_id},
        )
        rest = await collect(events, lambda e: e["contentStatusChanged"]["status"] == "READY", 60)
    statuses = [e["contentStatusChanged"]["status"] for e in rest]
    assert statuses == ["PROCESSING", "TRANSCODING", "TRANSCRIBING", "READY"]


async def test_a_socket_without_a_valid_token_is_closed_unauthorized(live_server: ServerProcess) -> None:
    for payload in ({}, {"Authorization": "Bearer not-a-token"}):
        async with websockets.connect(
            live_server.ws_url, subprotocols=[Subprotocol("graphql-transport-ws")]
        ) as socket:
            import json

            await socket.send(json.dumps({"type": "connection_init", "payload": payload}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(socket.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403


async def ready_on(session: Any, person_content: str) -> None:
    """Returns once the session's earlier subscriptions are registered: a
    `contentStatusChanged` sent after them answers at once with the content's
    status, and the server starts a socket's operations in the order they come."""
    request = GraphQLRequest(
        "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }",
        variable_values={"id": person_content},
    )
    stream = session.subscribe(request)
    await asyncio.wait_for(anext(stream), 30)
    await stream.aclose()


async def capsule_for(
    live_server: ServerProcess,
    family_id: str,
    title: str,
    unlock: datetime,
    recipients: tuple[str, ...] = ("ben",),
) -> str:
    made = await http(
        live_server,
        "ana",
        """mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id status } }""",
        {
            "i": {
                "familyId": family_id,
                "title": title,
                "unlockDate": unlock.isoformat(),
                "recipientIds": list(recipients),
            }
        },
    )
    capsule_id = str(made["createCapsule"]["id"])
    await http(
        live_server,
        "ana",
        "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }",
        {"id": capsule_id},
    )
    return capsule_id


async def test_capsule_unlocks_over_websocket_once(live_server: ServerProcess) -> None:
    family_id = await make_family(live_server, "ana", ["ben"])
    note = await upload(live_server, "ana", family_id, "TEXT", b"hola", "text/plain")
    unlock = datetime.now(UTC) + timedelta(seconds=6)
    capsule = {"id": await capsule_for(live_server, family_id, "Para Ben", unlock)}
    # A second capsule, due after the first: its event is the sentinel that
    # shows nothing (a duplicate) came on the stream between the two.
    sentinel = await capsule_for(live_server, family_id, "Y luego", unlock + timedelta(seconds=3))
    subscription = GraphQLRequest(
        "subscription { capsuleUnlocked { unlockedAt capsule { id status title content { id status } } } }"
    )
    got: list[dict[str, Any]] = []
    async with ws_client(live_server, "ben") as session:

        async def listen() -> None:
            async for event in session.subscribe(subscription):
                got.append(event)

        listener = asyncio.create_task(listen())
        await ready_on(session, note)
        content_id = await upload(
            live_server, "ana", family_id, "TEXT", b"para ti", "text/plain", capsule_id=capsule["id"]
        )
        await upload(live_server, "ana", family_id, "TEXT", b"y esto", "text/plain", capsule_id=sentinel)
        # Until it opens, ben sees neither the content nor it in the feed.
        sealed = await http(
            live_server,
            "ben",
            "query($id: ID!) { family(id: $id) { feed { edges { node { id } } } } }",
            {"id": family_id},
        )
        assert [e["node"]["id"] for e in sealed["family"]["feed"]["edges"]] == [note]
        await until(
            lambda: any(e["capsuleUnlocked"]["capsule"]["id"] == sentinel for e in got),
            lambda: f"the sentinel after {got}",
            interval=0.05,
        )
        listener.cancel()
    assert [e["capsuleUnlocked"]["capsule"]["id"] for e in got] == [capsule["id"], sentinel]
    event = got[0]
    assert event["capsuleUnlocked"]["capsule"] == {
        "id": capsule["id"],
        "status": "AVAILABLE",
        "title": "Para Ben",
        "content": {"id": content_id, "status": "READY"},
    }
    notes = await http(
        live_server, "ben", "{ notifications { edges { node { type capsule { id status } } } } }"
    )
    unlocked = [
        e["node"]["capsule"]["id"]
        for e in notes["notifications"]["edges"]
        if e["node"]["type"] == "CAPSULE_UNLOCKED"
    ]
    assert sorted(unlocked) == sorted([capsule["id"], sentinel])
    feed = await http(
        live_server,
        "ben",
        "query($id: ID!) { family(id: $id) { feed { edges { node { id } } } } }",
        {"id": family_id},
    )
    assert content_id in [e["node"]["id"] for e in feed["family"]["feed"]["edges"]]


async def shared_frames(server: ServerProcess) -> float:
    return await metric_total(server, "mifamilias_events_shared_frames_total", subscription="capsuleUnlocked")


async def test_alike_subscribers_get_their_class_frame_encoded_once(live_server: ServerProcess) -> None:
    """Recipients alike (MEMBERs who receive the capsule and wrote none of it)
    are one class: one of them leads it the ordinary way, the others get the
    class's frame with their own operation and event ids, over both WebSocket
    protocols; the creator is a class of its own."""
    family_id = await make_family(live_server, "ana", ["ben", "cai", "dora"])
    note = await upload(live_server, "ana", family_id, "TEXT", b"hola", "text/plain")
    unlock = datetime.now(UTC) + timedelta(seconds=6)
    capsule_id = await capsule_for(live_server, family_id, "Para todos", unlock, ("ben", "cai", "dora"))
    content_id = await upload(
        live_server, "ana", family_id, "TEXT", b"para todos", "text/plain", capsule_id=capsule_id
    )
    subscription = GraphQLRequest(
        "subscription { capsuleUnlocked { id unlockedAt capsule { id title status content { id status } } } }"
    )
    before = await shared_frames(live_server)
    got: dict[str, dict[str, Any]] = {}
    people = {"ana": False, "ben": False, "cai": False, "dora": True}  # dora on the legacy protocol
    async with contextlib.AsyncExitStack() as stack:
        listeners = []
        for person, legacy in people.items():
            session = await stack.enter_async_context(ws_client(live_server, person, legacy=legacy))

            async def listen(session: Any = session, person: str = person) -> None:
                async for event in session.subscribe(subscription):
                    got[person] = event["capsuleUnlocked"]
                    return

            listeners.append(asyncio.create_task(listen()))
            await ready_on(session, note)
        await until(lambda: len(got) == len(people), lambda: f"every opening, got {got}", interval=0.05)
        await asyncio.gather(*listeners)
    assert await shared_frames(live_server) - before == 2  # ben, cai, dora: one leads
    for person, event in got.items():
        notes = await http(
            live_server, person, "{ notifications { edges { node { id type capsule { id } } } } }"
        )
        [own] = [
            e["node"]["id"]
            for e in notes["notifications"]["edges"]
            if e["node"]["type"] == "CAPSULE_UNLOCKED" and e["node"]["capsule"]["id"] == capsule_id
        ]
        assert event.pop("id") == own  # each its own event id
    assert len({json.dumps(event, sort_keys=True) for event in got.values()}) == 1
    assert got["ben"]["capsule"] == {
        "id": capsule_id,
        "title": "Para todos",
        "status": "AVAILABLE",
        "content": {"id": content_id, "status": "READY"},
    }


async def test_notifications_arrive_live_and_stop_for_a_removed_member(live_server: ServerProcess) -> None:
    family_id = await make_family(live_server, "nia", ["olo", "pau"])
    # A second family where pau stays a member: its news is pau's sentinel.
    other_family = await make_family(live_server, "quin", ["pau"])
    zero = await upload(live_server, "nia", family_id, "TEXT", b"cero", "text/plain", title="cero")
    got: dict[str, list[dict[str, Any]]] = {"olo": [], "pau": []}
    ready = {person: asyncio.Event() for person in ("olo", "pau")}
    status_events: list[str] = []

    async def notifications(person: str) -> None:
        request = GraphQLRequest("subscription { notificationAdded { type content { title } } }")
        async with ws_client(live_server, person) as session:

            async def mark_ready() -> None:
                await ready_on(session, zero)
                ready[person].set()

            marker = asyncio.create_task(mark_ready())
            async for event in session.subscribe(request):
                note = event["notificationAdded"]
                # "cero" was uploaded before the streams started; its news is published when its
                # processing ends, which may come before they listen or after: either is right.
                if (note.get("content") or {}).get("title") != "cero":
                    got[person].append(note)
            await marker

    async def statuses(content_id: str) -> None:
        request = GraphQLRequest(
            "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }",
            variable_values={"id": content_id},
        )
        async with ws_client(live_server, "pau") as session:
            async for event in session.subscribe(request):
                status_events.append(event["contentStatusChanged"]["status"])

    async def heard(check: Any, what: str) -> None:
        await until(check, lambda: f"{what}: {got}, {status_events}", interval=0.05)

    listeners = [asyncio.create_task(notifications(p)) for p in ("olo", "pau")]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in ready.values())), 30)
    first = await upload(live_server, "nia", family_id, "TEXT", b"uno", "text/plain")
    await heard(lambda: got["olo"] and got["pau"], "the first notifications")
    assert got["olo"] == got["pau"] == [{"type": "NEW_CONTENT", "content": {"title": None}}]
    assert first

    second = await upload(live_server, "nia", family_id, "TEXT", b"dos", "text/plain", complete=False)
    watcher = asyncio.create_task(statuses(second))
    await heard(lambda: status_events, "the status now")
    assert status_events == ["UPLOADING"]
    await http(
        live_server,
        "nia",
        "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }",
        {"f": family_id, "u": "pau"},
    )
    await http(
        live_server, "nia", "mutation($id: ID!) { completeUpload(contentId: $id) { status } }", {"id": second}
    )
    await heard(lambda: len(got["olo"]) >= 2, "olo's second notification")
    # News from pau's other family comes after everything of the first: what
    # pau has by then is all pau will get of it.
    await upload(live_server, "quin", other_family, "TEXT", b"otra", "text/plain", title="otra")
    await heard(lambda: len(got["pau"]) >= 2, "pau's sentinel")
    for task in [*listeners, watcher]:
        task.cancel()
    assert len(got["olo"]) == 2
    # No longer a member: no notification of the family, and no status of its content.
    assert got["pau"] == [
        {"type": "NEW_CONTENT", "content": {"title": None}},
        {"type": "NEW_CONTENT", "content": {"title": "otra"}},
    ]
    assert status_events == ["UPLOADING"]


@pytest.mark.parametrize("legacy", [False, True], ids=["graphql-transport-ws", "graphql-ws"])
async def test_foundation_mutations_over_a_websocket(live_server: ServerProcess, legacy: bool) -> None:
    # Queries and mutations over the legacy protocol too: `data`, then `complete`.
    quim_id, rut_id = ("quim", "rut") if not legacy else ("quim2", "rut2")
    async with ws_client(live_server, quim_id, legacy) as quim, ws_client(live_server, rut_id, legacy) as rut:

        async def run(session: Any, query: str, **variables: Any) -> Any:
            return await session.execute(GraphQLRequest(query, variable_values=variables))

        await run(quim, 'mutation { updateProfile(input: {givenName: "Quim"}) { givenName } }')
        assert (await run(quim, "mutation { completeOnboarding { onboardingComplete } }"))[
            "completeOnboarding"
        ] == {"onboardingComplete": True}
        family = (
            await run(
                quim, 'mutation { createFamily(input: {name: "WS", trustLevel: CLOSED}) { id inviteCode } }'
            )
        )["createFamily"]
        code = (
            await run(
                quim, "mutation($f: ID!) { rotateInviteCode(familyId: $f) { inviteCode } }", f=family["id"]
            )
        )["rotateInviteCode"]["inviteCode"]
        assert (await run(rut, "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }", c=code))[
            "joinFamily"
        ] == {"role": "PENDING"}
        assert (
            await run(
                quim,
                "mutation($f: ID!, $u: ID!) { approveMember(familyId: $f, userId: $u) { role } }",
                f=family["id"],
                u=rut_id,
            )
        )["approveMember"] == {"role": "MEMBER"}
        mine = await run(
            rut, "{ myFamilies { role family { name members { edges { node { user { givenName } } } } } } }"
        )
        assert mine["myFamilies"][0]["role"] == "MEMBER"
        from gql.transport.exceptions import TransportQueryError

        with pytest.raises(TransportQueryError) as refused:
            await run(
                rut,
                "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }",
                f=family["id"],
                u=quim_id,
            )
        assert (
            refused.value.errors is not None and refused.value.errors[0]["extensions"]["code"] == "FORBIDDEN"
        )
        assert (await run(rut, "mutation($f: ID!) { leaveFamily(familyId: $f) }", f=family["id"]))[
            "leaveFamily"
        ]


async def test_sealed_content_status_cannot_be_watched_by_others(live_server: ServerProcess) -> None:
    family_id = await make_family(live_server, "sol", ["tea"])
    unlock = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    capsule = (
        await http(
            live_server,
            "sol",
            """mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }""",
            {"i": {"familyId": family_id, "title": "Sellado", "unlockDate": unlock, "recipientIds": ["tea"]}},
        )
    )["createCapsule"]
    await http(
        live_server,
        "sol",
        "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }",
        {"id": capsule["id"]},
    )
    content_id = await upload(
        live_server,
        "sol",
        family_id,
        "TEXT",
        b"secreto",
        "text/plain",
        capsule_id=capsule["id"],
        complete=False,
    )
    request = GraphQLRequest(
        "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }",
        variable_values={"id": content_id},
    )
    from gql.transport.exceptions import TransportQueryError

    async with ws_client(live_server, "tea") as session:
        with pytest.raises(TransportQueryError) as refused:
            await asyncio.wait_for(anext(session.subscribe(request)), 10)
    assert refused.value.errors is not None and refused.value.errors[0]["extensions"]["code"] == "NOT_FOUND"
    async with ws_client(live_server, "sol") as session:
        first = await asyncio.wait_for(anext(session.subscribe(request)), 10)
    assert first == {"contentStatusChanged": {"status": "UPLOADING"}}
