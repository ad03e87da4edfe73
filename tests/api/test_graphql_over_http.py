"""GraphQL over HTTP, as the GraphQL foundation's spec has it: the media type
`application/graphql-response+json` when the client accepts it, and then a
request error (the document does not parse or validate, the variables do not
coerce, the operation is refused before it runs) answered 4xx with no `data`,
while a field's error keeps 200 and its `data`. A client asking for
`application/json` (or nothing) keeps the legacy answer, 200 with `data: null`.
graphql-http's own audit runs against a server process in
tests/test_graphql_http_js.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.conftest import Api, answer

GRAPHQL_RESPONSE = "application/graphql-response+json"


async def send(
    api: Api, body: dict[str, Any], accept: str | None, *, as_: str | None = "ana"
) -> httpx.Response:
    headers = {} if accept is None else {"Accept": accept}
    if as_ is not None:
        headers["Authorization"] = f"Bearer {api.token(as_)}"
    return await api.client.post("/graphql", json=body, headers=headers)


REQUEST_ERRORS = [
    pytest.param({"query": "{ me { id "}, 400, id="does-not-parse"),
    pytest.param({"query": "{ me { nope } }"}, 400, id="does-not-validate"),
    pytest.param(
        {"query": "query($id: ID!) { family(id: $id) { id } }", "variables": {"id": {"not": "an id"}}},
        400,
        id="variables-do-not-coerce",
    ),
    pytest.param({"query": "query($id: ID!) { family(id: $id) { id } }"}, 400, id="variable-missing"),
]


@pytest.mark.parametrize(("body", "status"), REQUEST_ERRORS)
async def test_a_request_error_is_4xx_without_data_in_graphql_response_json(
    api: Api, body: dict[str, Any], status: int
) -> None:
    response = await send(api, body, GRAPHQL_RESPONSE)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == GRAPHQL_RESPONSE
    answer = response.json()
    assert "data" not in answer and answer["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"


@pytest.mark.parametrize(("body", "status"), REQUEST_ERRORS)
async def test_a_request_error_keeps_the_legacy_answer_in_application_json(
    api: Api, body: dict[str, Any], status: int
) -> None:
    for accept in (None, "application/json", f"{GRAPHQL_RESPONSE};q=0.5, application/json"):
        response = await send(api, body, accept)
        assert response.status_code == 200, (accept, response.text)
        assert response.headers["content-type"] == "application/json"
        assert response.json()["data"] is None


async def test_an_unsigned_request_is_401_without_data_in_graphql_response_json(api: Api) -> None:
    response = await send(api, {"query": "{ me { id } }"}, GRAPHQL_RESPONSE, as_=None)
    assert response.status_code == 401 and response.headers["content-type"] == GRAPHQL_RESPONSE
    answer = response.json()
    assert "data" not in answer and answer["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_a_field_error_keeps_200_and_its_data_in_graphql_response_json(api: Api) -> None:
    await api.sign_in("ana")
    response = await send(
        api, {"query": '{ me { id } family(id: "no-such-family") { id } }'}, GRAPHQL_RESPONSE
    )
    assert response.status_code == 200 and response.headers["content-type"] == GRAPHQL_RESPONSE
    answer = response.json()
    assert answer["data"] == {"me": {"id": "ana"}, "family": None}
    assert answer["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    assert answer["errors"][0]["path"] == ["family"]


async def test_the_preferred_media_type_is_the_one_answered(api: Api) -> None:
    query = {"query": "{ me { id } }"}
    cases = {
        f"{GRAPHQL_RESPONSE}, application/json;q=0.9": GRAPHQL_RESPONSE,
        f"application/json, {GRAPHQL_RESPONSE}": "application/json",
        f"application/json;q=0.1, {GRAPHQL_RESPONSE};q=0.8": GRAPHQL_RESPONSE,
        "*/*": "application/json",
        f"{GRAPHQL_RESPONSE};q=0, application/json": "application/json",
    }
    for accept, answered in cases.items():
        response = await send(api, query, accept)
        assert response.status_code == 200, response.text
        assert (response.headers["content-type"], answer(response)) == (
            answered,
            {"data": {"me": {"id": "ana"}}},
        )


async def test_a_refusal_of_the_transport_takes_the_media_type_too(api: Api) -> None:
    response = await api.client.post(
        "/graphql",
        content=b"[1, 2]",
        headers={"Content-Type": "application/json", "Accept": GRAPHQL_RESPONSE},
    )
    assert response.status_code == 400 and response.headers["content-type"] == GRAPHQL_RESPONSE
    assert "data" not in response.json()


@pytest.mark.parametrize("name", [{"an": "object"}, ["a", "list"], 7], ids=["object", "list", "number"])
async def test_an_operation_name_that_is_not_a_string_is_a_request_error(api: Api, name: object) -> None:
    for query in ("{ me { id } }", "mutation { completeOnboarding { id } }"):
        response = await send(api, {"query": query, "operationName": name}, GRAPHQL_RESPONSE)
        assert response.status_code == 400, response.text
        assert "data" not in response.json()
