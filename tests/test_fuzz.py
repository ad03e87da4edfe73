"""A fuzz suite generated from the schema, against a running server.

hypothesis-graphql writes valid queries and mutations of our schema, with
random arguments; a second strategy breaks them (cut, spliced, with stray
characters) and sends malformed bodies. Whatever arrives, the server answers
with no 5xx, logs no traceback, and keeps answering `/healthz`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_graphql import nodes
from hypothesis_graphql import strategies as gql_strategies

from resolvers.core.auth import mint_token
from schema import schema
from tests.servers import SECRET, ServerProcess

SDL = schema.as_str()
# Dates as a client sends them, with and without a zone, and text that is not one.
SCALARS = {
    "DateTime": (st.datetimes().map(lambda d: d.isoformat()) | st.text(max_size=30)).map(nodes.String),
}
OPERATIONS = gql_strategies.queries(SDL, custom_scalars=SCALARS) | gql_strategies.mutations(
    SDL, custom_scalars=SCALARS
)
TOKEN = mint_token(SECRET, "fuzzer", given_name="Fuzz")


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same few thousand cases on every run, so a failure reproduces
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
    )


@pytest.fixture(scope="module")
def client(live_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as session:
        # The fuzzer is a member of a family, so some generated ids could matter.
        session.post(
            "/graphql",
            json={"query": 'mutation { createFamily(input: {name: "Fuzz"}) { id } }'},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        yield session


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
        assert isinstance(body, dict), body
        for error in body.get("errors") or []:
            assert error.get("extensions", {}).get("code"), error
            assert error["extensions"]["code"] != "INTERNAL_SERVER_ERROR", error


def assert_healthy(client: httpx.Client, server: ServerProcess) -> None:
    assert client.get("/healthz").status_code == 200
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


@fuzz_settings(1500)
@given(
    query=OPERATIONS,
    signed_in=st.booleans(),
)
def test_generated_operations_never_fail_the_server(
    client: httpx.Client, live_server: ServerProcess, query: str, signed_in: bool
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if signed_in else {}
    check(client.post("/graphql", json={"query": query}, headers=headers))


@fuzz_settings(1000)
@given(
    query=OPERATIONS,
    cut=st.integers(min_value=0, max_value=400),
    noise=st.text(alphabet=st.sampled_from('{}()[]:$!@#"\\ \n\x00abcXYZ0123'), max_size=12),
    variables=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=12,
    ),
    shape=st.sampled_from(["query", "raw", "variables"]),
)
def test_broken_operations_and_bodies_get_clean_refusals(
    client: httpx.Client,
    live_server: ServerProcess,
    query: str,
    cut: int,
    noise: str,
    variables: object,
    shape: str,
) -> None:
    broken = query[:cut] + noise + query[cut:]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if shape == "query":
        body = json.dumps({"query": broken})
    elif shape == "variables":
        body = json.dumps({"query": query, "variables": variables})
    else:
        body = broken  # not JSON at all, or JSON of the wrong shape
    check(client.post("/graphql", content=body.encode("utf-8", "surrogatepass"), headers=headers))


def test_the_server_is_healthy_after_the_fuzz(client: httpx.Client, live_server: ServerProcess) -> None:
    """Runs after the fuzz tests of this module (pytest keeps file order)."""
    assert_healthy(client, live_server)
