"""Persisted operations across real server processes sharing one table, on
each engine: a document registered on one process runs from its hash alone on
the other, over POST, GET and both WebSocket protocols; and the command that
checks a trusted-documents manifest."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.typing import Subprotocol

from resolvers.core.auth import mint_token
from resolvers.core.persisted import TTL
from store import keys
from store.port import Table
from tests.servers import ROOT, SECRET, ServerProcess, engine_env, server_table, without_cost

ME = "query Me { me { id givenName } }"
ANA = {"data": {"me": {"id": "ana", "givenName": "Ana"}}}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def persisted(text: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": sha(text)}}


def bearer() -> str:
    return f"Bearer {mint_token(SECRET, 'ana', given_name='Ana')}"


class Pair:
    def __init__(self, a: ServerProcess, b: ServerProcess, env: dict[str, str]) -> None:
        self.a, self.b, self.env = a, b, env

    def table(self) -> contextlib.AbstractAsyncContextManager[Table]:
        """The table both processes use, opened by the test."""
        return server_table(self.a)


@pytest.fixture(params=["sqlite", "dynamodb"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    """Two server processes on one store (SQLite: one data directory and file)."""
    async with engine_env(request.param, request) as env:
        settings = {"MIFAMILIAS_AUTH_SECRET": SECRET, **env}
        a = ServerProcess(tmp_path / "data", settings, name="a").start()
        try:
            b = ServerProcess(tmp_path / "data", settings, name="b").start()
            try:
                yield Pair(a, b, env)
            finally:
                b.stop()
        finally:
            a.stop()


async def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{server.url}/graphql", json=body, headers={"Authorization": bearer()})


def code_of(response: httpx.Response) -> str:
    return str(response.json()["errors"][0]["extensions"]["code"])


async def test_a_document_registered_on_one_process_runs_by_hash_on_the_other(pair: Pair) -> None:
    unknown = await post(pair.b, {"extensions": persisted(ME)})
    assert unknown.status_code == 200 and code_of(unknown) == "PERSISTED_QUERY_NOT_FOUND"

    mismatch = await post(pair.a, {"query": ME, "extensions": persisted("{ __typename }")})
    assert mismatch.status_code == 400 and code_of(mismatch) == "BAD_USER_INPUT"
    assert mismatch.json()["errors"][0]["message"] == "provided sha does not match query"

    registered = await post(pair.a, {"query": ME, "extensions": persisted(ME)})
    assert without_cost(registered.json()) == ANA

    assert without_cost((await post(pair.b, {"extensions": persisted(ME)})).json()) == ANA
    # GET, as a CDN would forward it: everything in the URL.
    async with httpx.AsyncClient(timeout=30) as client:
        got = await client.get(
            f"{pair.b.url}/graphql",
            params={"extensions": json.dumps(persisted(ME)), "operationName": "Me", "variables": "{}"},
            headers={"Authorization": bearer(), "Accept": "*/*"},
        )
    assert got.status_code == 200 and without_cost(got.json()) == ANA

    async with pair.table() as table:
        item = await table.get(keys.persisted_document(sha(ME)))
        assert item is not None and item["body"] == ME
        # About 30 days from now (the processes' clock, not ours: a day of slack either way).
        assert abs(item["expiresAt"] - (time.time() + TTL.total_seconds())) < 86_400
        if "MIFAMILIAS_DYNAMODB_ENDPOINT" in pair.env:
            from store.dynamodb import DynamoTable

            assert isinstance(table, DynamoTable)
            ttl = await table.client.describe_time_to_live(TableName=table.table_name)
            assert ttl["TimeToLiveDescription"]["AttributeName"] == "expiresAt"
            assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] in ("ENABLED", "ENABLING")


# WebSockets -------------------------------------------------------------------------------


async def _frame(socket: Any) -> dict[str, Any]:
    while True:
        message: dict[str, Any] = json.loads(await asyncio.wait_for(socket.recv(), 20))
        if message["type"] not in ("ka", "ping", "pong"):
            return message


async def ws_first(server: ServerProcess, legacy: bool, payload: dict[str, Any]) -> dict[str, Any]:
    """The first frame an operation answers (its first event, or its error)."""
    protocol = "graphql-ws" if legacy else "graphql-transport-ws"
    async with websockets.connect(server.ws_url, subprotocols=[Subprotocol(protocol)]) as socket:
        await socket.send(json.dumps({"type": "connection_init", "payload": {"Authorization": bearer()}}))
        assert (await _frame(socket))["type"] == "connection_ack"
        await socket.send(
            json.dumps({"type": "start" if legacy else "subscribe", "id": "1", "payload": payload})
        )
        return await _frame(socket)


def error_of(frame: dict[str, Any], legacy: bool) -> dict[str, Any]:
    assert frame["type"] == "error", frame
    found: dict[str, Any] = frame["payload"] if legacy else frame["payload"][0]
    return found


async def some_content(server: ServerProcess) -> str:
    family = await post(server, {"query": 'mutation { createFamily(input: {name: "P"}) { id } }'})
    created = await post(
        server,
        {
            "query": "mutation($i: CreateUploadInput!) { createUpload(input: $i) { content { id } } }",
            "variables": {
                "i": {
                    "familyId": family.json()["data"]["createFamily"]["id"],
                    "type": "TEXT",
                    "mimeType": "text/plain",
                    "sizeBytes": 4,
                }
            },
        },
    )
    return str(created.json()["data"]["createUpload"]["content"]["id"])


@pytest.mark.parametrize("legacy", [False, True], ids=["graphql-transport-ws", "graphql-ws"])
async def test_persisted_subscriptions_over_both_websocket_protocols(pair: Pair, legacy: bool) -> None:
    # Its first event is the content's status now: one frame answers whether it ran.
    text = (
        f"subscription Status{int(legacy)}($id: ID!) {{ contentStatusChanged(contentId: $id) {{ status }} }}"
    )
    variables = {"id": await some_content(pair.a)}
    event = "data" if legacy else "next"
    expected = {"data": {"contentStatusChanged": {"status": "UPLOADING"}}}

    unknown = await ws_first(pair.b, legacy, {"extensions": persisted(text), "variables": variables})
    assert error_of(unknown, legacy)["extensions"]["code"] == "PERSISTED_QUERY_NOT_FOUND"

    mismatch = await ws_first(
        pair.a, legacy, {"query": text, "extensions": persisted("{ __typename }"), "variables": variables}
    )
    assert error_of(mismatch, legacy)["message"] == "provided sha does not match query"

    registered = await ws_first(
        pair.a, legacy, {"query": text, "extensions": persisted(text), "variables": variables}
    )
    assert registered["type"] == event and registered["payload"] == expected

    by_hash = await ws_first(pair.b, legacy, {"extensions": persisted(text), "variables": variables})
    assert by_hash["type"] == event and by_hash["payload"] == expected


# The manifest check ------------------------------------------------------------------------


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "trusted-documents", "check", str(path)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MIFAMILIAS_DATA_DIR": str(path.parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_manifest_check_passes_a_good_manifest_and_names_the_bad_documents(tmp_path: Path) -> None:
    good = {"a1": "query Me { me { id } }", "b2": "subscription { notificationAdded { id } }"}
    (tmp_path / "relay.json").write_text(json.dumps(good))
    passed = check(tmp_path / "relay.json")
    assert passed.returncode == 0, passed.stderr
    assert "all 2 documents" in passed.stdout

    apollo = {
        "format": "apollo-persisted-query-manifest",
        "version": 1,
        "operations": [
            {"id": sha(good["a1"]), "body": good["a1"], "name": "Me", "type": "query"},
            {"id": "x", "body": "query Broken { me { nope } }", "name": "Broken", "type": "query"},
            {"id": "y", "body": "query { me { id ", "name": "Cut", "type": "query"},
            {"id": sha("other"), "body": "{ __typename }", "name": "Wrong", "type": "query"},
        ],
    }
    (tmp_path / "apollo.json").write_text(json.dumps(apollo))
    failed = check(tmp_path / "apollo.json")
    assert failed.returncode == 1
    lines = failed.stderr.splitlines()
    assert any(line.startswith("x (Broken): ") and "nope" in line for line in lines), failed.stderr
    assert any(line.startswith("y (Cut): ") for line in lines), failed.stderr
    assert any(line.startswith(f"{sha('other')} (Wrong): ") for line in lines), failed.stderr
    assert not any(line.startswith(f"{sha(good['a1'])} ") for line in lines)
    assert "3 of 4 documents cannot run here" in failed.stderr
    assert "Traceback" not in failed.stderr

    (tmp_path / "broken.json").write_text("[1, 2]")
    unreadable = check(tmp_path / "broken.json")
    assert unreadable.returncode == 2 and "Traceback" not in unreadable.stderr
