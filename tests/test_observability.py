"""Observability: metrics at /metrics, traces, structured logs.

- A scripted session against a real server process, then its /metrics parsed:
  the counts match what the session did.
- One request's span tree, and a pipeline job's, from an in-memory exporter.
- JSON log lines from a real server at DEBUG: one request's lines share its
  id, and no token or invite code reaches the log.
- DynamoDB throttles and retries, from a stand-in endpoint that throttles.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import threading
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from resolvers.core import logs
from resolvers.core.config import Settings
from resolvers.core.metrics import OPERATION_CAP, Metrics, channel_kind
from resolvers.domain.families import INVITE_ALPHABET, new_invite_code
from resolvers.runtime import observe_table
from store.sqlite import SqliteTable
from tests.api.conftest import Api, running_api
from tests.factories import family_with_members, settle, upload
from tests.servers import SECRET, ServerProcess, free_port, until, without_cost
from tests.servers import token as person_token

# Helpers ---------------------------------------------------------------------------------


# Every person here has an address: mail is part of what these tests follow.
token = functools.partial(person_token, email=True)


class Samples:
    """A /metrics page, parsed as Prometheus parses it."""

    def __init__(self, text: str) -> None:
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum over the samples called `name` whose labels include `labels`."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def labels(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


class Script:
    """Named operations against a server process, counted as they are sent."""

    def __init__(self, server: ServerProcess, client: httpx.AsyncClient) -> None:
        self.server = server
        self.client = client
        self.sent: Counter[tuple[str, str]] = Counter()

    async def run(
        self, user: str, label: str, kind: str, document: str, variables: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self.sent[label, kind] += 1
        response = await self.client.post(
            f"{self.server.url}/graphql",
            json={"query": document, "variables": variables or {}},
            headers={"Authorization": f"Bearer {token(user)}"},
        )
        body: dict[str, Any] = response.json()
        return body

    async def ok(self, user: str, label: str, kind: str, document: str, variables: Any = None) -> Any:
        body = await self.run(user, label, kind, document, variables)
        assert "errors" not in body, body
        return body["data"]

    async def metrics(self) -> Samples:
        response = await self.client.get(f"{self.server.url}/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        return Samples(response.text)


def ws_client(server: ServerProcess, user: str) -> Client:
    return Client(
        transport=WebsocketsTransport(
            url=server.ws_url,
            init_payload={"Authorization": f"Bearer {token(user)}"},
            subprotocols=[WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL],
        )
    )


NEW_FAMILY = "mutation NewFamily($i: CreateFamilyInput!) { createFamily(input: $i) { id inviteCode } }"
JOIN = "mutation Join($c: String!) { joinFamily(inviteCode: $c) { role } }"
NEW_UPLOAD = """mutation NewUpload($i: CreateUploadInput!) {
  createUpload(input: $i) { uploadUrl content { id } } }"""
COMPLETE = "mutation Complete($id: ID!) { completeUpload(contentId: $id) { status } }"
STATUS = "query Status($id: ID!) { content(id: $id) { status } }"
NEW_CAPSULE = "mutation NewCapsule($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"
SCHEDULE = "mutation Schedule($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }"
UNLOCKED = "subscription Unlocked { capsuleUnlocked { capsule { id status } } }"


async def upload_note(script: Script, user: str, family_id: str, body: bytes, capsule_id: str | None) -> str:
    started = await script.ok(
        user,
        "NewUpload",
        "mutation",
        NEW_UPLOAD,
        {
            "i": {
                "familyId": family_id,
                "type": "TEXT",
                "mimeType": "text/plain",
                "sizeBytes": len(body),
                "capsuleId": capsule_id,
            }
        },
    )
    put = await script.client.put(
        started["createUpload"]["uploadUrl"], content=body, headers={"Content-Type": "text/plain"}
    )
    assert put.status_code == 200
    content_id = str(started["createUpload"]["content"]["id"])
    await script.ok(user, "Complete", "mutation", COMPLETE, {"id": content_id})
    return content_id


# /metrics after a scripted session ------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path / "server", {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5"}
    ).start()
    try:
        yield process
    finally:
        process.stop()


async def test_metrics_count_what_a_session_did(server: ServerProcess) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        script = Script(server, client)
        for user in ("ana", "ana", "ben"):
            await script.ok(user, "Me", "query", "query Me { me { id } }")
        await script.ok("ben", "anonymous", "query", "{ me { id } }")
        family = (await script.ok("ana", "NewFamily", "mutation", NEW_FAMILY, {"i": {"name": "Los Obs"}}))[
            "createFamily"
        ]
        await script.ok("ben", "Join", "mutation", JOIN, {"c": family["inviteCode"]})
        missing = await script.run("ana", "Missing", "query", 'query Missing { content(id: "nope") { id } }')
        missing_code = missing["errors"][0]["extensions"]["code"]

        # A note to READY.
        note = await upload_note(script, "ana", family["id"], b"hola", None)

        async def ready() -> bool:
            found = await script.ok("ana", "Status", "query", STATUS, {"id": note})
            return bool(found["content"]["status"] == "READY")

        await until(ready, "the note to be READY")

        # ben listens for capsules; the capsule for him is made once he does.
        events: list[dict[str, Any]] = []
        async with ws_client(server, "ben") as session:

            async def listen() -> None:
                async for event in session.subscribe(GraphQLRequest(UNLOCKED)):
                    events.append(event)

            listener = asyncio.create_task(listen())

            async def listening() -> bool:
                samples = await script.metrics()
                # The gauge goes up in the same turn of the server's loop as the
                # subscription registers with the broker.
                return samples.value("mifamilias_subscriptions_active", subscription="capsuleUnlocked") == 1

            await until(listening, "ben's subscription")
            script.sent["Unlocked", "subscription"] += 1
            # Time for a loaded machine's five requests below: a date that passes
            # first refuses the note, and the capsule stays closed for good.
            unlock = datetime.now(UTC) + timedelta(seconds=10)
            capsule = await script.ok(
                "ana",
                "NewCapsule",
                "mutation",
                NEW_CAPSULE,
                {
                    "i": {
                        "familyId": family["id"],
                        "title": "Para Ben",
                        "unlockDate": unlock.isoformat(),
                        "recipientIds": ["ben"],
                    }
                },
            )
            capsule_id = capsule["createCapsule"]["id"]
            await script.ok("ana", "Schedule", "mutation", SCHEDULE, {"id": capsule_id})
            await upload_note(script, "ana", family["id"], b"para ti", capsule_id)

            async def unlocked() -> bool:
                return bool(events)

            await until(unlocked, "the capsule's event")
            listener.cancel()
        assert events[0]["capsuleUnlocked"]["capsule"] == {"id": capsule_id, "status": "AVAILABLE"}

        async def closed() -> Samples | None:
            samples = await script.metrics()
            open_now = samples.value("mifamilias_websocket_connections") + samples.value(
                "mifamilias_subscriptions_active"
            )
            return samples if open_now == 0 else None

        samples = await until(closed, "the socket to be counted closed")

    # Requests, exactly as sent, by operation name and type.
    counted = {
        (s.labels["operation"], s.labels["type"]): s.value
        for s in samples.samples
        if s.name == "mifamilias_graphql_requests_total"
    }
    assert counted == {key: float(n) for key, n in script.sent.items()}
    for phase in ("parse", "validate", "execute"):
        assert samples.value("mifamilias_graphql_phase_seconds_count", operation="Me", phase=phase) == 3
    assert samples.value("mifamilias_graphql_errors_total", operation="Missing", code=missing_code) == 1
    assert samples.value("mifamilias_graphql_errors_total") == 1
    # Live: one subscription, the unlock event published and delivered to it.
    assert samples.value("mifamilias_subscriptions_started_total", subscription="capsuleUnlocked") == 1
    assert samples.value("mifamilias_events_published_total", channel="capsules") >= 1
    assert samples.value("mifamilias_events_delivered_total", channel="capsules") >= 1
    assert samples.value("mifamilias_websocket_connections", protocol="graphql-transport-ws") == 0
    # The unlock, and no capsule left behind at the last pass.
    assert samples.value("mifamilias_capsules_unlocked_total") == 1
    assert samples.value("mifamilias_scheduler_lag_seconds") == 0
    # The store, by kind.
    for kind in ("get", "batch_get", "query", "put", "update", "transact"):
        assert samples.value("mifamilias_store_call_seconds_count", kind=kind) > 0, kind
    assert samples.value("mifamilias_store_errors_total", error="error") == 0
    # The pipeline: two notes, each checked and finished.
    assert samples.value("mifamilias_pipeline_jobs_total", outcome="ready") == 2
    for step in ("check", "finish"):
        assert samples.value("mifamilias_pipeline_step_seconds_count", step=step) == 2
    assert samples.value("mifamilias_pipeline_queue_depth") == 0
    assert samples.value("mifamilias_pipeline_failures_total") == 0
    # The upload URLs' signatures did not reach the log (uvicorn's access lines).
    log = server.log()
    assert "PUT /media/" in log and "sig=" + logs.REDACTED in log
    assert not re.search(r"sig=(?!\[redacted\])", log)
    # Nothing labelled with an id.
    for label in ("operation", "channel", "kind", "subscription"):
        for name in {s.name for s in samples.samples}:
            for value in samples.labels(name, label):
                assert not re.fullmatch(r"[0-9a-f]{32}", value), (name, value)


# In process -----------------------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_request_is_one_span_tree_down_to_the_store(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    provider, exporter = spans
    async with running_api("sqlite", "local", tmp_path, request, tracer_provider=provider) as api:
        family_id = await family_with_members(api, "ana", ["ben"])
        exporter.clear()
        response = await api.client.post(
            "/graphql",
            json={
                "query": "query Family($id: ID!) { family(id: $id) { name } }",
                "variables": {"id": family_id},
            },
            headers={"Authorization": f"Bearer {api.token('ben')}", "traceparent": TRACEPARENT},
        )
        assert "errors" not in response.json()
        finished = exporter.get_finished_spans()

    by_id = {span.context.span_id: span for span in finished}
    [root] = [s for s in finished if s.name == "POST /graphql"]
    # An incoming traceparent makes the request part of the caller's trace.
    assert root.context.trace_id == int(TRACEPARENT.split("-")[1], 16)
    assert root.attributes is not None and root.attributes["http.response.status_code"] == 200
    [operation] = [s for s in finished if s.name == "GraphQL query Family"]
    assert _parent(operation) == root.context.span_id
    [resolver] = [s for s in finished if s.name == "GraphQL Resolving: family"]
    assert _parent(resolver) == operation.context.span_id
    assert resolver.attributes is not None and resolver.attributes["graphql.param.id"] == family_id
    store = [s for s in finished if s.name.startswith("store ") and _parent(s) == resolver.context.span_id]
    assert store, [(s.name, by_id[p].name if (p := _parent(s)) in by_id else None) for s in finished]
    assert store[0].attributes is not None and store[0].attributes["db.system"] == "sqlite"
    assert {s.context.trace_id for s in (root, operation, resolver, *store)} == {root.context.trace_id}
    # The operation span names the request the logs name.
    assert operation.attributes is not None and operation.attributes["mifamilias.request_id"]


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_pipeline_job_is_a_trace_of_its_steps_and_no_span_holds_a_secret(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    provider, exporter = spans
    async with running_api("sqlite", "local", tmp_path, request, tracer_provider=provider) as api:
        family = await api.ok('mutation { createFamily(input: {name: "T"}) { id inviteCode } }', as_="ana")
        code = family["createFamily"]["inviteCode"]
        await api.ok("mutation($c: String!) { joinFamily(inviteCode: $c) { role } }", {"c": code}, as_="ben")
        content_id = await upload(api, "ana", family["createFamily"]["id"], "TEXT", b"hola", "text/plain")
        await settle(api)
        finished = exporter.get_finished_spans()

    [job] = [s for s in finished if s.name == "pipeline job"]
    assert job.attributes is not None and job.attributes["mifamilias.content.id"] == content_id
    steps = [s.name for s in finished if _parent(s) == job.context.span_id]
    assert "pipeline check" in steps and "pipeline finish" in steps
    assert any(s.name.startswith("store ") and s.context.trace_id == job.context.trace_id for s in finished)
    # Neither the invite code nor any token, in any span's name or attributes.
    for span in finished:
        text = json.dumps([span.name, dict(span.attributes or {})], default=str)
        assert code not in text and code.replace("-", "") not in text and "eyJ" not in text, text


async def test_the_scheduler_reports_its_lag_and_its_unlocks(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    create = """mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"""
    async with running_api("sqlite", "local", tmp_path, request) as api:
        registry = api.services.metrics.registry
        family_id = await family_with_members(api, "ana", ["ben"])

        async def sealed(body: bytes) -> str:
            unlock = (api.clock.moment + timedelta(days=1)).isoformat()
            variables = {
                "i": {"familyId": family_id, "title": "t", "unlockDate": unlock, "recipientIds": ["ben"]}
            }
            capsule_id = str((await api.ok(create, variables, as_="ana"))["createCapsule"]["id"])
            await api.ok(
                "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }",
                {"id": capsule_id},
                as_="ana",
            )
            await upload(api, "ana", family_id, "TEXT", body, "text/plain", capsule_id=capsule_id)
            return capsule_id

        await sealed(b"te quiero")
        await sealed(b"\xff\xfe not text")  # FAILED in the pipeline: its capsule can never open
        await settle(api)
        api.clock.advance(days=1, seconds=90)
        result = await api.services.scheduler.run_once()
        assert result.unlocked == 1
        assert registry.get_sample_value("mifamilias_capsules_unlocked_total") == 1
        # The stuck capsule was due 90 s ago (and a little more: each clock reading moves it on).
        lag = registry.get_sample_value("mifamilias_scheduler_lag_seconds")
        assert lag is not None and 90 <= lag < 95
        failures = registry.get_sample_value(
            "mifamilias_pipeline_failures_total", {"step": "check", "reason": "media"}
        )
        assert failures == 1


async def test_metrics_on_a_port_of_their_own(tmp_path: Path) -> None:
    port = free_port()
    settings = Settings(data_dir=tmp_path, auth_secret=SECRET, metrics_port=port)
    app = create_app(settings, table=SqliteTable(tmp_path / "t.sqlite3"))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            response = await http.post(
                "/graphql",
                json={"query": "query Me { me { id } }"},
                headers={"Authorization": f"Bearer {token('ana')}"},
            )
            assert without_cost(response.json()) == {"data": {"me": {"id": "ana"}}}
            assert (await http.get("/metrics")).status_code == 404  # not on the API's port
        async with httpx.AsyncClient() as client:
            page = await client.get(f"http://127.0.0.1:{port}/metrics")
        assert page.status_code == 200
        assert Samples(page.text).value("mifamilias_graphql_requests_total", operation="Me") == 1


async def test_metrics_off_leave_no_page_and_no_wrapper(tmp_path: Path) -> None:
    table = SqliteTable(tmp_path / "t.sqlite3")
    app = create_app(Settings(data_dir=tmp_path, auth_secret=SECRET, metrics=False), table=table)
    async with app.router.lifespan_context(app):
        assert app.state.services.table is table
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            assert (await http.get("/metrics")).status_code == 404
            response = await http.post(
                "/graphql",
                json={"query": "query Me { me { id } }"},
                headers={"Authorization": f"Bearer {token('ana')}"},
            )
            assert without_cost(response.json()) == {"data": {"me": {"id": "ana"}}}


async def test_operation_labels_are_bounded(api_sqlite: Api) -> None:
    api = api_sqlite
    registry = api.services.metrics.registry
    ben = {"Authorization": f"Bearer {api.token('ben')}"}
    # A name the document does not hold is not trusted as a label.
    await api.client.post(
        "/graphql", json={"query": "query Me { me { id } }", "operationName": "Nope"}, headers=ben
    )
    await api.client.post("/graphql", json={"query": "{ me { id } }"}, headers=ben)
    await api.client.post("/graphql", json={"query": "query Me { me { id } }"}, headers=ben)
    await api.client.post("/graphql", json={"query": "query Me { me { id "}, headers=ben)  # a syntax error
    sample = registry.get_sample_value
    assert sample("mifamilias_graphql_requests_total", {"operation": "other", "type": "unknown"}) == 1
    assert sample("mifamilias_graphql_requests_total", {"operation": "anonymous", "type": "query"}) == 1
    assert sample("mifamilias_graphql_requests_total", {"operation": "Me", "type": "query"}) == 1
    assert sample("mifamilias_graphql_requests_total", {"operation": "anonymous", "type": "unknown"}) == 1
    for operation in ("anonymous", "other"):  # the syntax error, and the unknown operation name
        labels = {"operation": operation, "code": "BAD_USER_INPUT"}
        assert sample("mifamilias_graphql_errors_total", labels) == 1

    metrics = Metrics()
    names = [metrics.operation_label(f"Op{n}") for n in range(OPERATION_CAP + 50)]
    assert names[:OPERATION_CAP] == [f"Op{n}" for n in range(OPERATION_CAP)]
    assert set(names[OPERATION_CAP:]) == {"other"}
    assert metrics.operation_label("Op3") == "Op3"
    assert metrics.operation_label(None) == "anonymous"
    assert Metrics().operation_label("New", may_add=False) == "other"


async def test_anonymous_requests_cannot_fill_the_operation_labels(api_sqlite: Api) -> None:
    """Names sent without a token take no place among the labels: a real name
    later, signed in, is counted under its own."""
    api = api_sqlite
    sample = api.services.metrics.registry.get_sample_value
    for n in range(OPERATION_CAP + 5):
        await api.client.post("/graphql", json={"query": f"query Junk{n} {{ __typename }}"})
    ben = {"Authorization": f"Bearer {api.token('ben')}"}
    await api.client.post("/graphql", json={"query": "query RealName { me { id } }"}, headers=ben)
    assert sample("mifamilias_graphql_requests_total", {"operation": "RealName", "type": "query"}) == 1
    assert sample("mifamilias_graphql_requests_total", {"operation": "Junk0", "type": "query"}) is None
    # An anonymous request of a name already known is counted under it.
    await api.client.post("/graphql", json={"query": "query RealName { __typename }"})
    assert sample("mifamilias_graphql_requests_total", {"operation": "RealName", "type": "query"}) == 2
    assert channel_kind("user:ana:capsules") == "capsules" and channel_kind("content:1") == "content"
    assert channel_kind("user:ana:secret-thing") == "other"


@pytest.fixture
async def api_sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api("sqlite", "local", tmp_path, request) as app:
        yield app


# Logs -----------------------------------------------------------------------------------------------


def test_the_redaction_knows_tokens_and_invite_codes() -> None:
    # The same symbols as the invite codes (no 0, 1, I, L or O).
    pattern = re.compile(f"[{logs.INVITE_SYMBOLS}]")
    assert all(pattern.fullmatch(c) for c in INVITE_ALPHABET)
    assert not [
        c for c in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in INVITE_ALPHABET and pattern.fullmatch(c)
    ]
    jwt = token("ana")
    for _ in range(50):
        code = new_invite_code()
        for text in (
            f"joined with {code}",
            f"code={code.lower()}",
            f"?variables=%7B%22c%22%3A%22{code}%22%7D",
            f'{{"c": "{code.replace("-", "")}"}}',
        ):
            assert code.replace("-", "") not in logs.redact(text).upper().replace("-", ""), text
    for text in (f"Authorization: Bearer {jwt}", f"token={jwt}", f"'authorization': 'bearer {jwt[:20]}'"):
        redacted = logs.redact(text)
        assert jwt[:12] not in redacted and logs.REDACTED in redacted, redacted
    signed = "PUT /media/content/7/original?method=PUT&expires=1&nonce=a7&sig=-uu_TMDyrjp HTTP/1.1"
    assert logs.redact(signed) == signed.replace("-uu_TMDyrjp", logs.REDACTED)
    presigned = "https://b.s3.amazonaws.com/k?X-Amz-Signature=abc123&X-Amz-Security-Token=FQo&x=1"
    assert "abc123" not in logs.redact(presigned) and "FQo" not in logs.redact(presigned)
    for kept in (
        "content 0af7651916cd43dd8448eb211c80319c is READY",
        "PROCESSING -> TRANSCODING",
        "request 3b8db3a05724",
    ):
        assert logs.redact(kept) == kept

    # As a filter: message, arguments and traceback.
    logger = logging.getLogger("tests.redaction")
    logger.propagate = False  # the session's check for tokens in logs must not see this one
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RequestFields())
    handler.addFilter(logs.Redact())
    logger.addHandler(handler)
    try:
        try:
            raise ValueError(f"bad token {jwt}")
        except ValueError:
            logger.exception("sign-in with %s failed", f"Bearer {jwt}")
    finally:
        logger.removeHandler(handler)
    [line] = lines
    assert "eyJ" not in line and json.loads(line)["exception"].count(logs.REDACTED) == 1


@pytest.fixture
def json_server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path / "server",
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_LOG_FORMAT": "json",
            "MIFAMILIAS_LOG_LEVEL": "DEBUG",
        },
    ).start()
    try:
        yield process
    finally:
        process.stop()


async def test_json_logs_carry_the_request_and_never_a_token_or_a_code(json_server: ServerProcess) -> None:
    server = json_server
    wrong = "ABCDE-FGHJK"
    async with httpx.AsyncClient(timeout=30) as client:
        script = Script(server, client)
        await script.ok("ana", "Me", "query", "query Me { me { id } }")
        family = (await script.ok("ana", "NewFamily", "mutation", NEW_FAMILY, {"i": {"name": "Los Logs"}}))[
            "createFamily"
        ]
        code = family["inviteCode"]
        refused = await script.run(
            "ben", "JoinWrong", "mutation", JOIN.replace("Join", "JoinWrong"), {"c": wrong}
        )
        assert refused["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
        await script.ok(
            "ben", "JoinRight", "mutation", JOIN.replace("Join", "JoinRight"), {"c": code.lower()}
        )
        rotated = await script.ok(
            "ana",
            "Rotate",
            "mutation",
            "mutation Rotate($id: ID!) { rotateInviteCode(familyId: $id) { inviteCode } }",
            {"id": family["id"]},
        )
        new_code = rotated["rotateInviteCode"]["inviteCode"]
        # A client that puts a code (and a token) in the URL: the access log line must not keep them.
        query = urllib.parse.urlencode(
            {"query": f'mutation {{ joinFamily(inviteCode: "{new_code}") {{ role }} }}', "token": token("cy")}
        )
        await client.get(f"{server.url}/graphql?{query}", headers={"Authorization": f"Bearer {token('cy')}"})
        # A WebSocket: its token travels in connection_init.
        async with ws_client(server, "ben") as session:
            await session.execute(GraphQLRequest("query Socket { me { id } }"))
    server.stop()  # every line written

    text = server.log()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    # One request's lines share its id, and say whose and which operation it was.
    join_ids = {line["request_id"] for line in lines if line.get("operation") == "JoinRight"}
    assert len(join_ids) == 1
    [join_id] = join_ids
    join_lines = [line for line in lines if line.get("request_id") == join_id]
    assert len(join_lines) >= 2, join_lines
    assert {line["logger"] for line in join_lines} >= {"mifamilias.graphql", "uvicorn.access"}
    assert all(line["viewer"] == "ben" and line["operation"] == "JoinRight" for line in join_lines)
    assert all(isinstance(line["duration_ms"], float) for line in join_lines)
    assert len({line["request_id"] for line in lines if "request_id" in line}) >= 6
    # No token, no code, in any form.
    secrets = [token(user) for user in ("ana", "ben", "cy")]
    for code_text in (code, new_code, wrong):
        secrets += [
            code_text,
            code_text.lower(),
            code_text.replace("-", ""),
            code_text.replace("-", "").lower(),
        ]
    assert "eyJ" not in text
    for secret in secrets:
        assert secret not in text, secret
    assert logs.REDACTED in text  # the URL's code and token were there, and went


# DynamoDB throttles and retries -------------------------------------------------------------------------


class ThrottlingDynamo(BaseHTTPRequestHandler):
    """A DynamoDB stand-in: each operation is throttled once, then answers."""

    seen: ClassVar[Counter[str]] = Counter()

    def do_POST(self) -> None:
        operation = self.headers["X-Amz-Target"].split(".")[-1]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen[operation] += 1
        first = self.seen[operation] == 1
        status, answer = 200, dict[str, Any]()
        if operation == "GetItem" and first:
            status = 400
            answer = {
                "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                "message": "slow down",
            }
        elif operation == "GetItem":
            answer = {"Item": {"PK": {"S": "a"}, "SK": {"S": "b"}}}
        elif operation == "BatchGetItem":
            table, request = next(iter(body["RequestItems"].items()))
            if first:
                answer = {"Responses": {table: []}, "UnprocessedKeys": {table: request}}
            else:
                answer = {"Responses": {table: request["Keys"]}, "UnprocessedKeys": {}}
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


async def test_dynamodb_throttles_and_retries_are_counted() -> None:
    from store.dynamodb import open_dynamo_table

    server = ThreadingHTTPServer(("127.0.0.1", 0), ThrottlingDynamo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    metrics = Metrics()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        async with open_dynamo_table("t", endpoint, "us-east-1") as dynamo:
            table = observe_table(dynamo, metrics, None, "t")
            assert await table.get(("a", "b")) == {"PK": "a", "SK": "b"}
            assert await table.batch_get([("a", "b")]) == {("a", "b"): {"PK": "a", "SK": "b"}}
    finally:
        server.shutdown()
        server.server_close()
    sample = metrics.registry.get_sample_value
    assert sample("mifamilias_store_throttles_total", {"operation": "GetItem"}) == 1
    assert sample("mifamilias_store_retries_total", {"operation": "GetItem", "by": "botocore"}) == 1
    assert sample("mifamilias_store_throttles_total", {"operation": "BatchGetItem"}) == 1
    assert sample("mifamilias_store_retries_total", {"operation": "BatchGetItem", "by": "adapter"}) == 1
    assert sample("mifamilias_store_call_seconds_count", {"kind": "get"}) == 1
    assert sample("mifamilias_store_call_seconds_count", {"kind": "batch_get"}) == 1


# Settings and the OTLP export -----------------------------------------------------------------------


def test_settings_for_observability() -> None:
    from resolvers.core.config import ConfigError

    assert Settings.from_env({}).otel is False
    assert Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}).otel is True
    assert (
        Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "MIFAMILIAS_OTEL": "false"}).otel
        is False
    )
    assert Settings.from_env({"MIFAMILIAS_LOG_LEVEL": "debug"}).log_level == "DEBUG"
    with pytest.raises(ConfigError, match="MIFAMILIAS_LOG_LEVEL"):
        Settings.from_env({"MIFAMILIAS_LOG_LEVEL": "chatty"})
    with pytest.raises(ConfigError, match="MIFAMILIAS_LOG_FORMAT"):
        Settings.from_env({"MIFAMILIAS_LOG_FORMAT": "xml"})


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that keeps the paths it was sent to."""

    paths: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_with_otel_on_spans_leave_over_otlp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.server_port}")
    try:
        app = create_app(
            Settings(data_dir=tmp_path, auth_secret=SECRET, otel=True),
            table=SqliteTable(tmp_path / "t.sqlite3"),
        )
        async with app.router.lifespan_context(app):
            assert app.state.services.tracer is not None
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
                response = await http.post(
                    "/graphql",
                    json={"query": "query Me { me { id } }"},
                    headers={"Authorization": f"Bearer {token('ana')}"},
                )
                assert without_cost(response.json()) == {"data": {"me": {"id": "ana"}}}
        # The app's end flushed its spans to the collector.
        assert "/v1/traces" in Collector.paths
    finally:
        collector.shutdown()
        collector.server_close()
