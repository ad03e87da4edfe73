"""Idempotency-Key on both engines: a retry answers the first result and
applies nothing twice; the same key with another request is refused; a key is
its person's own; the header and `extensions.idempotencyKey` are one key."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from resolvers.core import idempotency
from schema import schema
from store.port import StoreUnavailable, op_key
from tests.api.conftest import Api, is_cost_bucket
from tests.factories import family_with_members, settle, upload
from tests.typical_calls import VIEWERS, build_world, label, only_the_request, operations, schema_operations

COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id body } }"
COUNT = "query($id: ID!) { content(id: $id) { commentCount comments { edges { node { body } } } } }"


async def _world(api: Api) -> str:
    family_id = await family_with_members(api, "ana", ["ben"])
    post = await upload(api, "ben", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    return post


async def _post_with_key(api: Api, key: str, variables: dict[str, Any], *, as_: str) -> dict[str, Any]:
    return await api.post(COMMENT, variables, as_=as_, headers={"Idempotency-Key": key})


async def test_a_retry_answers_the_first_result_and_applies_once(api: Api) -> None:
    post = await _world(api)
    first = await _post_with_key(api, "k-1", {"id": post, "b": "una vez"}, as_="ana")
    again = await _post_with_key(api, "k-1", {"id": post, "b": "una vez"}, as_="ana")
    assert "errors" not in first and again == first
    # At once, too: the second waits for the first and answers the same.
    both = await asyncio.gather(
        *(_post_with_key(api, "k-2", {"id": post, "b": "a la vez"}, as_="ana") for _ in range(2))
    )
    assert both[0] == both[1] and "errors" not in both[0]
    # Over another transport's field for it: the same key.
    response = await api.client.post(
        "/graphql",
        json={
            "query": COMMENT,
            "variables": {"id": post, "b": "una vez"},
            "extensions": {"idempotencyKey": "k-1"},
        },
        headers={"Authorization": f"Bearer {api.token('ana')}"},
    )
    assert response.json() == first
    counted = await api.ok(COUNT, {"id": post}, as_="ben")
    assert counted["content"]["commentCount"] == 2
    assert sorted(e["node"]["body"] for e in counted["content"]["comments"]["edges"]) == [
        "a la vez",
        "una vez",
    ]


async def test_the_same_key_for_another_request_is_refused_and_changes_nothing(api: Api) -> None:
    post = await _world(api)
    await _post_with_key(api, "k", {"id": post, "b": "primero"}, as_="ana")
    other = await _post_with_key(api, "k", {"id": post, "b": "otro"}, as_="ana")
    error = other["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and "Idempotency-Key" in error["message"]
    # Another person's key of the same text is theirs: it runs.
    ben = await _post_with_key(api, "k", {"id": post, "b": "otro"}, as_="ben")
    assert "errors" not in ben, ben
    counted = await api.ok(COUNT, {"id": post}, as_="ben")
    assert sorted(e["node"]["body"] for e in counted["content"]["comments"]["edges"]) == ["otro", "primero"]


async def test_a_key_that_is_not_a_key_is_refused(api: Api) -> None:
    post = await _world(api)
    refused = await _post_with_key(api, "x" * 300, {"id": post, "b": "hola"}, as_="ana")
    assert refused["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"
    counted = await api.ok(COUNT, {"id": post}, as_="ben")
    assert counted["content"]["commentCount"] == 0


@pytest.mark.parametrize(
    "key", [{"a": 1}, 7, ["k"], True, ""], ids=["object", "number", "list", "bool", "empty"]
)
async def test_an_extensions_key_that_is_not_a_string_is_refused_not_ignored(api: Api, key: object) -> None:
    # Ignoring it would run the mutation without the key its sender counts on.
    post = await _world(api)
    response = await api.client.post(
        "/graphql",
        json={
            "query": COMMENT,
            "variables": {"id": post, "b": "hola"},
            "extensions": {"idempotencyKey": key},
        },
        headers={"Authorization": f"Bearer {api.token('ana')}"},
    )
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "BAD_USER_INPUT" and "idempotencyKey" in error["message"]
    counted = await api.ok(COUNT, {"id": post}, as_="ben")
    assert counted["content"]["commentCount"] == 0


# Every mutation: its first write carries its key ---------------------------------------------

IDEMPOTENCY = "IDEMPOTENCY#"
WRITES = ("put", "update", "delete", "batch_write", "transact")


def _keys_of(name: str, args: tuple[Any, ...]) -> list[tuple[str, str]]:
    # A cost bucket's charge comes before the mutation runs and is not its state:
    # a retry after a lost answer to it simply runs the mutation.
    if name == "update" and is_cost_bucket(args[0].key):
        return []
    if name == "transact":
        return [op_key(op) for op in args[0]]
    if name == "put":
        return [(args[0]["PK"], args[0]["SK"])]
    if name == "update":
        return [args[0].key]
    if name == "delete":
        return [args[0]]
    return [("batch_write", "")]  # never the key's: not a transaction


@contextlib.contextmanager
def answer_lost_after_first_write(api: Api, seen: list[list[tuple[str, str]]]) -> Iterator[None]:
    """The mutation's first write (any write but the key's own claim and
    answer) lands, and its answer never comes back: the store's outcome is
    unknown to the server, as when DynamoDB does not answer a transaction."""
    table = api.table

    def wrap(name: str) -> Any:
        original = getattr(table, name)

        async def write(*args: Any, **kwargs: Any) -> Any:
            touched = _keys_of(name, args)
            if seen or all(key[0].startswith(IDEMPOTENCY) for key in touched):
                return await original(*args, **kwargs)
            seen.append(touched)
            await original(*args, **kwargs)
            raise StoreUnavailable("no answer from the store", outcome_known=False)

        return write

    for name in WRITES:
        setattr(table, name, wrap(name))
    try:
        yield
    finally:
        for name in WRITES:
            delattr(table, name)


def _state(snapshot: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    # The keys themselves and the rate counters (counted beside the write) are not the mutation's.
    return {key: item for key, item in snapshot.items() if not key[0].startswith((IDEMPOTENCY, "RATE#"))}


async def settled(api: Api) -> None:
    """The pipeline idle, with whatever its recovery pass would find done too
    (that pass runs on its own timer: here it runs now, not between two reads)."""
    await settle(api)
    await api.services.pipeline.recover()
    await settle(api)


async def test_every_mutation_carries_its_key_in_its_first_write(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over every mutation of the schema (their typical calls): the first write
    that lands holds the key's item, and a retry after its answer was lost
    applies nothing again."""
    world = await build_world(api, api.clock)
    mutations = [op for op in operations(api, world) if label(op).startswith("mutation")]
    assert {op.field for op in mutations} == {
        field for kind, field in schema_operations(schema) if kind == "mutation"
    }
    await api.sign_in(*VIEWERS)
    checked: list[str] = []
    for n, op in enumerate(mutations):
        variables = await op.setup() if op.setup else {}
        headers = {"Idempotency-Key": f"retry-{n}"}
        seen: list[list[tuple[str, str]]] = []
        async with only_the_request(api):
            with answer_lost_after_first_write(api, seen):
                first = await api.post(op.document, variables, as_=op.viewer, headers=headers)
        # What the pipeline does once released, or its recovery pass finds the first
        # attempt left, is not the retry's doing: done before either state is read.
        await settled(api)
        after_first = _state(await api.snapshot())
        if not seen:  # it wrote nothing: answered, and answered again the same
            again = await api.post(op.document, variables, as_=op.viewer, headers=headers)
            assert "errors" not in first and again == first, (label(op), first, again)
            continue
        where = label(op)
        assert any(key[0].startswith(IDEMPOTENCY) for key in seen[0]), (
            f"{where}: its key was not in {seen[0]}"
        )
        extensions = first["errors"][0]["extensions"]
        assert (extensions["code"], extensions.get("outcome")) == ("UNAVAILABLE", "UNKNOWN"), (where, first)
        # Once the first attempt's time is over, the retry finds its write landed.
        monkeypatch.setattr(idempotency, "clock", lambda: time.time() + 3600)
        async with only_the_request(api):
            again = await api.post(op.document, variables, as_=op.viewer, headers=headers)
        monkeypatch.undo()
        extensions = again["errors"][0]["extensions"]
        assert (extensions["code"], extensions.get("outcome")) == ("CONFLICT", "APPLIED"), (where, again)
        await settled(api)
        assert _state(await api.snapshot()) == after_first, f"{where}: the retry applied something again"
        checked.append(where)
    assert checked, "no mutation wrote anything"
