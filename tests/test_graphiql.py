"""GraphiQL in a real headless Chromium, served entirely by the app."""

from __future__ import annotations

import json

import httpx

from resolvers.core.auth import mint_token
from tests.browser import run_graphiql_query
from tests.servers import SECRET, ServerProcess


async def test_graphiql_runs_a_query_with_an_authorization_header(live_server: ServerProcess) -> None:
    token = mint_token(SECRET, "gia", given_name="Gia")
    text = await run_graphiql_query(live_server.url, "{ me { id } }", {"Authorization": f"Bearer {token}"})
    assert json.loads(text) == {"data": {"me": {"id": "gia"}}}


async def test_graphiql_page_loads_nothing_from_a_cdn(live_server: ServerProcess) -> None:
    async with httpx.AsyncClient() as client:
        page = await client.get(f"{live_server.url}/graphql", headers={"Accept": "text/html"})
    assert page.status_code == 200
    assert "MiFamilias API" in page.text
    assert "unpkg.com" not in page.text and "cdn." not in page.text and "esm.sh" not in page.text
