"""Drive the self-hosted GraphiQL page in headless Chromium (Debian's /usr/bin/chromium, via playwright).

GraphiQL 3 uses CodeMirror 5: each editor's ``.CodeMirror`` element carries its editor instance, which is
how the query / headers editors are filled and the response is read back in full (the DOM only holds the
lines that are on screen).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from playwright.async_api import Page, Request, Route, WebSocket, async_playwright
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
# URL schemes that never leave the browser.
LOCAL_SCHEMES = {"data", "blob", "about", "chrome", "chrome-extension", "devtools"}

QUERY_EDITOR = ".graphiql-query-editor .CodeMirror"
HEADERS_EDITOR = ".graphiql-editor-tool .graphiql-editor:not(.hidden) .CodeMirror"
RESPONSE_EDITOR = ".graphiql-response .CodeMirror"
RUN_BUTTON = ".graphiql-execute-button"


class ExternalRequestError(AssertionError):
    """The GraphiQL page tried to reach something other than localhost."""


def _is_local(url: str, allowed_hosts: set[str]) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    host = (parts.hostname or "").lower()
    return host in allowed_hosts or host.endswith(".localhost")


async def _set_editor(page: Page, selector: str, text: str) -> None:
    await page.locator(selector).first.wait_for(state="visible")
    await page.eval_on_selector(selector, "(el, text) => el.CodeMirror.setValue(text)", text)


async def _wait_query_parsed(page: Page) -> None:
    """GraphiQL re-parses the query editor 100 ms (debounced) after a change, and its fetcher picks HTTP
    vs WebSocket from that parsed document: clicking "run" too early would send a subscription over HTTP.
    A query that does not parse never matches, hence the short fallback timeout."""
    with contextlib.suppress(PlaywrightTimeoutError):
        await page.wait_for_function(
            """(sel) => {
                const cm = document.querySelector(sel).CodeMirror;
                const ast = cm.documentAST;
                return !!ast && !!ast.loc && ast.loc.source.body === cm.getValue();
            }""",
            arg=QUERY_EDITOR,
            timeout=2_000,
        )


@contextlib.asynccontextmanager
async def graphiql_page(base_url: str, *, timeout_ms: float = 30_000) -> AsyncIterator[Page]:
    """A page in a fresh headless Chromium (empty storage), for GraphiQL on ``base_url``.

    Raises ``ExternalRequestError`` if the page requested (or opened a WebSocket to) any non-localhost URL;
    such requests are aborted rather than sent. A failure inside the block names the page's own errors.
    """
    base_url = base_url.rstrip("/")
    allowed_hosts = LOCAL_HOSTS | {(urlsplit(base_url).hostname or "").lower()}
    external: list[str] = []
    page_errors: list[str] = []

    def on_request(request: Request) -> None:
        if not _is_local(request.url, allowed_hosts):
            external.append(request.url)

    def on_websocket(ws: WebSocket) -> None:
        if not _is_local(ws.url, allowed_hosts):
            external.append(ws.url)

    async def block_external(route: Route) -> None:
        if _is_local(route.request.url, allowed_hosts):
            await route.continue_()
        else:
            await route.abort("blockedbyclient")

    def check_external() -> None:
        if external:
            raise ExternalRequestError(
                "GraphiQL page tried to load non-localhost URLs: " + ", ".join(sorted(set(external)))
            )

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            context.set_default_timeout(timeout_ms)
            await context.route("**/*", block_external)
            page = await context.new_page()
            page.on("request", on_request)
            page.on("websocket", on_websocket)
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            try:
                yield page
            except Exception as exc:
                check_external()
                if page_errors:
                    raise AssertionError(f"GraphiQL failed; page errors: {page_errors}") from exc
                raise
            check_external()
        finally:
            await browser.close()


async def open_graphiql(page: Page, url: str) -> None:
    """Opens GraphiQL at ``url`` (``/graphql``, with or without parameters) and waits for its editors."""
    await page.goto(url, wait_until="load")
    await page.locator(QUERY_EDITOR).first.wait_for(state="visible")
    await page.locator(RUN_BUTTON).wait_for(state="visible")


async def editor_text(page: Page, selector: str) -> str:
    """The whole text of a CodeMirror editor (the query, headers or response editor)."""
    if selector == HEADERS_EDITOR and await page.locator(HEADERS_EDITOR).count() == 0:
        await page.get_by_role("button", name="Headers").click()
    await page.locator(selector).first.wait_for(state="visible")
    text: str = await page.eval_on_selector(selector, "el => el.CodeMirror.getValue()")
    return text


async def tab_titles(page: Page) -> list[str]:
    return [title.strip() for title in await page.locator(".graphiql-tab").all_inner_texts()]


async def run_and_read(page: Page, *, timeout_ms: float | None = None) -> str:
    """Clicks "run" on what the editors hold and returns the response pane's text once it has any."""
    await page.eval_on_selector(RESPONSE_EDITOR, "el => el.CodeMirror.setValue('')")
    await _wait_query_parsed(page)
    await page.locator(RUN_BUTTON).click()
    await page.wait_for_function(
        """(sel) => {
            const el = document.querySelector(sel);
            return !!el && !!el.CodeMirror && el.CodeMirror.getValue().trim().length > 0;
        }""",
        arg=RESPONSE_EDITOR,
        timeout=timeout_ms,
    )
    return await editor_text(page, RESPONSE_EDITOR)


async def run_graphiql_query(
    base_url: str,
    query: str,
    headers: dict[str, str],
    *,
    timeout_ms: float = 30_000,
    screenshot: str | None = None,
) -> str:
    """Open ``{base_url}/graphql`` in GraphiQL, run ``query`` with ``headers``, return the response pane text.

    ``screenshot``, if given, is a path to save a PNG of the page.
    """
    async with graphiql_page(base_url, timeout_ms=timeout_ms) as page:
        await open_graphiql(page, f"{base_url.rstrip('/')}/graphql")
        await _set_editor(page, QUERY_EDITOR, query)
        if await page.locator(HEADERS_EDITOR).count() == 0:
            await page.get_by_role("button", name="Headers").click()
        await _set_editor(page, HEADERS_EDITOR, json.dumps(headers, indent=2))
        text = await run_and_read(page)
        if screenshot:
            await page.screenshot(path=screenshot)
        return text
