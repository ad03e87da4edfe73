"""Web pages on other origins: by default any may call the API (CORS with the
headers frontends send, trace context included); `ALLOWED_ORIGINS` narrows
that, and then WebSockets are checked against the same list. Against real
server processes, with preflights as browsers send them and with a real
Chromium page on another origin."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from playwright.async_api import async_playwright
from websockets.typing import Subprotocol

from tests.browser import CHROMIUM, CHROMIUM_ARGS
from tests.servers import SECRET, ServerProcess, free_port, token

APP = "http://app.example"
DEV_SERVER = "http://localhost:3000"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FRONTEND_HEADERS = (
    "authorization, content-type, idempotency-key, traceparent, tracestate, baggage, "
    "apollo-require-preflight, x-apollo-operation-name"
)
TRANSPORT_WS = [Subprotocol("graphql-transport-ws")]


@pytest.fixture(scope="module")
def narrowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("narrowed"),
        {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_ALLOWED_ORIGINS": APP},
    ).start()
    try:
        yield server
    finally:
        server.stop()


async def preflight(server: ServerProcess, origin: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.options(
            f"{server.url}/graphql",
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": FRONTEND_HEADERS,
            },
        )


async def me_from(server: ServerProcess, origin: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(
            f"{server.url}/graphql",
            json={"query": "{ me { id } }"},
            headers={"Origin": origin, "Authorization": f"Bearer {token('ana')}", "traceparent": TRACEPARENT},
        )


async def acknowledged(socket: websockets.ClientConnection) -> bool:
    init = {"type": "connection_init", "payload": {"Authorization": f"Bearer {token('ana')}"}}
    await socket.send(json.dumps(init))
    return json.loads(await socket.recv())["type"] == "connection_ack"


async def test_any_origin_may_call_the_api_by_default(live_server: ServerProcess) -> None:
    answer = await preflight(live_server, DEV_SERVER)
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == "*"
    allowed = {name.strip() for name in answer.headers["access-control-allow-headers"].lower().split(",")}
    assert {name.strip() for name in FRONTEND_HEADERS.split(",")} <= allowed
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert int(answer.headers["access-control-max-age"]) >= 600  # preflights are cached
    called = await me_from(live_server, DEV_SERVER)
    assert called.json()["data"] == {"me": {"id": "ana"}}
    assert called.headers["access-control-allow-origin"] == "*"
    # A page may read when to retry; nothing tells a browser to send cookies.
    assert "retry-after" in called.headers["access-control-expose-headers"].lower()
    assert "access-control-allow-credentials" not in called.headers


async def test_a_page_anywhere_may_subscribe_by_default(live_server: ServerProcess) -> None:
    async with websockets.connect(
        live_server.ws_url, subprotocols=TRANSPORT_WS, origin=websockets.Origin(DEV_SERVER)
    ) as socket:
        assert await acknowledged(socket)


async def test_named_origins_narrow_http_and_websockets(narrowed: ServerProcess) -> None:
    assert (await preflight(narrowed, APP)).headers["access-control-allow-origin"] == APP
    refused = await preflight(narrowed, DEV_SERVER)
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    assert "access-control-allow-origin" not in (await me_from(narrowed, DEV_SERVER)).headers
    with pytest.raises(websockets.InvalidStatus) as handshake:
        async with websockets.connect(
            narrowed.ws_url, subprotocols=TRANSPORT_WS, origin=websockets.Origin(DEV_SERVER)
        ):
            pass
    assert handshake.value.response.status_code == 403
    # A named origin, and a client that is no page at all (no Origin), are let in.
    for origin in (websockets.Origin(APP), None):
        async with websockets.connect(narrowed.ws_url, subprotocols=TRANSPORT_WS, origin=origin) as socket:
            assert await acknowledged(socket)


@pytest.fixture
def page_origin(tmp_path: Path) -> Iterator[str]:
    """An empty page served from an origin of its own (another port)."""
    (tmp_path / "index.html").write_text("<!doctype html><title>app</title>")
    handler = type(
        "Quiet",
        (http.server.SimpleHTTPRequestHandler,),
        {"log_message": lambda *_: None, "__init__": _serving(tmp_path)},
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _serving(directory: Path) -> Any:
    def __init__(self: http.server.SimpleHTTPRequestHandler, *args: Any, **kwargs: Any) -> None:
        http.server.SimpleHTTPRequestHandler.__init__(self, *args, directory=str(directory), **kwargs)

    return __init__


FETCH = """async ([url, token, traceparent]) => {
    try {
        const answer = await fetch(url, {
            method: "POST",
            headers: {"Content-Type": "application/json", "Authorization": "Bearer " + token,
                      "traceparent": traceparent, "apollo-require-preflight": "true"},
            body: JSON.stringify({query: "{ me { id } }"}),
        });
        return {status: answer.status, body: await answer.json()};
    } catch (error) {
        return {failed: String(error)};
    }
}"""


async def test_a_chromium_page_on_another_origin_calls_the_api(
    live_server: ServerProcess, narrowed: ServerProcess, page_origin: str
) -> None:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{page_origin}/index.html")
            called = await page.evaluate(FETCH, [f"{live_server.url}/graphql", token("ana"), TRACEPARENT])
            assert called["status"] == 200 and called["body"]["data"] == {"me": {"id": "ana"}}, called
            # Where only another origin is named, the browser keeps the answer from the page.
            kept = await page.evaluate(FETCH, [f"{narrowed.url}/graphql", token("ana"), TRACEPARENT])
            assert "failed" in kept, kept
        finally:
            await browser.close()
