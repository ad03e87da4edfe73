"""The documentation's examples, run as written.

The API guide's "Example operations" section (docs/guide.md, linked from the
README) runs in order against a real server on a
loopback port (in this process, so that the test holds its clock and can reach
the capsule's date): its GraphQL blocks over HTTP and WebSocket, its shell
blocks in bash, with values in angle brackets filled from earlier answers. The
"Running against DynamoDB and S3" block (docs/operations.md) runs literally in
bash, its endpoint pointed at the moto_server the tests start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aioboto3
import httpx
import pytest
import uvicorn
import websockets

from app import create_app
from resolvers.adapters.broker import user_channel
from resolvers.core.auth import mint_token
from resolvers.core.config import Settings
from tests.clock import FakeClock
from tests.servers import ROOT, SECRET, free_port, until

GUIDE = ROOT / "docs" / "guide.md"
OPERATIONS = ROOT / "docs" / "operations.md"
# Where each value in angle brackets comes from: the newest answer of that field.
PLACEHOLDERS = {
    "family id": ("createFamily", "id"),
    "invite code": ("createFamily", "inviteCode"),
    "content id": ("createUpload", "content", "id"),
    "upload url": ("createUpload", "uploadUrl"),
    "capsule id": ("createCapsule", "id"),
}
NAMES = {"ana": "Ana", "ben": "Ben", "cy": "Cy"}


@dataclass(frozen=True)
class Block:
    language: str
    text: str


def section(document: Path, title: str) -> str:
    text = document.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def fenced_blocks(section: str) -> list[Block]:
    return [Block(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", section, re.S)]


def fill(text: str, answers: dict[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in PLACEHOLDERS, f"the guide uses <{name}>, which no earlier answer gives"
        found: Any = answers
        for step in PLACEHOLDERS[name]:
            assert isinstance(found, dict) and step in found, f"<{name}> is used before it is answered"
            found = found[step]
        return str(found)

    return re.sub(r"<([a-z ]+)>", value, text)


@contextlib.asynccontextmanager
async def served(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[str, Any]]:
    """The app on a loopback port, in this event loop: its URL and its services."""
    port = free_port()
    settings = Settings(
        data_dir=tmp_path / "data",
        auth_secret=SECRET,
        port=port,
        unlock_poll_seconds=3600,  # the test runs the scheduler's pass itself
    )
    app = create_app(settings, clock=clock)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: server.started or task.done(), "the server to start", 30, interval=0.01)
        assert not task.done(), "the server stopped before it started"
        yield f"http://127.0.0.1:{port}", app.state.services
    finally:
        server.should_exit = True
        await task


async def subscription_events(url: str, token: str, query: str) -> AsyncGenerator[dict[str, Any]]:
    ws_url = url.replace("http://", "ws://") + "/graphql"
    async with websockets.connect(
        ws_url, subprotocols=[websockets.Subprotocol("graphql-transport-ws")]
    ) as ws:
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}})
        )
        assert json.loads(await ws.recv())["type"] == "connection_ack"
        await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": query}}))
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "ping":  # the server's keep-alive
                await ws.send(json.dumps({"type": "pong"}))
                continue
            assert message["type"] == "next", message
            yield message["payload"]


async def until_listening(services: Any, channel: str) -> None:
    await until(
        lambda: services.broker.subscriber_count(channel), f"a subscriber on {channel}", interval=0.01
    )


async def run_subscription(
    url: str, services: Any, clock: FakeClock, token: str, query: str
) -> dict[str, Any]:
    events = subscription_events(url, token, query)
    try:
        if "contentStatusChanged" in query:
            async with asyncio.timeout(60):
                async for payload in events:
                    assert "errors" not in payload, payload
                    if payload["data"]["contentStatusChanged"]["status"] in ("READY", "FAILED"):
                        return dict(payload["data"])
        assert "capsuleUnlocked" in query, "a subscription this test does not know how to drive"
        first = asyncio.ensure_future(anext(events))
        await until_listening(services, user_channel("ben", "capsules"))
        await services.pipeline.queue.join()  # the capsule's content is READY
        due = re.search(r'unlockDate: "([^"]+)"', GUIDE.read_text())
        assert due is not None
        clock.moment = datetime.fromisoformat(due.group(1)).astimezone(UTC)
        clock.advance(seconds=1)
        await services.scheduler.run_once()
        payload = await asyncio.wait_for(first, 30)
        assert "errors" not in payload, payload
        return dict(payload["data"])
    finally:
        await events.aclose()


async def test_the_readme_examples_run_in_order(tmp_path: Path) -> None:
    blocks = fenced_blocks(section(GUIDE, "Example operations"))
    assert [b.language for b in blocks].count("graphql") >= 10
    clock = FakeClock()
    tokens = {user: mint_token(SECRET, user, given_name=name) for user, name in NAMES.items()}
    answers: dict[str, Any] = {}
    ran: list[dict[str, Any]] = []
    workdir = tmp_path / "work"
    workdir.mkdir()
    async with served(tmp_path, clock) as (url, services), httpx.AsyncClient() as client:
        for block in blocks:
            text = fill(block.text, answers)
            if block.language == "sh":
                shell = await asyncio.create_subprocess_exec(
                    "bash", "-euo", "pipefail", "-c", text, cwd=workdir, stdout=subprocess.PIPE
                )
                out, _ = await shell.communicate()
                assert shell.returncode == 0, f"{text} exited {shell.returncode}: {out!r}"
                continue
            assert block.language == "graphql", block
            who = re.match(r"# as (\w+)\n", text)
            assert who is not None, f"a block that does not say whose token it uses:\n{text}"
            token = tokens[who.group(1)]
            if text[who.end() :].lstrip().startswith("subscription"):
                data = await run_subscription(url, services, clock, token, text)
            else:
                response = await client.post(
                    f"{url}/graphql", json={"query": text}, headers={"Authorization": f"Bearer {token}"}
                )
                body = response.json()
                assert response.status_code == 200 and "errors" not in body, (text, body)
                data = body["data"]
            answers.update(data)
            ran.append(data)

    outcome = {name: value for data in ran for name, value in data.items()}
    roles = [d[k]["role"] for d in ran for k in d if k in ("joinFamily", "vouch", "approveMember")]
    assert roles == ["PENDING", "MEMBER", "PENDING", "MEMBER"]
    assert outcome["contentStatusChanged"]["status"] == "READY"
    feed = outcome["family"]["feed"]["edges"]
    assert len(feed) == 1  # the capsule's content stays out of the feed
    note = feed[0]["node"]
    assert note["title"] == "Primeras palabras"
    assert note["reactions"] == [{"emoji": "❤️", "count": 1}]
    assert [c["node"]["body"] for c in note["comments"]["edges"]] == ["¡Qué bonito!"]
    assert sorted(t["value"] for t in note["tags"]) == ["abuela", "verano"]
    opened = outcome["capsuleUnlocked"]["capsule"]
    assert opened["title"] == "Para tus 18" and opened["status"] == "AVAILABLE"
    assert opened["content"]["mediaUrl"]


async def _stop_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 15)
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


async def test_the_readme_dynamodb_recipe_runs_as_written(moto_server: str, tmp_path: Path) -> None:
    (recipe,) = [
        b
        for b in fenced_blocks(section(OPERATIONS, "Running against DynamoDB and S3"))
        if "moto_server" in b.text
    ]
    lines = recipe.text.strip().splitlines()
    # The first line starts a moto_server; the test's own stands in for it.
    assert lines[0].startswith(".venv/bin/moto_server -p 5000")
    script = "\n".join(lines[1:]).replace("http://127.0.0.1:5000", moto_server)
    assert lines[-1] == "./dev serve"
    port = free_port()
    table = f"readme-{uuid.uuid4().hex[:8]}"
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MIFAMILIAS_", "AWS_"))}
    env.update(
        MIFAMILIAS_PORT=str(port),
        MIFAMILIAS_DATA_DIR=str(tmp_path / "data"),
        MIFAMILIAS_TABLE_NAME=table,
        MIFAMILIAS_AUTH_SECRET=SECRET,
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )
    log = (tmp_path / "recipe.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as probe:

            async def healthy() -> bool:
                assert process.returncode is None, (tmp_path / "recipe.log").read_text()
                with contextlib.suppress(httpx.TransportError):
                    return (await probe.get(f"{url}/healthz")).status_code == 200
                return False

            await until(healthy, "the recipe's server to answer /healthz", 120)
        token = mint_token(SECRET, "ana", given_name="Ana")
        headers = {"Authorization": f"Bearer {token}"}
        body = b"una nota"
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:

            async def gql(query: str, variables: dict[str, Any]) -> dict[str, Any]:
                answer = (await client.post("/graphql", json={"query": query, "variables": variables})).json()
                assert "errors" not in answer, answer
                return dict(answer["data"])

            family = await gql('mutation { createFamily(input: {name: "Nube"}) { id } }', {})
            started = await gql(
                "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
                {
                    "i": {
                        "familyId": family["createFamily"]["id"],
                        "type": "TEXT",
                        "mimeType": "text/plain",
                        "sizeBytes": len(body),
                    }
                },
            )
            upload_url = started["createUpload"]["uploadUrl"]
            assert upload_url.startswith(moto_server)  # the bytes go to the S3 endpoint
            put = await client.put(upload_url, content=body, headers={"Content-Type": "text/plain"})
            assert put.status_code == 200
            content_id = started["createUpload"]["content"]["id"]
            await gql("mutation($id: ID!) { completeUpload(contentId: $id) { status } }", {"id": content_id})

            async def ready() -> dict[str, Any] | None:
                read = await gql(
                    "query($id: ID!) { content(id: $id) { status mediaUrl } }", {"id": content_id}
                )
                return read if read["content"]["status"] == "READY" else None

            read = await until(ready, "the note to be READY", 60)
            media = await client.get(read["content"]["mediaUrl"])
            assert media.content == body
        # And the records are in the DynamoDB table the recipe created.
        session = aioboto3.Session(
            aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
        )
        async with session.client("dynamodb", endpoint_url=moto_server) as dynamo:
            described = await dynamo.describe_table(TableName=table)
            assert {i["IndexName"] for i in described["Table"]["GlobalSecondaryIndexes"]} == {"GSI1", "GSI2"}
            found = await dynamo.get_item(
                TableName=table, Key={"PK": {"S": f"CONTENT#{content_id}"}, "SK": {"S": "META"}}
            )
            assert "Item" in found
    finally:
        await _stop_group(process)
        log.close()


@pytest.mark.parametrize("name", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_a_region_comes_from_aws_when_ours_is_unset(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    for other in ("AWS_REGION", "AWS_DEFAULT_REGION", "MIFAMILIAS_AWS_REGION"):
        monkeypatch.delenv(other, raising=False)
    settings = Settings(dynamodb_endpoint="http://127.0.0.1:1")
    assert settings.uses_dynamodb and settings.region == "us-east-1"
    monkeypatch.setenv(name, "eu-south-2")
    assert settings.region == "eu-south-2"
    assert Settings(dynamodb_endpoint="http://127.0.0.1:1", aws_region="ap-east-1").region == "ap-east-1"
