"""Proxy headers are believed only from MIFAMILIAS_TRUSTED_PROXIES, against a
real server process (uvicorn's own default would trust 127.0.0.1): with none
set, a client rotating X-Forwarded-For stays one address, for the per-address
limit and in the access log."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from resolvers.core.auth import mint_token
from tests.servers import SECRET, ServerProcess

JOIN = 'mutation { joinFamily(inviteCode: "NOPE-NOPE") { role } }'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(
        tmp_path_factory.mktemp("proxies"),
        {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_RATE_LIMITS": "join-address=3/600"},
    ).start()
    try:
        yield process
    finally:
        process.stop()


def test_a_rotating_x_forwarded_for_does_not_move_the_per_address_limit(server: ServerProcess) -> None:
    codes = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for n in range(5):
            token = mint_token(SECRET, f"guesser-{n}", given_name="G")  # a new person each time
            response = client.post(
                "/graphql",
                json={"query": JOIN},
                headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": f"203.0.113.{n + 1}"},
            )
            codes.append(response.json()["errors"][0]["extensions"]["code"])
    # Three wrong codes from this address, then the address is refused.
    assert codes == ["BAD_USER_INPUT"] * 3 + ["RATE_LIMITED"] * 2
    log = server.log()
    assert "203.0.113." not in log
