"""Persisted operations in process, on both engines, counted through the port:
automatic persisted queries (what is stored, when, for how long, and what a hit
costs) and trusted documents (what runs, what is refused, introspection)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.core.persisted import TTL
from store import keys
from tests.api.conftest import Api, answer, dump, running_api

pytestmark = pytest.mark.usefixtures("turns_without_time")

ME = "query Me { me { id } }"
TYPENAME = "{ __typename }"
INTROSPECTION = "{ __schema { queryType { name } } }"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def persisted(hash_: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": hash_}}


async def send(
    api: Api,
    *,
    query: str | None = None,
    hash_: str | None = None,
    as_: str | None = "ana",
    method: str = "POST",
    variables: dict[str, Any] | None = None,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api.token(as_)}"} if as_ else {}
    body: dict[str, Any] = {}
    if query is not None:
        body["query"] = query
    if hash_ is not None:
        body["extensions"] = persisted(hash_)
    if variables is not None:
        body["variables"] = variables
    if method == "GET":
        # What a CDN sees: every part in the URL, JSON-encoded; Accept as curl sends it.
        params = {
            name: value if isinstance(value, str) else json.dumps(value) for name, value in body.items()
        }
        return await api.client.get("/graphql", params=params, headers={**headers, "Accept": "*/*"})
    return await api.client.post("/graphql", json=body, headers=headers)


def code_of(response: httpx.Response) -> str:
    return str(response.json()["errors"][0]["extensions"]["code"])


async def stored(api: Api) -> dict[str, dict[str, Any]]:
    return {
        pk.split("#", 1)[1]: item
        for (pk, _), item in (await dump(api.table)).items()
        if pk.startswith("PERSISTED#")
    }


# Automatic persisted queries ------------------------------------------------------------


def document_calls(api: Api, kind: str) -> int:
    """Store calls of this kind that touched a persisted document since the last
    reset (background jobs, such as the scheduler reading and moving its
    checkpoint, touch other items meanwhile)."""
    trace = api.table.trace  # type: ignore[attr-defined]
    return sum(1 for _, call, what in trace if call == kind and "PERSISTED#" in what)


async def test_a_hash_registers_once_then_runs_alone_from_the_cache(api: Api) -> None:
    await api.sign_in("ana")
    unknown = await send(api, hash_=sha(ME))
    assert unknown.status_code == 200
    assert unknown.json()["errors"][0]["message"] == "PersistedQueryNotFound"
    assert code_of(unknown) == "PERSISTED_QUERY_NOT_FOUND"

    registered = await send(api, query=ME, hash_=sha(ME))
    assert answer(registered) == {"data": {"me": {"id": "ana"}}}
    document = (await stored(api))[sha(ME)]
    assert document["body"] == ME
    assert document["expiresAt"] == int(api.clock.moment.timestamp()) + int(TTL.total_seconds())

    api.table.reset()  # type: ignore[attr-defined]
    for _ in range(3):
        assert answer(await send(api, hash_=sha(ME))) == {"data": {"me": {"id": "ana"}}}
    assert document_calls(api, "get") == 0
    assert document_calls(api, "put") == 0


async def test_another_process_finds_the_document_in_the_table_once(api: Api) -> None:
    await api.sign_in("ana")
    await send(api, query=TYPENAME, hash_=sha(TYPENAME))
    api.services.persisted._cache.clear()  # as a process that has not seen it
    api.table.reset()  # type: ignore[attr-defined]
    for _ in range(3):
        assert answer(await send(api, hash_=sha(TYPENAME))) == {"data": {"__typename": "Query"}}
    assert document_calls(api, "get") == 1
    assert document_calls(api, "batch_get") == 0


async def test_a_hash_that_is_not_the_querys_is_refused_and_nothing_is_stored(api: Api) -> None:
    await api.sign_in("ana")
    response = await send(api, query=ME, hash_=sha(TYPENAME))
    assert response.status_code == 400
    assert code_of(response) == "BAD_USER_INPUT"
    assert response.json()["errors"][0]["message"] == "provided sha does not match query"
    assert sha(TYPENAME) not in await stored(api) and sha(ME) not in await stored(api)


async def test_a_malformed_persisted_query_is_bad_input(api: Api) -> None:
    for extensions in (
        {"persistedQuery": {"version": 2, "sha256Hash": sha(ME)}},
        {"persistedQuery": {"version": 1}},
        {"persistedQuery": "abc"},
    ):
        response = await api.client.post(
            "/graphql",
            json={"extensions": extensions},
            headers={"Authorization": f"Bearer {api.token('ana')}"},
        )
        assert response.status_code == 400 and code_of(response) == "BAD_USER_INPUT", response.text
    response = await send(api, hash_="PERSISTED#x")
    assert response.status_code == 400 and code_of(response) == "BAD_USER_INPUT"


async def test_only_operations_that_pass_every_check_are_stored(api: Api) -> None:
    invalid = "{ me { nope } }"
    costly = '{ family(id: "x") { feed(first: 100) { edges { node { comments(first: 100) { edges { node { id } } } } } } } }'
    assert code_of(await send(api, query=invalid, hash_=sha(invalid))) == "BAD_USER_INPUT"
    refused = await send(api, query=costly, hash_=sha(costly))
    assert code_of(refused) == "BAD_USER_INPUT" and "cost" in refused.json()["errors"][0]["extensions"]
    # Signed out: refused, and even introspection, which runs, is not stored.
    assert code_of(await send(api, query=ME, hash_=sha(ME), as_=None)) == "UNAUTHENTICATED"
    anonymous = await send(api, query=TYPENAME, hash_=sha(TYPENAME), as_=None)
    assert answer(anonymous) == {"data": {"__typename": "Query"}}
    assert await stored(api) == {}
    assert code_of(await send(api, hash_=sha(TYPENAME), as_=None)) == "UNAUTHENTICATED"


async def test_a_bare_hash_without_a_token_tells_nothing(api: Api) -> None:
    """Whether anyone has run a document or not, a hash alone without a token
    answers UNAUTHENTICATED, and reads nothing."""
    await api.sign_in("ana")
    await send(api, query=ME, hash_=sha(ME))
    api.table.reset()  # type: ignore[attr-defined]
    known = await send(api, hash_=sha(ME), as_=None)
    unknown = await send(api, hash_=sha("{ me { givenName } }"), as_=None)
    assert code_of(known) == code_of(unknown) == "UNAUTHENTICATED"
    assert (known.status_code, known.json()) == (unknown.status_code, unknown.json())
    assert document_calls(api, "get") == 0


async def test_a_megabyte_persisted_document_is_refused_and_not_stored(api: Api) -> None:
    await api.sign_in("ana")
    big = "{ me { id } }\n#" + "x" * 1_000_000
    response = await send(api, query=big, hash_=sha(big))
    assert code_of(response) == "BAD_USER_INPUT"
    assert "at most 16384 characters" in response.json()["errors"][0]["message"]
    assert await stored(api) == {}


async def test_a_person_stores_a_bounded_number_of_documents(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async with running_api("sqlite", "local", tmp_path, request, rate_limits="persist=2/86400") as api:
        await api.sign_in("ana")
        texts = [f"{{ me {{ id }} a{n}: __typename }}" for n in range(3)]
        for text in texts:
            assert "errors" not in (await send(api, query=text, hash_=sha(text))).json()
        assert set(await stored(api)) == {sha(texts[0]), sha(texts[1])}
        # The third ran, and was not kept: its hash alone is unknown.
        assert code_of(await send(api, hash_=sha(texts[2]))) == "PERSISTED_QUERY_NOT_FOUND"


async def test_documents_without_a_token_leave_the_parse_and_validation_caches_unchanged(api: Api) -> None:
    from schema.documents import documents

    await api.sign_in("ana")
    before = (len(documents), documents.weight)
    for n in range(30):
        await api.client.post("/graphql", json={"query": f"{{ __typename n{n}: __typename }}"})
        await api.client.post("/graphql", json={"query": f"{{ me {{ id }} n{n}: __typename }}"})
        await api.client.post(
            "/graphql",
            json={"query": f"{{ me {{ id }} n{n}: __typename }}"},
            headers={"Authorization": "Bearer not-a-token"},
        )
    assert (len(documents), documents.weight) == before
    # A signed-in request's document is kept.
    alias = f"k{uuid.uuid4().hex}"  # a text new to this process
    text = f"{{ me {{ id }} {alias}: __typename }}"
    sent = await send(api, query=text)
    assert answer(sent) == {"data": {"me": {"id": "ana"}, alias: "Query"}}, sent.text
    assert len(documents) == min(before[0] + 1, documents.max_entries)
    assert any(key[0] == text for key in documents)


async def test_a_persisted_document_still_meets_sign_in(api: Api) -> None:
    await send(api, query=ME, hash_=sha(ME))
    assert code_of(await send(api, hash_=sha(ME), as_=None)) == "UNAUTHENTICATED"


async def test_get_runs_a_hash_and_still_refuses_mutations(api: Api) -> None:
    await api.sign_in("ana")
    query = "query Who($email: Boolean!) { me { id email @include(if: $email) } }"
    assert (await send(api, query=query, hash_=sha(query))).status_code == 200
    got = await send(api, hash_=sha(query), method="GET", variables={"email": False})
    assert got.status_code == 200 and answer(got) == {"data": {"me": {"id": "ana"}}}

    mutation = "mutation { markNotificationsRead }"
    assert answer(await send(api, query=mutation, hash_=sha(mutation))) == {
        "data": {"markNotificationsRead": 0}
    }
    assert sha(mutation) in await stored(api)
    before = await dump(api.table)
    refused = await send(api, hash_=sha(mutation), method="GET")
    assert refused.status_code in (400, 405), refused.text
    assert "errors" in refused.json()
    assert await dump(api.table) == before


async def test_a_document_in_use_is_rewritten_weekly_and_an_unused_one_expires(api: Api) -> None:
    await api.sign_in("ana")
    await send(api, query=ME, hash_=sha(ME))
    first = (await stored(api))[sha(ME)]["expiresAt"]
    api.clock.advance(days=6)
    api.table.reset()  # type: ignore[attr-defined]
    await send(api, hash_=sha(ME))
    assert document_calls(api, "put") == 0
    api.clock.advance(days=2)
    await send(api, hash_=sha(ME))
    assert document_calls(api, "put") == 1
    assert (await stored(api))[sha(ME)]["expiresAt"] > first

    api.clock.advance(days=31)
    api.services.persisted._cache.clear()
    assert code_of(await send(api, hash_=sha(ME))) == "PERSISTED_QUERY_NOT_FOUND"


async def test_a_store_that_does_not_answer_is_a_clean_internal_error(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(key: Any) -> None:
        raise ConnectionError("the store is down")

    monkeypatch.setattr(api.services.persisted.table, "get", down)
    response = await send(api, hash_=sha(ME))
    assert response.status_code == 500
    error = response.json()["errors"][0]
    assert error["extensions"]["code"] == "INTERNAL_SERVER_ERROR" and "requestId" in error["extensions"]
    assert "store is down" not in response.text


# Trusted documents ----------------------------------------------------------------------


def apollo_manifest(*bodies: str) -> dict[str, Any]:
    return {
        "format": "apollo-persisted-query-manifest",
        "version": 1,
        "operations": [{"id": sha(body), "body": body, "name": "Op", "type": "query"} for body in bodies],
    }


def relay_manifest(*bodies: str) -> dict[str, Any]:
    # Relay's default ids are MD5 hashes of the text.
    return {hashlib.md5(body.encode()).hexdigest(): body for body in bodies}


@pytest.fixture(params=["apollo", "relay"])
async def trusted(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Api, dict[str, str]]]:
    """The app on SQLite with a manifest listing ME; and the ids it lists."""
    manifest = (apollo_manifest if request.param == "apollo" else relay_manifest)(ME)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    pairs = (
        [(op["id"], op["body"]) for op in manifest["operations"]]
        if "operations" in manifest
        else manifest.items()
    )
    ids = {body: id_ for id_, body in pairs}
    async with running_api("sqlite", "local", tmp_path, request, trusted_documents=path) as app:
        yield app, ids


async def test_trusted_documents_run_listed_operations_only(trusted: tuple[Api, dict[str, str]]) -> None:
    api, ids = trusted
    assert answer(await send(api, hash_=ids[ME])) == {"data": {"me": {"id": "ana"}}}
    assert answer(await send(api, query=ME)) == {"data": {"me": {"id": "ana"}}}
    assert answer(await send(api, hash_=sha(ME))) == {"data": {"me": {"id": "ana"}}}
    assert answer(await send(api, hash_=ids[ME], method="GET")) == {"data": {"me": {"id": "ana"}}}

    other = "{ me { id email } }"
    for response in (
        await send(api, query=other),
        await send(api, query=other, hash_=sha(other)),
        await send(api, hash_=sha(other)),
        await send(api, query=INTROSPECTION),
    ):
        assert code_of(response) == "PERSISTED_QUERY_NOT_IN_LIST", response.text
    assert await stored(api) == {}


async def test_introspection_and_graphiql_are_off_with_trusted_documents(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(apollo_manifest(ME, INTROSPECTION)))
    async with running_api("sqlite", "local", tmp_path, request, trusted_documents=path) as api:
        # Even listed, introspection is refused; __typename is not introspection.
        response = await send(api, hash_=sha(INTROSPECTION))
        assert (
            code_of(response) == "BAD_USER_INPUT"
            and "introspection" in response.json()["errors"][0]["message"]
        )
        page = await api.client.get("/graphql", headers={"Accept": "text/html"})
        assert page.status_code == 404


async def test_introspection_can_be_allowed_with_trusted_documents(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(relay_manifest(ME)))
    async with running_api(
        "sqlite", "local", tmp_path, request, trusted_documents=path, allow_introspection=True
    ) as api:
        response = await send(api, query=INTROSPECTION, as_=None)
        assert answer(response) == {"data": {"__schema": {"queryType": {"name": "Query"}}}}
        assert code_of(await send(api, query="{ me { id email } }")) == "PERSISTED_QUERY_NOT_IN_LIST"
        page = await api.client.get("/graphql", headers={"Accept": "text/html"})
        assert page.status_code == 200


async def test_introspection_can_be_turned_off_without_trusted_documents(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with running_api("sqlite", "local", tmp_path, request, allow_introspection=False) as api:
        assert code_of(await send(api, query=INTROSPECTION, as_=None)) == "BAD_USER_INPUT"
        assert answer(await send(api, query=TYPENAME, as_=None)) == {"data": {"__typename": "Query"}}


async def test_a_bad_manifest_stops_the_start(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"format": "apollo-persisted-query-manifest", "version": 2, "operations": []}))
    with pytest.raises(ValueError, match="MIFAMILIAS_TRUSTED_DOCUMENTS"):
        async with running_api("sqlite", "local", tmp_path, request, trusted_documents=path):
            pass


def test_the_persisted_key_is_built_in_keys() -> None:
    assert keys.persisted_document(sha(ME)) == (f"PERSISTED#{sha(ME)}", "DOC")


def varies(response: httpx.Response) -> set[str]:
    """What a cache must key the answer by (CORS adds Origin where it applies)."""
    return {name.strip() for name in response.headers["vary"].split(",")}


async def test_get_answers_are_private_unless_they_read_nothing_personal(api: Api) -> None:
    await api.sign_in("ana")
    personal = await send(api, query=ME, method="GET")
    assert answer(personal) == {"data": {"me": {"id": "ana"}}}
    assert personal.headers["cache-control"] == "private, no-store"
    assert "Authorization" in varies(personal)
    await send(api, query=ME, hash_=sha(ME))
    by_hash = await send(api, hash_=sha(ME), method="GET")
    assert by_hash.headers["cache-control"] == "private, no-store"
    # Introspection is the same for everyone: a cache may keep it, per token.
    schema_only = await send(api, query=INTROSPECTION, method="GET")
    assert "data" in schema_only.json()
    assert "cache-control" not in schema_only.headers and "Authorization" in varies(schema_only)
    # POST is not cached on the way: nothing to say.
    assert "cache-control" not in (await send(api, query=ME)).headers
