"""The server around the schema: HTTP GET, limits, error masking, health,
RS256 tokens from a JWKS, and the command line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from app import create_app
from resolvers.core.auth import mint_token
from resolvers.core.config import Settings
from resolvers.core.logs import RequestFields
from store import keys
from store.port import Key, SortKey, Table
from store.sqlite import SqliteTable
from tests.servers import ROOT, SECRET, after_the_start_up_pass, free_port, until, without_cost


class FailingTable:
    """Fault injection through the port: point reads and writes fail as a broken store would."""

    def __init__(self, inner: Table) -> None:
        self.inner = inner
        self.broken = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def batch_get(self, keys: Any) -> dict[Key, Any]:
        if self.broken:
            raise RuntimeError("disk on fire at /var/lib/secret-path")
        return await self.inner.batch_get(keys)

    async def get(self, key: Key) -> Any:
        if self.broken:
            raise RuntimeError("disk on fire at /var/lib/secret-path")
        return await self.inner.get(key)

    async def put(self, item: Any, condition: Any = None) -> None:
        if self.broken:
            raise RuntimeError("disk on fire at /var/lib/secret-path")
        await self.inner.put(item, condition)

    async def ping(self) -> None:
        if self.broken:
            raise RuntimeError("store down")
        await self.inner.ping()


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, FailingTable]]:
    table = FailingTable(SqliteTable(tmp_path / "t.sqlite3"))
    app = create_app(Settings(data_dir=tmp_path, auth_secret=SECRET), table=table)
    async with app.router.lifespan_context(app):
        await after_the_start_up_pass(app)  # before a test breaks the table
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            http.headers["Authorization"] = f"Bearer {mint_token(SECRET, 'ana')}"
            yield http, table


async def test_queries_over_get_and_health(client: tuple[httpx.AsyncClient, FailingTable]) -> None:
    http, table = client
    response = await http.get("/graphql", params={"query": "{ me { id } }"})
    assert without_cost(response.json()) == {"data": {"me": {"id": "ana"}}}
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    table.broken = True
    # Liveness is the process's own: a store outage must not get it restarted.
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert ready.status_code == 503
    # What is down, by the kind of failure; the message (a path here) stays in the log.
    assert ready.json() == {
        "status": "unavailable",
        "store": "the table did not answer: RuntimeError",
        "broker": "ok",
    }
    table.broken = False
    assert (await http.get("/readyz")).status_code == 200


async def test_readiness_ends_when_the_shutdown_begins(tmp_path: Path) -> None:
    app = create_app(
        Settings(data_dir=tmp_path, auth_secret=SECRET), table=SqliteTable(tmp_path / "t.sqlite3")
    )
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            assert (await http.get("/readyz")).status_code == 200
            await app.state.going_away()
            ready = await http.get("/readyz")
            assert ready.status_code == 503
            assert ready.json() == {"status": "unavailable", "server": "shutting down"}
            assert (await http.get("/healthz")).status_code == 200


async def test_a_stopping_server_hands_its_unlock_shards_back(tmp_path: Path) -> None:
    table = SqliteTable(tmp_path / "t.sqlite3")
    app = create_app(Settings(data_dir=tmp_path, auth_secret=SECRET), table=table)

    async def shard_leases() -> list[dict[str, Any]]:
        page = await table.query(keys.SCHEDULER_PK, SortKey.begins_with(keys.UNLOCK_SHARD_LEASE_PREFIX))
        return page.items

    async def all_held() -> bool:
        leases = await shard_leases()
        return len(leases) == app.state.services.settings.unlock_shards and all(
            item.get("leaseOwner") for item in leases
        )

    async with app.router.lifespan_context(app):
        # The first unlock pass, alone in this process, takes every shard.
        await until(all_held, "every unlock shard held", 60, interval=0.05)
    # Handed back at once: another process's next pass takes them, not after the lease.
    assert [item.get("leaseOwner") for item in await shard_leases()] == [None] * Settings().unlock_shards
    await table.close()


async def test_limits_on_depth_and_aliases(client: tuple[httpx.AsyncClient, FailingTable]) -> None:
    http, _ = client
    deep = (
        "{ myFamilies { family { members { edges { node { family { members { edges { node { family { members {"
        " edges { node { user { id } } } } } } } } } } } } } } }"
    )
    body = (await http.post("/graphql", json={"query": deep})).json()
    assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert "depth" in body["errors"][0]["message"]
    aliases = "{ " + " ".join(f"a{n}: me {{ id }}" for n in range(40)) + " }"
    body = (await http.post("/graphql", json={"query": aliases})).json()
    assert body["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    assert "aliases" in body["errors"][0]["message"].lower()


async def test_an_unexpected_failure_is_masked_and_logged_with_its_request_id(
    client: tuple[httpx.AsyncClient, FailingTable], caplog: pytest.LogCaptureFixture
) -> None:
    http, table = client
    await http.post("/graphql", json={"query": "{ me { id } }"})
    table.broken = True
    # The request's fields go on each line from the log context, as the server's handler puts them.
    caplog.handler.addFilter(RequestFields())
    with caplog.at_level(logging.ERROR, logger="mifamilias.errors"):
        body = (await http.post("/graphql", json={"query": '{ family(id: "x") { name } }'})).json()
    error = body["errors"][0]
    assert error["extensions"]["code"] == "INTERNAL_SERVER_ERROR"
    assert "disk on fire" not in json.dumps(body) and "Traceback" not in json.dumps(body)
    request_id = error["extensions"]["requestId"]
    assert request_id in error["message"]
    logged = [record for record in caplog.records if record.exc_info]
    assert logged and all(getattr(record, "request_id", None) == request_id for record in logged)
    assert all(request_id not in record.getMessage() for record in logged)  # a field, not in the text


@pytest.fixture(scope="module")
def jwks() -> Iterator[tuple[str, rsa.RSAPrivateKey]]:
    """A JWKS endpoint on loopback, as Cognito or Auth0 would publish."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/.well-known/jwks.json", key
    server.shutdown()


async def test_rs256_tokens_are_checked_against_the_jwks(jwks: tuple[str, Any], tmp_path: Path) -> None:
    url, key = jwks
    settings = Settings(
        data_dir=tmp_path, jwks_url=url, jwt_issuer="https://issuer.example", jwt_audience="app"
    )
    app = create_app(settings, table=SqliteTable(tmp_path / "t.sqlite3"))

    def token(**claims: Any) -> str:
        payload = {
            "sub": "rita",
            "exp": 4_000_000_000,
            "iss": "https://issuer.example",
            "aud": "app",
            "given_name": "Rita",
            **claims,
        }
        return jwt.encode(payload, key, algorithm="RS256", headers={"kid": "k1"})

    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:

            async def me(tok: str) -> dict[str, Any]:
                response = await http.post(
                    "/graphql",
                    json={"query": "{ me { id givenName } }"},
                    headers={"Authorization": f"Bearer {tok}"},
                )
                result: dict[str, Any] = response.json()
                return result

            assert (await me(token()))["data"] == {"me": {"id": "rita", "givenName": "Rita"}}
            for bad in (token(aud="other"), token(iss="https://evil.example"), mint_token(SECRET, "rita")):
                assert (await me(bad))["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py"), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_line(tmp_path: Path, moto_server: str) -> None:
    env = {"MIFAMILIAS_DATA_DIR": str(tmp_path)}
    helped = run_cli("--help", env=env)
    assert helped.returncode == 0
    for command in ("serve", "token", "create-table", "export-schema"):
        assert command in helped.stdout
    minted = run_cli("token", "ana", "--given-name", "Ana", env=env)
    assert minted.returncode == 0
    secret = (tmp_path / "auth-secret").read_text().strip()
    claims = jwt.decode(minted.stdout.strip(), secret, algorithms=["HS256"])
    assert claims["sub"] == "ana" and claims["given_name"] == "Ana"

    dynamo = {
        **env,
        "MIFAMILIAS_DYNAMODB_ENDPOINT": moto_server,
        "MIFAMILIAS_AWS_REGION": "us-east-1",
        "MIFAMILIAS_TABLE_NAME": f"cli-{tmp_path.name[-8:]}",
    }
    first, second = run_cli("create-table", env=dynamo), run_cli("create-table", env=dynamo)
    assert first.returncode == 0 and "created" in first.stdout, first.stderr
    assert second.returncode == 0 and "already exists" in second.stdout, second.stderr


def test_a_server_on_dynamodb_without_a_vapid_key_refuses_to_start(tmp_path: Path, moto_server: str) -> None:
    """`serve` on a shared table with no VAPID key given exits at once, saying
    why and how to make one, rather than sign pushes with a key of this host's
    own that browsers subscribed through another host would refuse."""
    env = {
        "MIFAMILIAS_DATA_DIR": str(tmp_path),
        "MIFAMILIAS_PORT": str(free_port()),
        "MIFAMILIAS_DYNAMODB_ENDPOINT": moto_server,
        "MIFAMILIAS_AWS_REGION": "us-east-1",
        "MIFAMILIAS_TABLE_NAME": f"novapid-{tmp_path.name[-8:]}",
        "MIFAMILIAS_VAPID_PRIVATE_KEY": "",  # unset, whatever the test run's environment holds
    }
    refused = run_cli("serve", env=env)
    assert refused.returncode == 2, refused.stderr
    assert "MIFAMILIAS_VAPID_PRIVATE_KEY is needed with DynamoDB" in refused.stderr
    assert "python app.py vapid-key" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "vapid-private.pem").exists()
