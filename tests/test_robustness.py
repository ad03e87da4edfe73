"""No single request stalls the server: clean refusals over real HTTP and real
WebSockets, limits that hold before anything runs, a pipeline that survives a
SIGKILL mid-transcode, readiness that follows Redis, and a SIGTERM that closes
sockets with 1001, lets a request finish and hands pipeline leases back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from resolvers.core import leases
from resolvers.core.auth import mint_token
from store import keys
from store.items import iso
from store.port import Update
from tests import leftovers, media_factory
from tests.servers import (
    SECRET,
    RedisProcess,
    ServerProcess,
    engine_env,
    pipeline_env,
    post_graphql,
    server_table,
    until,
)

ANA = mint_token(SECRET, "ana", given_name="Ana")


def no_traceback(server: ServerProcess) -> None:
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


# Clean refusals ---------------------------------------------------------------------


async def test_bodies_that_are_not_graphql_requests_get_json_errors(live_server: ServerProcess) -> None:
    url = f"{live_server.url}/graphql"
    headers = {"Authorization": f"Bearer {ANA}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as client:
        for body in (b'"x"', b"null", b"1", b"true", b"[1, 2]", b"not json", b"{"):
            response = await client.post(url, content=body, headers=headers)
            assert response.status_code == 400, (body, response.text)
            error = response.json()["errors"][0]
            assert error["extensions"]["code"] == "BAD_USER_INPUT" and error["message"], body
        response = await client.post(url, content=b"{}", headers=headers)
        assert response.status_code == 400 and "query" in response.json()["errors"][0]["message"]
        response = await client.post(url, content=b"query", headers={**headers, "Content-Type": "text/plain"})
        assert response.status_code == 400 and response.json()["errors"][0]["extensions"]["code"]
        # A subscription needs a stream: plain HTTP says how to subscribe.
        subscription = "subscription { notificationAdded { id } }"
        for response in (
            await client.post(url, json={"query": subscription}, headers=headers),
            await client.get(url, params={"query": subscription}, headers=headers),
        ):
            assert response.status_code == 400, response.text
            error = response.json()["errors"][0]
            assert error["extensions"]["code"] == "BAD_USER_INPUT"
            for way in ("WebSocket", "text/event-stream", "multipart/mixed"):
                assert way in error["message"]
        # Syntax errors carry the contract's code.
        response = await client.post(url, json={"query": "{ me { "}, headers=headers)
        assert response.json()["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
        # So is an empty selection set (which graphql-core parses), signed in or not.
        empty = '{ capsule(id: "x") { id content { } } }'
        for ask in (headers, {"Content-Type": "application/json"}):
            error = (await client.post(url, json={"query": empty}, headers=ask)).json()["errors"][0]
            assert error["extensions"]["code"] == "BAD_USER_INPUT" and "empty" in error["message"], error
        healthy = await client.get(f"{live_server.url}/healthz")
        assert healthy.status_code == 200
    no_traceback(live_server)


async def test_a_body_over_the_limit_is_refused_while_it_is_read(live_server: ServerProcess) -> None:
    url = f"{live_server.url}/graphql"
    ids = ",".join(['"xx"'] * 6_000_000)  # 6 million entries, 30 MB
    body = f'{{"query": "query($ids: [ID!]) {{ me {{ id }} }}", "variables": {{"ids": [{ids}]}}}}'.encode()
    headers = {"Authorization": f"Bearer {ANA}", "Content-Type": "application/json"}

    async def chunks() -> AsyncIterator[bytes]:
        # No Content-Length at all: the limit counts what arrives.
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    async with httpx.AsyncClient(timeout=60) as client:
        declared = await client.post(url, content=body, headers=headers)
        streamed = await client.post(url, content=chunks(), headers=headers)
        for response in (declared, streamed):
            assert response.status_code == 413
            error = response.json()["errors"][0]
            assert error["extensions"] == {"code": "BAD_USER_INPUT", "maxBytes": 1024 * 1024}
        assert (await client.get(f"{live_server.url}/healthz")).status_code == 200
    no_traceback(live_server)


async def _socket(server: ServerProcess, protocol: str) -> Any:
    connection = await websockets.connect(server.ws_url, subprotocols=[protocol])  # type: ignore[list-item]
    await connection.send(
        json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {ANA}"}})
    )
    assert json.loads(await connection.recv())["type"] == "connection_ack"
    return connection


async def _closed_with(connection: Any) -> tuple[int, str]:
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            message = json.loads(await asyncio.wait_for(connection.recv(), 30))
            assert message["type"] in ("ka", "ping"), message
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


@pytest.mark.parametrize("protocol", ["graphql-transport-ws", "graphql-ws"])
@pytest.mark.parametrize(
    "frame",
    [
        "[1,2]",
        '"x"',
        "null",
        '{"type": 1}',
        '{"id": "1", "type": "subscribe", "payload": null}',
        '{"id": "1", "type": "start", "payload": null}',
        '{"id": "1", "type": "subscribe", "payload": {"query": 1}}',
        '{"id": 2, "type": "subscribe", "payload": {"query": "{ me { id } }"}}',
    ],
)
async def test_malformed_websocket_frames_close_with_4400(
    live_server: ServerProcess, protocol: str, frame: str
) -> None:
    connection = await _socket(live_server, protocol)
    await connection.send(frame)
    assert await _closed_with(connection) == (4400, "malformed message")
    no_traceback(live_server)


async def test_a_websocket_frame_over_the_body_limit_closes_the_socket(live_server: ServerProcess) -> None:
    connection = await websockets.connect(live_server.ws_url, subprotocols=["graphql-transport-ws"])  # type: ignore[list-item]
    # The server refuses the frame from its header and closes at once; the client
    # may still be sending the rest, in which case the close reaches it as a reset.
    with pytest.raises((websockets.ConnectionClosed, ConnectionResetError)):
        await connection.send(json.dumps({"type": "connection_init", "payload": {"pad": "x" * (2 << 20)}}))
        await asyncio.wait_for(connection.recv(), 30)
    # 1009 "message too big" when the close frame arrived; 1006 when it was lost to the reset.
    assert connection.close_code in (1009, 1006)
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{live_server.url}/healthz")).status_code == 200
    no_traceback(live_server)


# A crash mid-upload ------------------------------------------------------------------------


async def test_a_body_cut_off_by_a_killed_server_is_swept_as_the_next_one_starts(tmp_path: Path) -> None:
    """The temp file of a PUT under way when its server was SIGKILLed goes when
    a server starts again on the same data, not days later by its age. (Local
    media are files whatever the table's engine.)"""
    env = {"MIFAMILIAS_AUTH_SECRET": SECRET}
    first = ServerProcess(tmp_path / "data", env, name="first").start()
    parts = tmp_path / "data" / "media" / ".tmp"
    held = asyncio.Event()
    try:
        created = await _upload_in_a_new_family(first, "AUDIO", "audio/mpeg", 4 << 20)

        async def body() -> AsyncIterator[bytes]:
            yield b"\0" * (1 << 20)
            await held.wait()  # the rest never comes: the server dies first

        async def put() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                with contextlib.suppress(httpx.HTTPError):
                    await client.put(
                        created["uploadUrl"],
                        content=body(),
                        headers={"Content-Type": "audio/mpeg"},
                    )

        sending = asyncio.create_task(put())

        async def writing() -> bool:
            return any(parts.glob("*.part"))

        await until(writing, "the body to be written to a temp file")
        first.kill()
        held.set()
        await sending
    finally:
        first.stop()
    assert any(parts.glob("*.part"))  # left by the killed server
    second = ServerProcess(tmp_path / "data", env, name="second").start()
    try:

        async def swept() -> bool:
            return not any(parts.glob("*.part"))

        await until(swept, "the next server to sweep the cut-off body")
    finally:
        second.stop()


# A crash mid-transcode --------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "dynamodb"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    async with engine_env(request.param, request) as env:
        yield env


async def _gql(server: ServerProcess, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    return await post_graphql(server, ANA, query, variables)


async def _upload_in_a_new_family(server: ServerProcess, kind: str, mime: str, size: int) -> dict[str, Any]:
    """createUpload's answer (`uploadUrl`, `content { id }`) in a family made for it."""
    made = await _gql(server, 'mutation { createFamily(input: {name: "Los Ruiz"}) { id } }')
    created = await _gql(
        server,
        "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
        {
            "i": {
                "familyId": made["data"]["createFamily"]["id"],
                "type": kind,
                "mimeType": mime,
                "sizeBytes": size,
            }
        },
    )
    return dict(created["data"]["createUpload"])


async def _start_video(server: ServerProcess, video: Path) -> str:
    body = await asyncio.to_thread(video.read_bytes)
    created = await _upload_in_a_new_family(server, "VIDEO", "video/mp4", len(body))
    async with httpx.AsyncClient(timeout=60) as client:
        assert (
            await client.put(created["uploadUrl"], content=body, headers={"Content-Type": "video/mp4"})
        ).status_code == 200
    content_id = str(created["content"]["id"])
    done = await _gql(
        server, "mutation($id: ID!) { completeUpload(contentId: $id) { status } }", {"id": content_id}
    )
    assert "errors" not in done, done
    return content_id


async def _status(server: ServerProcess, content_id: str) -> str:
    body = await _gql(server, "query($id: ID!) { content(id: $id) { status } }", {"id": content_id})
    return str(body["data"]["content"]["status"])


@pytest.fixture(scope="module")
def long_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A video whose transcode is under way when its status reads TRANSCODING
    (about a second of x264 work at 640×360, which the tests pause to hold it
    there), made once for the module's tests."""
    return media_factory.make_video_with_tone(tmp_path_factory.mktemp("video"), size=(640, 360), seconds=30)


async def _pause_the_video_conversion(server: ServerProcess, content_id: str) -> list[int]:
    """Stops (SIGSTOP) the server's ffmpeg converting the content's video, once
    it runs, so that its work cannot finish until it is killed or resumed; its pids."""
    assert server.process is not None
    server_pid = server.process.pid

    async def converting() -> list[int]:
        found = [p.pid for p in leftovers.descendants(server_pid) if "libx264" in p.command]
        if not found:  # not started yet, or (the test cannot hold it then) done already
            status = await _status(server, content_id)
            assert status == "TRANSCODING", f"the transcode ended before it could be paused: {status}"
        return found

    paused: list[int] = await until(converting, "ffmpeg to convert the video", interval=0.02)
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    return paused


async def _killed_mid_transcode(
    engine: dict[str, str], tmp_path: Path, video: Path, lease_seconds: int = 3
) -> str:
    """A server process SIGKILLed while it transcodes `video`: the content's id."""
    env = pipeline_env(engine, MIFAMILIAS_PIPELINE_LEASE_SECONDS=str(lease_seconds))
    first = ServerProcess(tmp_path / "data", env, name="first").start()
    try:
        content_id = await _start_video(first, video)

        async def transcoding() -> bool:
            status = await _status(first, content_id)
            assert status in ("PROCESSING", "TRANSCODING"), status  # it must not finish before the kill
            return status == "TRANSCODING"

        await until(transcoding, "the transcode to start")
        # Paused, the transcode (about a second) cannot finish before the kill
        # however busy the machine; resumed, it runs on orphaned as after a crash.
        paused = await _pause_the_video_conversion(first, content_id)
        first.kill()
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    finally:
        first.stop()
    return content_id


async def test_content_held_by_a_killed_worker_resumes_within_the_lease(
    engine: dict[str, str], tmp_path: Path, long_video: Path
) -> None:
    content_id = await _killed_mid_transcode(engine, tmp_path, long_video)
    second = ServerProcess(tmp_path / "data", pipeline_env(engine), name="second").start()
    try:
        seen = await _statuses_until_ready(second, content_id, "the content to be READY after the restart")
        assert "FAILED" not in seen
    finally:
        second.stop()


async def test_stalled_content_can_be_retried_once_its_lease_ran_out(
    engine: dict[str, str], tmp_path: Path, long_video: Path
) -> None:
    # A dead worker's lease that outlasts the test, and a successor that sweeps
    # once, as it starts, and then not for an hour: only the author's retry can
    # move the content, and only once the lease has run out. The lease's running
    # out is written into the table (its expiry set in the past), which is all
    # that the passing of its time changes.
    content_id = await _killed_mid_transcode(engine, tmp_path, long_video, lease_seconds=3600)
    second = ServerProcess(
        tmp_path / "data", pipeline_env(engine, MIFAMILIAS_PIPELINE_RECOVERY_SECONDS="3600"), name="second"
    ).start()
    try:
        retry = "mutation($id: ID!) { retryContent(contentId: $id) { status } }"
        refused = await _gql(second, retry, {"id": content_id})
        # While the dead worker's lease runs, the content counts as being processed.
        assert refused["errors"][0]["extensions"]["code"] == "CONFLICT", refused
        async with server_table(second) as table:
            await table.update(
                Update(
                    keys.content(content_id),
                    set={leases.UNTIL: iso(datetime.now(UTC) - timedelta(seconds=1))},
                )
            )
        retried = await _gql(second, retry, {"id": content_id})
        assert "errors" not in retried, retried
        await until(lambda: _is(second, content_id, "READY"), "the retried content to be READY", seconds=180)
    finally:
        second.stop()


async def _statuses_until_ready(server: ServerProcess, content_id: str, what: str) -> list[str]:
    """The statuses read, polling with a deadline, until the content is READY."""
    seen: list[str] = []

    async def ready() -> bool:
        seen.append(await _status(server, content_id))
        return seen[-1] == "READY"

    await until(ready, what, seconds=180)
    return seen


async def _is(server: ServerProcess, content_id: str, status: str) -> bool:
    return await _status(server, content_id) == status


async def _exited(server: ServerProcess) -> None:
    """Waits for a process told to stop to exit by itself."""
    assert server.process is not None
    process = server.process

    async def gone() -> bool:
        return process.poll() is not None

    await until(gone, f"{server.name} to exit", seconds=60)


async def test_a_worker_stopped_mid_transcode_hands_its_lease_back(
    engine: dict[str, str], tmp_path: Path, long_video: Path
) -> None:
    # A lease nobody outlives here: only a lease handed back lets the second
    # process take the content, and its recovery pass looks twice a second.
    env = pipeline_env(engine, MIFAMILIAS_PIPELINE_LEASE_SECONDS="3600")
    first = ServerProcess(tmp_path / "data", env, name="first").start()
    second: ServerProcess | None = None
    try:
        content_id = await _start_video(first, long_video)

        async def transcoding() -> bool:
            status = await _status(first, content_id)
            assert status in ("PROCESSING", "TRANSCODING"), status  # it must not finish before the stop
            return status == "TRANSCODING"

        await until(transcoding, "the transcode to start")
        assert first.process is not None
        # The transcode takes about a second, less than a server's start on a busy
        # machine: paused, it is still under way whenever the stop comes.
        await _pause_the_video_conversion(first, content_id)
        # Started now, the second process finds the content claimed by the first.
        second = ServerProcess(tmp_path / "data", env, name="second").start()
        first.process.send_signal(signal.SIGTERM)
        await _exited(first)
        assert f"pipeline: handed back {keys.content(content_id)[0]}" in first.log()
        seen = await _statuses_until_ready(second, content_id, "the second process to finish the content")
        assert "FAILED" not in seen
    finally:
        first.stop()
        if second is not None:
            second.stop()
    no_traceback(first)
    assert second is not None
    no_traceback(second)


# Probes and shutdown -------------------------------------------------------------------------


async def test_readiness_follows_redis(tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path / "redis").start()
    server = ServerProcess(
        tmp_path / "data", {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_REDIS_URL": redis.url}
    ).start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            answers: list[tuple[int, dict[str, Any]]] = []

            async def answers_with(status: int) -> bool:
                response = await client.get(f"{server.url}/readyz")
                answers.append((response.status_code, response.json()))
                return response.status_code == status

            assert await answers_with(200), answers
            assert answers[-1][1] == {"status": "ready"}
            redis.stop()
            await until(lambda: answers_with(503), "/readyz to see Redis stopped", seconds=30)
            body = answers[-1][1]
            assert body["status"] == "unavailable" and body["store"] == "ok", body
            assert body["broker"].startswith("Redis did not answer"), body
            # Liveness is the process's own.
            assert (await client.get(f"{server.url}/healthz")).status_code == 200
            redis.start()
            await until(lambda: answers_with(200), "/readyz to see Redis back", seconds=30)
            assert answers[-1][1] == {"status": "ready"}
    finally:
        server.stop()
        redis.stop()
    no_traceback(server)


SUBSCRIBE = {"graphql-transport-ws": "subscribe", "graphql-ws": "start"}
EVENT = {"graphql-transport-ws": "next", "graphql-ws": "data"}


async def _refuses_connections(server: ServerProcess) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    except ConnectionRefusedError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def _shutting_down(server: ServerProcess) -> bool:
    """A new connection's /readyz answers 503 "shutting down"; a refused
    connection before that fails the test (the window was missed)."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{server.url}/readyz")
    return response.status_code == 503 and response.json().get("server") == "shutting down"


async def test_sigterm_closes_sockets_with_1001_and_lets_a_request_finish(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", {"MIFAMILIAS_AUTH_SECRET": SECRET}).start()
    try:
        note = "Querida familia: ¡hola!".encode() * 1000
        created = await _upload_in_a_new_family(server, "TEXT", "text/plain", len(note))
        content_id = created["content"]["id"]
        # A subscription on each protocol, ready once it answered its first event.
        sockets = []
        for n, protocol in enumerate(SUBSCRIBE):
            connection = await _socket(server, protocol)
            query = "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }"
            await connection.send(
                json.dumps(
                    {
                        "id": str(n),
                        "type": SUBSCRIBE[protocol],
                        "payload": {"query": query, "variables": {"id": content_id}},
                    }
                )
            )
            first = {"type": "ka"}
            while first["type"] in ("ka", "ping"):  # keep-alives may come first
                first = json.loads(await asyncio.wait_for(connection.recv(), 30))
            assert first["type"] == EVENT[protocol], first
            sockets.append(connection)

        # An upload in flight: its body arrives in two halves, the second once
        # the server has stopped accepting.
        half_sent, go_on = asyncio.Event(), asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield note[: len(note) // 2]
            half_sent.set()
            await go_on.wait()
            yield note[len(note) // 2 :]

        async with httpx.AsyncClient(timeout=60) as client:
            upload = asyncio.create_task(
                client.put(
                    created["uploadUrl"],
                    content=body(),
                    headers={"Content-Type": "text/plain", "Content-Length": str(len(note))},
                )
            )
            await half_sent.wait()
            # Answered on a later connection: the upload's was accepted and read before it.
            assert (await client.get(f"{server.url}/healthz")).status_code == 200
            assert server.process is not None
            assert (await client.get(f"{server.url}/readyz")).status_code == 200  # it is probed
            server.process.send_signal(signal.SIGTERM)
            for connection in sockets:
                assert await _closed_with(connection) == (1001, "going away")
            # A new probe is answered 503 "shutting down" before the port closes.
            await until(lambda: _shutting_down(server), "/readyz to answer 503 shutting down", seconds=30)
            await until(lambda: _refuses_connections(server), "the server to stop accepting", seconds=30)
            go_on.set()
            response = await upload
            assert response.status_code == 200, response.text
        await _exited(server)
    finally:
        server.stop()
    no_traceback(server)


# Write rate limits, shared by every process ------------------------------------------------


@pytest.fixture
async def two_servers(engine: dict[str, str], tmp_path: Path) -> AsyncIterator[list[ServerProcess]]:
    env = {
        "MIFAMILIAS_AUTH_SECRET": SECRET,
        "MIFAMILIAS_RATE_LIMITS": "comment=5/3600,reaction=4/3600,join-address=4/3600",
        "MIFAMILIAS_TRUSTED_PROXIES": "127.0.0.1",
        **engine,
    }
    servers = [ServerProcess(tmp_path / "data", env, name=f"s{n}").start() for n in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


async def _as(server: ServerProcess, user: str, query: str, variables: dict[str, Any], **headers: str) -> Any:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{server.url}/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {mint_token(SECRET, user)}", **headers},
        )
    assert response.status_code == 200, response.text
    return response.json()


async def test_write_rate_limits_hold_across_two_processes(two_servers: list[ServerProcess]) -> None:
    first, second = two_servers
    made = await _as(first, "ana", 'mutation { createFamily(input: {name: "Los Ruiz"}) { id } }', {})
    family_id = made["data"]["createFamily"]["id"]
    created = await _as(
        first,
        "ana",
        "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
        {"i": {"familyId": family_id, "type": "TEXT", "mimeType": "text/plain", "sizeBytes": 4}},
    )
    content_id = created["data"]["createUpload"]["content"]["id"]
    comment = "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }"
    answers = [
        await _as(two_servers[n % 2], "ana", comment, {"c": content_id, "b": f"comentario {n}"})
        for n in range(7)
    ]
    assert all("errors" not in answer for answer in answers[:5]), answers
    for refused in answers[5:]:
        error = refused["errors"][0]
        assert error["extensions"]["code"] == "RATE_LIMITED"
        assert 0 < error["extensions"]["retryAfter"] <= 3600
        assert "5 per hour" in error["message"]
    count = await _as(second, "ana", "query($c: ID!) { content(id: $c) { commentCount } }", {"c": content_id})
    assert count["data"]["content"]["commentCount"] == 5
    # Each action has a budget of its own.
    reacted = await _as(
        second,
        "ana",
        'mutation($c: ID!) { addReaction(contentId: $c, emoji: "👍") { id } }',
        {"c": content_id},
    )
    assert "errors" not in reacted, reacted
    no_traceback(first)
    no_traceback(second)


async def test_invite_guesses_are_limited_per_client_address(two_servers: list[ServerProcess]) -> None:
    made = await _as(
        two_servers[0], "ana", 'mutation { createFamily(input: {name: "Los Ruiz"}) { inviteCode } }', {}
    )
    valid = made["data"]["createFamily"]["inviteCode"]
    join = "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }"
    codes = []
    for n in range(6):  # six accounts, one wrong guess each, alternating processes
        answer = await _as(two_servers[n % 2], f"guesser{n}", join, {"c": "AAAAA-BBBBB"})
        codes.append(answer["errors"][0]["extensions"]["code"])
    assert codes == ["BAD_USER_INPUT"] * 4 + ["RATE_LIMITED"] * 2
    # The address's window is full, yet someone behind it with no wrong code
    # of their own joins with a valid one; a guesser is refused even a valid
    # one, so that it does not tell them it is valid.
    for n in range(2):
        joined = await _as(two_servers[n], f"cousin{n}", join, {"c": valid})
        assert joined["data"]["joinFamily"]["role"] in ("MEMBER", "PENDING"), joined
    refused = await _as(two_servers[1], "guesser0", join, {"c": valid})
    assert refused["errors"][0]["extensions"]["code"] == "RATE_LIMITED"
    # Behind a trusted proxy, the forwarded address counts, not the proxy's.
    answer = await _as(
        two_servers[0], "guesser9", join, {"c": "AAAAA-BBBBB"}, **{"X-Forwarded-For": "203.0.113.7"}
    )
    assert answer["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


async def test_the_amplification_query_is_refused_over_http(live_server: ServerProcess) -> None:
    from tests.api.test_limits import amplification

    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{live_server.url}/graphql",
            json={"query": amplification(), "variables": {"id": "any"}},
            headers={"Authorization": f"Bearer {ANA}"},
        )
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["cost"]["estimated"] > error["extensions"]["cost"]["limit"] == 10_000
    no_traceback(live_server)
