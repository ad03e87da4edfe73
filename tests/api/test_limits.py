"""Limits that hold before anything runs, counted through the port, and work
that stays bounded: the query cost, request and variable sizes, the operation
deadline, photos over the pixel cap and text checked as it streams."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from store import keys
from store.port import op_key
from tests.api.conftest import Api, running_api
from tests.conftest import ENGINES
from tests.factories import family_with_members, settle, upload
from tests.servers import until

pytestmark = pytest.mark.usefixtures("turns_without_time")

# Limits before anything runs, counted through the port --------------------------------------


def amplification() -> str:
    """Four aliased feeds of 100, each wrapping six more: depth and aliases
    within the limits, an answer of millions of objects."""
    inner = " ".join(
        f"f{n}: feed(first: 100) {{ edges {{ node {{ id title author {{ givenName }} }} }} }}"
        for n in range(6)
    )
    outer = " ".join(
        f"a{n}: feed(first: 100) {{ edges {{ node {{ id family {{ {inner} }} }} }} }}" for n in range(4)
    )
    return f"query($id: ID!) {{ family(id: $id) {{ {outer} }} }}"


async def test_the_amplification_query_is_refused_before_any_store_call(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    await api.sign_in("ana")
    api.table.reset()  # type: ignore[attr-defined]
    body = await api.post(amplification(), {"id": family_id}, as_="ana")
    assert dict(api.table.calls) == {}  # type: ignore[attr-defined]
    error = body["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["cost"]["limit"] == api.services.settings.max_query_cost
    assert error["extensions"]["cost"]["estimated"] > 500_000
    # It names the list that costs most, the one to shrink.
    assert error["extensions"]["cost"]["costliestList"] == "Family.feed"
    assert "the list that costs most is Family.feed" in error["message"]
    assert body["data"] is None


def bypass(declared: str = "$n: Int", size: str = "$n") -> str:
    """Five aliased feeds, each wrapping a feed of the same size: the query of
    the cost bypass, its sizes in a variable (or a literal, with no `declared`)."""
    scalars = "id title type status createdAt commentCount transcription body: title"
    inner = f"feed(first: {size}) {{ edges {{ node {{ {scalars} }} }} }}"
    feeds = " ".join(
        f"a{n}: feed(first: {size}) {{ edges {{ node {{ family {{ {inner} }} }} }} }}" for n in range(5)
    )
    declarations = ", ".join(d for d in ("$id: ID!", declared) if d)
    return f"query({declarations}) {{ family(id: $id) {{ {feeds} }} }}"


@pytest.mark.parametrize(
    ("declared", "sent"),
    [("$n: Int", 100), ("$n: Int", 100.0), ("$n: Int = 100", None), ("$n: Int! = 100", None)],
    ids=["int", "float", "default", "non-null-default"],
)
async def test_sizes_are_read_as_execution_reads_them(api: Api, declared: str, sent: object) -> None:
    """`100.0` is the Int 100 to graphql-core, and a declared default counts when
    the variable is not sent: each form is refused with the estimate of `100`,
    before any store call."""
    family_id = await family_with_members(api, "ana", [])
    await api.sign_in("ana")
    literal = await api.post(bypass("", "100"), {"id": family_id}, as_="ana")
    expected = literal["errors"][0]["extensions"]["cost"]["estimated"]
    assert expected > 100_000
    variables: dict[str, object] = {"id": family_id}
    if sent is not None:
        variables["n"] = sent
    api.table.reset()  # type: ignore[attr-defined]
    body = await api.post(bypass(declared), variables, as_="ana")
    assert dict(api.table.calls) == {}  # type: ignore[attr-defined]
    assert body["data"] is None
    error = body["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT"
    assert error["extensions"]["cost"] == {
        "estimated": expected,
        "limit": api.services.settings.max_query_cost,
        "requestedQueryCost": expected,
        "costliestList": "Family.feed",
    }


async def test_an_omitted_size_counts_what_execution_uses(api: Api) -> None:
    """Not sent and with no default, `$n` leaves `first` to the field's default
    (20), which is what runs; an out-of-range size counts the largest page."""
    family_id = await family_with_members(api, "ana", [])
    await api.sign_in("ana")
    # Five feeds of 20 wrapping feeds of 20 are within the limit, as they run.
    assert await api.ok(bypass(), {"id": family_id}, as_="ana") == await api.ok(
        bypass(), {"id": family_id, "n": 20}, as_="ana"
    )
    huge = await api.post(bypass(), {"id": family_id, "n": 10_000}, as_="ana")
    hundred = await api.post(bypass(), {"id": family_id, "n": 100}, as_="ana")
    assert huge["errors"][0]["extensions"]["cost"] == hundred["errors"][0]["extensions"]["cost"]


async def test_fields_that_do_work_carry_a_cost(api: Api) -> None:
    """Signed URLs and per-viewer reads cost 1 each time they can appear: twenty
    feeds of 100 asking for them are over the limit, the same feeds without
    them are not."""
    family_id = await family_with_members(api, "ana", [])
    await api.sign_in("ana")

    def feeds(fields: str) -> str:
        many = " ".join(f"a{n}: feed(first: 100) {{ edges {{ node {{ id {fields} }} }} }}" for n in range(20))
        return f"query($id: ID!) {{ family(id: $id) {{ {many} }} }}"

    body = await api.post(feeds("mediaUrl thumbnailUrl viewerReactions"), {"id": family_id}, as_="ana")
    # Per feed: the connection, 100 edges, 100 nodes and 300 fields that do work.
    cost = body["errors"][0]["extensions"]["cost"]
    assert (cost["estimated"], cost["limit"]) == (1 + 20 * 501, 10_000)
    data = await api.ok(feeds("title createdAt"), {"id": family_id}, as_="ana")
    assert len(data["family"]) == 20


async def test_the_deadline_stops_work_that_never_awaits(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Introspection resolves without a single await, so a timer alone could
    never interrupt it: the fields themselves stop once the deadline passed."""
    query = "{ __schema { types { name fields { name args { name type { name ofType { name } } } } } } }"
    async with running_api("sqlite", "local", tmp_path, request, operation_deadline_seconds=1e-9) as api:
        body = (await api.client.post("/graphql", json={"query": query})).json()
    assert body["data"] is None
    assert body["errors"][0]["extensions"]["code"] == "UNAVAILABLE"
    assert "did not finish within" in body["errors"][0]["message"]


async def test_the_default_budget_admits_a_rich_feed_page(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    for n in range(3):
        await upload(api, "ben", family_id, "TEXT", b"hola", "text/plain", title=f"nota {n}")
    await settle(api)
    query = """query($id: ID!) { family(id: $id) { name feed(first: 20) { edges { node {
      id title author { givenName } reactions { emoji count } viewerReactions commentCount
      tags { value author { givenName } } comments(first: 3) { edges { node { body author { givenName } } } }
    } } pageInfo { hasNextPage endCursor } } } }"""
    data = await api.ok(query, {"id": family_id}, as_="ana")
    assert len(data["family"]["feed"]["edges"]) == 3


async def test_a_huge_body_is_refused_before_any_store_call(api: Api) -> None:
    await api.sign_in("ana")
    api.table.reset()  # type: ignore[attr-defined]
    ids = ",".join(['"x"'] * 300_000)
    body = f'{{"query": "mutation($ids: [ID!]) {{ markNotificationsRead(ids: $ids) }}", "variables": {{"ids": [{ids}]}}}}'
    response = await api.client.post(
        "/graphql",
        content=body.encode(),
        headers={"Authorization": f"Bearer {api.token('ana')}", "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert dict(api.table.calls) == {}  # type: ignore[attr-defined]


async def test_list_variables_and_search_prefixes_are_bounded(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    await api.sign_in("ana")
    api.table.reset()  # type: ignore[attr-defined]
    code, message = await api.error(
        "mutation($ids: [ID!]) { markNotificationsRead(ids: $ids) }", {"ids": ["n"] * 101}, as_="ana"
    )
    assert code == "BAD_USER_INPUT" and "$ids" in message and "100" in message
    assert dict(api.table.calls) == {}  # type: ignore[attr-defined]
    code, message = await api.error(
        "query($f: ID!, $p: String!) { searchTags(familyId: $f, prefix: $p) { edges { node { value } } } }",
        {"f": family_id, "p": "a" * 101},
        as_="ana",
    )
    assert code == "BAD_USER_INPUT" and "prefix" in message


async def test_an_operation_past_its_deadline_is_stopped_with_a_clear_error(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Not the client's fault (the cost limit refuses what asks too much before
    it runs): UNAVAILABLE, to retry; a mutation's outcome is UNKNOWN. A store
    call takes 2.5 times the deadline (set-up calls take none), so the outcome
    does not hang on the machine's speed."""
    async with running_api("sqlite", "local", tmp_path, request, operation_deadline_seconds=1) as api:
        family_id = await family_with_members(api, "ana", [])
        api.table.latency = 2.5  # type: ignore[attr-defined]  # each store call outlasts the deadline
        read = await api.post("query($id: ID!) { family(id: $id) { name } }", {"id": family_id}, as_="ana")
        write = await api.post('mutation { createFamily(input: {name: "Otra"}) { id } }', as_="ana")
        api.table.latency = 0  # type: ignore[attr-defined]
    error = read["errors"][0]
    assert error["extensions"]["code"] == "UNAVAILABLE" and "within 1 s" in error["message"]
    assert error["extensions"]["retryAfter"] > 0 and "outcome" not in error["extensions"]
    error = write["errors"][0]
    assert error["extensions"]["code"] == "UNAVAILABLE" and error["extensions"]["outcome"] == "UNKNOWN"
    assert "Idempotency-Key" in error["message"]


async def test_the_deadline_holds_for_a_query_over_a_stream_but_not_for_a_subscription(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A query or mutation over Server-Sent Events (or a WebSocket) runs within
    the deadline like one over plain HTTP; a subscription lives past it. A store
    call takes 2.5 times the deadline (and set-up calls take none), so the
    outcome does not hang on the machine's speed."""
    async with running_api("sqlite", "local", tmp_path, request, operation_deadline_seconds=1) as api:
        family_id = await family_with_members(api, "ana", [])
        headers = {"Authorization": f"Bearer {api.token('ana')}", "Accept": "text/event-stream"}
        api.table.latency = 2.5  # type: ignore[attr-defined]  # each store call outlasts the deadline
        response = await api.client.post(
            "/graphql",
            json={"query": "query($id: ID!) { family(id: $id) { name } }", "variables": {"id": family_id}},
            headers=headers,
        )
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.text.splitlines() if line.startswith("data: {")]
        assert len(events) == 1 and "within 1 s" in events[0], response.text
        assert '"code":"UNAVAILABLE"' in events[0]
        # The subscription's first event takes longer than the deadline, and comes.
        api.table.latency = 0  # type: ignore[attr-defined]
        content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
        api.table.latency = 2.5  # type: ignore[attr-defined]
        from strawberry.types import ExecutionResult

        from resolvers.core.context import Context
        from schema import schema

        context = Context(services=api.services)
        await context.authenticate(headers["Authorization"])
        stream = await schema.stream(
            "subscription($id: ID!) { contentStatusChanged(contentId: $id) { id } }",
            variable_values={"id": content_id},
            context_value=context,
        )
        first = await anext(stream)
        await stream.aclose()
        api.table.latency = 0  # type: ignore[attr-defined]
    assert isinstance(first, ExecutionResult)
    assert first.errors is None and first.data == {"contentStatusChanged": {"id": content_id}}


async def test_a_photo_over_the_pixel_cap_fails_with_a_reason(api: Api, tmp_path: Path) -> None:
    from PIL import Image

    family_id = await family_with_members(api, "ana", [])
    path = tmp_path / "huge.png"
    Image.new("L", (8000, 6000)).save(path, optimize=True)  # 48 MP, a few hundred KB on disk
    content_id = await upload(api, "ana", family_id, "PHOTO", path.read_bytes(), "image/png")
    await settle(api)
    data = await api.ok(
        "query($id: ID!) { content(id: $id) { status failureReason } }", {"id": content_id}, as_="ana"
    )
    assert data["content"]["status"] == "FAILED"
    assert (
        "8000×6000" in data["content"]["failureReason"]
        and "40 megapixels" in data["content"]["failureReason"]
    )


async def test_text_is_checked_as_it_streams(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    good = ("ñandú " * 50_000).encode()  # multi-byte characters across chunk boundaries
    bad = good[:200_000] + b"\xff" + good[:10]
    ok_id = await upload(api, "ana", family_id, "TEXT", good, "text/plain")
    bad_id = await upload(api, "ana", family_id, "TEXT", bad, "text/plain")
    await settle(api)
    query = "query($id: ID!) { content(id: $id) { status failureReason } }"
    assert (await api.ok(query, {"id": ok_id}, as_="ana"))["content"]["status"] == "READY"
    failed = (await api.ok(query, {"id": bad_id}, as_="ana"))["content"]
    assert failed == {"status": "FAILED", "failureReason": "the file is not UTF-8 text"}


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_write_stopped_by_the_deadline_after_its_commit_is_still_announced(
    request: pytest.FixtureRequest, tmp_path: Path, engine: str
) -> None:
    """A comment commits, then its deadline passes while its notification is
    being published: the mutation answers UNAVAILABLE (outcome UNKNOWN), and
    the publish goes on. Stopped with the mutation, it never reached the
    author's streams, and nothing told them to re-read (the soak found it:
    subscribers that stayed connected never saw such a comment's note)."""
    # 3 s: the set-up's calls stay well within it on a loaded machine; the
    # held call outlasts any deadline.
    async with running_api(engine, "local", tmp_path, request, operation_deadline_seconds=3) as api:
        family_id = await family_with_members(api, "ana", ["ben"])
        content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
        await settle(api)
        broker = api.services.broker
        publish, release, published = broker.publish_many, asyncio.Event(), []

        async def held(events: Any) -> None:
            await release.wait()  # until the mutation has answered
            await publish(events)
            published.extend(events)

        broker.publish_many = held
        try:
            answer = await api.post(
                "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
                {"c": content_id, "b": "hola"},
                as_="ben",
            )
            release.set()
            assert answer["errors"][0]["extensions"]["outcome"] == "UNKNOWN"
            await until(lambda: published, "the comment's notification published")
        finally:
            broker.publish_many = publish
    (channel, event) = published[0]
    assert channel == "user:ana:notifications" and event["kind"] == "notification"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_write_in_flight_when_the_deadline_passes_is_announced_once_it_lands(
    request: pytest.FixtureRequest, tmp_path: Path, engine: str
) -> None:
    """The deadline passes while a comment's transaction is in flight: the
    write lands (its answer is what is held here) and the mutation has
    answered UNAVAILABLE (outcome UNKNOWN). The note must still be announced:
    stopped there, nothing published it and no outbox would."""
    # 3 s: the set-up's calls stay well within it on a loaded machine; the
    # held call outlasts any deadline.
    async with running_api(engine, "local", tmp_path, request, operation_deadline_seconds=3) as api:
        family_id = await family_with_members(api, "ana", ["ben"])
        content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
        await settle(api)
        table, broker = api.table, api.services.broker
        transact, publish = table.transact, broker.publish_many
        release, published = asyncio.Event(), []

        async def landed_then_held(ops: Any) -> None:
            await transact(ops)
            if any(op_key(op)[1].startswith(keys.COMMENT_PREFIX) for op in ops):
                await release.wait()  # the answer, in flight until the mutation has answered

        async def recorded(events: Any) -> None:
            await publish(events)
            published.extend(events)

        table.transact, broker.publish_many = landed_then_held, recorded  # type: ignore[method-assign]
        try:
            answer = await api.post(
                "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
                {"c": content_id, "b": "hola"},
                as_="ben",
            )
            release.set()
            assert answer["errors"][0]["extensions"]["outcome"] == "UNKNOWN"
            await until(lambda: published, "the comment's notification published")
        finally:
            table.transact, broker.publish_many = transact, publish  # type: ignore[method-assign]
    assert [channel for channel, _ in published] == ["user:ana:notifications"]
