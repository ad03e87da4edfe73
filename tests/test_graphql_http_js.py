"""graphql-http's own conformance audit (npm `graphql-http`, `auditServer`),
driven by Node (`tests/js/audit.mjs`) against a real server process: every
audit, MUST, SHOULD and MAY, must pass; a warning is a failure here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from resolvers.core.auth import mint_token
from tests.js_clients import JS
from tests.servers import SECRET, ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("graphql-http"), {"MIFAMILIAS_AUTH_SECRET": SECRET}
    ).start()
    try:
        yield process
    finally:
        process.stop()


async def audit(server: ServerProcess, *token: str) -> list[dict[str, str]]:
    node = await asyncio.create_subprocess_exec(
        "node",
        str(JS / "audit.mjs"),
        f"{server.url}/graphql",
        *token,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), 120)  # bounds a failure only
    assert node.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "signed-in"])
async def test_every_graphql_http_audit_passes(server: ServerProcess, signed_in: bool) -> None:
    token = [mint_token(SECRET, "ana", given_name="Ana")] if signed_in else []
    results = await audit(server, *token)
    assert len(results) >= 60  # the audit ran whole (graphql-http 1.22 has 61)
    not_ok = [result for result in results if result["status"] != "ok"]
    assert not_ok == [], json.dumps(not_ok, indent=1)
    assert "Traceback" not in server.log()
