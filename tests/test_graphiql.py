"""GraphiQL in a real headless Chromium, served entirely by the app; and its example tabs."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
from graphql import DocumentNode, OperationDefinitionNode, parse, print_ast, validate

from schema import schema
from schema.graphiql import DEFAULT_QUERY, EXAMPLES
from schema.strawberry_internals import core_schema
from tests.browser import (
    HEADERS_EDITOR,
    QUERY_EDITOR,
    editor_text,
    graphiql_page,
    open_graphiql,
    run_and_read,
    run_graphiql_query,
    tab_titles,
)
from tests.servers import ROOT, ServerProcess, token, without_cost

ME = "query Me {\n  me { id givenName }\n  myFamilies { role family { name } }\n}\n"
# GraphiQL's own WebSocket client retried a refused socket for about half a minute before it
# showed anything; an answer must come well before that.
REFUSAL_MS = 10_000


def link(server: ServerProcess, **parameters: str) -> str:
    return f"{server.url}/graphql?" + urlencode(parameters, quote_via=quote)


async def test_graphiql_runs_a_query_with_an_authorization_header(live_server: ServerProcess) -> None:
    text = await run_graphiql_query(
        live_server.url, "{ me { id } }", {"Authorization": f"Bearer {token('gia')}"}
    )
    assert without_cost(json.loads(text)) == {"data": {"me": {"id": "gia"}}}


async def test_graphiql_page_loads_nothing_from_a_cdn(live_server: ServerProcess) -> None:
    async with httpx.AsyncClient() as client:
        page = await client.get(f"{live_server.url}/graphql", headers={"Accept": "text/html"})
    assert page.status_code == 200
    assert "MiFamilias API" in page.text
    assert "unpkg.com" not in page.text and "cdn." not in page.text and "esm.sh" not in page.text


async def test_a_get_with_a_query_parameter_still_runs_it_for_api_clients(live_server: ServerProcess) -> None:
    async with httpx.AsyncClient() as client:
        answer = await client.get(
            f"{live_server.url}/graphql",
            params={"query": "{ me { id } }"},
            headers={"Accept": "application/json", "Authorization": f"Bearer {token('gia')}"},
        )
        page = await client.get(
            f"{live_server.url}/graphql", params={"query": "{ me { id } }"}, headers={"Accept": "text/html"}
        )
    assert without_cost(answer.json()) == {"data": {"me": {"id": "gia"}}}
    assert "MiFamilias API" in page.text


async def test_a_link_opens_with_its_headers_and_query_and_runs_with_no_typing(
    live_server: ServerProcess, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {token('hugo')}"}
    async with graphiql_page(live_server.url) as page:
        await open_graphiql(page, link(live_server, headers=json.dumps(headers), query=ME))
        assert await editor_text(page, QUERY_EDITOR) == ME
        assert json.loads(await editor_text(page, HEADERS_EDITOR)) == headers
        answer = json.loads(await run_and_read(page))
        await page.screenshot(path=str(tmp_path / "link.png"))
        assert without_cost(answer) == {"data": {"me": {"id": "hugo", "givenName": "Hugo"}, "myFamilies": []}}
        # Every example tab carries the link's headers too.
        titles = await tab_titles(page)
        await page.locator(".graphiql-tab").nth(len(titles) - 1).click()
        assert json.loads(await editor_text(page, HEADERS_EDITOR)) == headers


async def test_without_parameters_the_page_opens_on_the_welcome_query_and_the_examples(
    live_server: ServerProcess, tmp_path: Path
) -> None:
    async with graphiql_page(live_server.url) as page:
        await open_graphiql(page, f"{live_server.url}/graphql")
        query = await editor_text(page, QUERY_EDITOR)
        headers = await editor_text(page, HEADERS_EDITOR)
        titles = await tab_titles(page)
        await page.screenshot(path=str(tmp_path / "welcome.png"))
    assert query == DEFAULT_QUERY
    comments = "\n".join(line for line in query.splitlines() if line.startswith("#"))
    for hint in ('{"Authorization": "Bearer <token>"}', "Headers tab", "./dev app token <id>", "./dev demo"):
        assert hint in comments
    assert json.loads(headers) == {"Authorization": "Bearer <token>"}
    assert titles == ["Me", *(first_operation_name(parse(example.query)) for example in EXAMPLES)]


async def test_a_bad_token_shows_the_error_answer(live_server: ServerProcess, tmp_path: Path) -> None:
    headers = json.dumps({"Authorization": "Bearer not-a-token"})
    async with graphiql_page(live_server.url) as page:
        await open_graphiql(page, link(live_server, headers=headers, query="{ me { id } }"))
        over_http = json.loads(await run_and_read(page, timeout_ms=REFUSAL_MS))
        await open_graphiql(
            page, link(live_server, headers=headers, query="subscription { capsuleUnlocked { unlockedAt } }")
        )
        over_socket = json.loads(await run_and_read(page, timeout_ms=REFUSAL_MS))
        await page.screenshot(path=str(tmp_path / "refused.png"))
    assert over_http["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    assert over_socket["errors"][0]["extensions"]["closeCode"] == 4403
    assert "Headers tab" in over_socket["errors"][0]["message"]


async def test_a_subscription_streams_from_the_page(live_server: ServerProcess) -> None:
    """The page's own WebSocket client: the first event of contentStatusChanged is the status now."""
    auth = {"Authorization": f"Bearer {token('iris')}"}
    content_id = await uploading_note(live_server, auth)
    query = f'subscription {{ contentStatusChanged(contentId: "{content_id}") {{ id status }} }}'
    async with graphiql_page(live_server.url) as page:
        await open_graphiql(page, link(live_server, headers=json.dumps(auth), query=query))
        answer = json.loads(await run_and_read(page))
    assert answer == {"data": {"contentStatusChanged": {"id": content_id, "status": "UPLOADING"}}}


async def uploading_note(server: ServerProcess, auth: dict[str, str]) -> str:
    async with httpx.AsyncClient(base_url=server.url, headers=auth) as client:

        async def run(query: str, **variables: Any) -> Any:
            body = (await client.post("/graphql", json={"query": query, "variables": variables})).json()
            assert "errors" not in body, body
            return body["data"]

        family = await run('mutation { createFamily(input: {name: "Página"}) { id } }')
        created = await run(
            'mutation($f: ID!) { createUpload(input: {familyId: $f, type: TEXT, mimeType: "text/plain",'
            " sizeBytes: 4}) { content { id } } }",
            f=family["createFamily"]["id"],
        )
    return str(created["createUpload"]["content"]["id"])


# The example tabs -------------------------------------------------------------------------------


def operations(document: DocumentNode) -> list[OperationDefinitionNode]:
    return [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]


def first_operation_name(document: DocumentNode) -> str:
    name = operations(document)[0].name
    assert name is not None
    return name.value


def unnamed(operation: OperationDefinitionNode) -> str:
    """The operation as text, without its name: the tabs name what the guide leaves anonymous."""
    return print_ast(dataclasses.replace(operation, name=None))


def test_every_example_tab_validates_against_the_schema() -> None:
    assert EXAMPLES
    for example in EXAMPLES:
        document = parse(example.query)
        assert validate(core_schema(schema), document) == [], example.query
        assert all(operation.name for operation in operations(document)), "a tab's title is its first name"


def test_the_readme_examples_are_the_example_tabs() -> None:
    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    section = guide[guide.index("\n## Example operations\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```graphql\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "the guide has no ```graphql block"
    in_readme = [unnamed(op) for block in blocks for op in operations(parse(block))]
    in_tabs = [unnamed(op) for example in EXAMPLES for op in operations(parse(example.query))]
    # One list (schema/graphiql.py's EXAMPLES); when the guide changes, the tabs change with it.
    assert in_readme == in_tabs
