"""Idempotency-Key on both engines: a retry answers the first result and
applies nothing twice; the same key with another request is refused; a key is
its person's own; the header and `extensions.idempotencyKey` are one key."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.api.conftest import Api
from tests.factories import family_with_members, settle, upload

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
