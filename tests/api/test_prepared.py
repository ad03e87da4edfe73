"""Prepared operations (`schema.prepared`), in process on both engines: a
document that parsed and validated once runs again without Strawberry's
extension machinery, and answers exactly as the extensions would have.

The proof is generated from the typical calls (tests/typical_calls.py, one of
every query the schema has): each query runs the extensions' way, then
prepared, on the same state, and both answers, and the metrics they leave,
must be the same. Refusals (cost, budget, variables, a field's error) are
compared the same way; they change nothing, so they can run twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from schema import schema_for
from schema.prepared import PreparedOperations
from tests.api.conftest import Api, running_api
from tests.api.test_limits import bypass
from tests.factories import family_with_members, settle, upload
from tests.typical_calls import VIEWERS, build_world, label, operations


def table_of(api: Api) -> PreparedOperations:
    settings = api.services.settings
    found = schema_for(metrics=settings.metrics, tracing=False).prepared  # type: ignore[attr-defined]
    assert isinstance(found, PreparedOperations)
    return found


COUNTED = ("mifamilias_graphql_requests", "mifamilias_graphql_errors", "mifamilias_graphql_phase_seconds")


def samples(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The GraphQL request and error counters, and the phase histograms' counts."""
    found = {}
    for family in api.services.metrics.registry.collect():
        if family.name not in COUNTED:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_total", "_count")):
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def added(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    return {
        key: value - before.get(key, 0.0) for key, value in after.items() if value != before.get(key, 0.0)
    }


async def both_ways(
    api: Api, query: str, variables: dict[str, Any] | None, viewer: str
) -> tuple[dict[str, Any], dict[str, Any], dict[Any, float], dict[Any, float]]:
    """The answer and the metrics added, first the extensions' way (nothing
    prepared), then prepared."""
    table = table_of(api)
    table.clear()
    runs = table.runs
    before = samples(api)
    full = await api.post(query, variables, as_=viewer)
    middle = samples(api)
    assert table.runs == runs, "ran prepared with nothing prepared"
    prepared = await api.post(query, variables, as_=viewer)
    assert table.runs == runs + 1, f"not run prepared: {query}"
    return _level(full), _level(prepared), added(before, middle), added(middle, samples(api))


def _level(body: dict[str, Any]) -> dict[str, Any]:
    """The answer with the bucket's level taken out: each run takes from it,
    so the second sees less. Its requested and actual cost stay, to compare."""
    cost = (body.get("extensions") or {}).get("cost")
    if isinstance(cost, dict):
        assert "throttleStatus" in cost, cost
        cost.pop("throttleStatus")
    return body


async def test_every_typical_query_answers_the_same_prepared(api: Api) -> None:
    world = await build_world(api, api.clock)
    await api.sign_in(*VIEWERS)
    queries = [op for op in operations(api, world) if label(op).startswith("query")]
    assert len(queries) >= 15  # every query the schema has (tests/api/test_round_trips.py checks the list)
    for op in queries:
        variables = await op.setup() if op.setup else {}
        full, prepared, full_metrics, prepared_metrics = await both_ways(
            api, op.document, variables, op.viewer
        )
        assert "errors" not in full, (label(op), full)
        assert prepared == full, label(op)
        assert prepared_metrics == full_metrics, label(op)


REFUSED: dict[str, Any] = {
    # Over the cost limit, in the float form that once slipped past it.
    "cost": lambda family: (bypass(), {"id": family, "n": 100.0}),
    # Variables that do not coerce: graphql-core refuses them before anything runs.
    "variables": lambda family: ("query($id: ID!) { family(id: $id) { id } }", {"id": {"not": "an id"}}),
    # A field's own error, relabelled with its contract code.
    "field": lambda family: ("query($id: ID!) { content(id: $id) { id } }", {"id": "nothing-here"}),
}


@pytest.mark.parametrize("why", list(REFUSED))
async def test_a_refusal_is_the_same_prepared(api: Api, why: str) -> None:
    family_id = await family_with_members(api, "ana", [])
    query, variables = REFUSED[why](family_id)
    await api.sign_in("ana")
    before = await api.snapshot()
    full, prepared, full_metrics, prepared_metrics = await both_ways(api, query, variables, "ana")
    assert full.get("errors"), (why, full)
    assert prepared == full
    assert prepared_metrics == full_metrics
    assert await api.snapshot() == before


@pytest.fixture(params=["sqlite", "dynamodb"])
async def budget_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(
        request.param, "local", tmp_path, request, cost_budget=4, cost_restore_rate=0.001
    ) as api:
        yield api


async def test_a_spent_budget_refuses_the_same_prepared(budget_api: Api) -> None:
    api = budget_api
    query = "{ me { id } }"  # 1 point: a bucket of 4 (refilling almost never) lasts four requests
    await api.sign_in("ana")  # the first point
    await api.ok(query, as_="ana")
    full, prepared, full_metrics, prepared_metrics = await both_ways(api, query, None, "ana")
    assert "errors" not in full and "errors" not in prepared
    assert full_metrics == prepared_metrics
    full, prepared, full_metrics, prepared_metrics = await both_ways(api, query, None, "ana")
    assert [e["extensions"]["code"] for e in full["errors"]] == ["RATE_LIMITED"]
    assert [e["extensions"]["code"] for e in prepared["errors"]] == ["RATE_LIMITED"]
    # The same refusal.
    assert prepared["errors"][0]["message"] == full["errors"][0]["message"]
    assert full_metrics == prepared_metrics


async def test_what_is_not_prepared_goes_the_extensions_way(api: Api) -> None:
    table = table_of(api)
    await api.sign_in("ana")
    table.clear()
    runs = table.runs
    # Without a token: the sign-in refusal is the extensions' to give.
    for _ in range(2):
        body = await api.post("{ me { id } }")
        assert body["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    # Introspection: its gate and its exemption from signing in.
    for _ in range(2):
        await api.ok("{ __schema { queryType { name } } }", as_="ana")
    # A document that does not validate is never prepared.
    for _ in range(2):
        await api.error("{ me { nothing } }", as_="ana")
    assert table.runs == runs
    assert len(table) == 0
    # A token that no longer counts: the prepared document goes the extensions' way.
    await api.ok("{ me { id } }", as_="ana")
    assert len(table) == 1
    response = await api.client.post(
        "/graphql", json={"query": "{ me { id } }"}, headers={"Authorization": "Bearer not-a-token"}
    )
    assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert table.runs == runs


async def test_a_mutation_sent_over_get_is_refused_prepared_or_not(api: Api) -> None:
    await api.sign_in("ana")
    mutation = "mutation { completeOnboarding { id } }"
    await api.ok(mutation, as_="ana")  # prepared now
    runs = table_of(api).runs
    response = await api.client.get(
        "/graphql",
        params={"query": mutation},
        headers={"Authorization": f"Bearer {api.token('ana')}", "Accept": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["errors"][0]["message"] == "mutations are not allowed when using GET"
    assert table_of(api).runs == runs


# Subscriptions ------------------------------------------------------------------------

WATCH = "subscription($id: ID!) { contentStatusChanged(contentId: $id) { id type status title } }"
WATCH_TOO_MUCH = (
    "subscription($id: ID!, $n: Int) { contentStatusChanged(contentId: $id) { family { "
    + " ".join(
        f"a{n}: feed(first: $n) {{ edges {{ node {{ family {{ feed(first: $n) {{ edges {{ node {{ id }} }} }} }} }} }} }}"
        for n in range(5)
    )
    + " } } }"
)


async def first_result(api: Api, query: str, variables: dict[str, Any], viewer: str) -> tuple[str, Any, Any]:
    """The kind, data and errors of a subscription's first result (the status
    now, for `contentStatusChanged`), with the stream closed after it unless it
    ends there."""
    from resolvers.core.context import Context

    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token(viewer)}")
    schema = schema_for(metrics=api.services.settings.metrics, tracing=False)
    results = await schema.subscribe(query, variable_values=variables, context_value=context)
    try:
        result = await results.__anext__()
        if result.errors:  # a refusal is the stream's one result, as a transport reads it to its end
            assert [extra async for extra in results] == []
    finally:
        await results.aclose()
    errors = [error.formatted for error in result.errors or ()]
    for error in errors:  # the request id is each run's own
        error.get("extensions", {}).pop("requestId", None)
    return type(result).__name__, result.data, errors


async def subscribed_both_ways(
    api: Api, query: str, variables: dict[str, Any], viewer: str
) -> tuple[Any, Any, dict[Any, float], dict[Any, float]]:
    table = table_of(api)
    table.clear()
    runs = table.runs
    before = samples(api)
    full = await first_result(api, query, variables, viewer)
    middle = samples(api)
    assert table.runs == runs, "ran prepared with nothing prepared"
    prepared = await first_result(api, query, variables, viewer)
    assert table.runs == runs + 1, f"not run prepared: {query}"
    return full, prepared, added(before, middle), added(middle, samples(api))


@pytest.mark.parametrize(
    "why",
    ["streams", "variables", "not readable", "cost"],
)
async def test_a_subscription_streams_the_same_prepared(api: Api, why: str) -> None:
    """Its first result, whether an event or a refusal (the protocol's `error`
    message is a pre-execution error), and the metrics it leaves."""
    family_id = await family_with_members(api, "ana", [])
    content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "streams": (WATCH, {"id": content_id}),
        "variables": (WATCH, {"id": {"not": "an id"}}),
        "not readable": (WATCH, {"id": "nothing-here"}),
        "cost": (WATCH_TOO_MUCH, {"id": content_id, "n": 100.0}),
    }
    query, variables = cases[why]
    await api.sign_in("ana")
    before = await api.snapshot()
    full, prepared, full_metrics, prepared_metrics = await subscribed_both_ways(api, query, variables, "ana")
    if why == "streams":
        assert full[0] == "ExecutionResult" and not full[2], full
        assert full[1]["contentStatusChanged"]["id"] == content_id
    else:
        assert full[2], full
    assert prepared == full
    assert prepared_metrics == full_metrics
    assert await api.snapshot() == before
