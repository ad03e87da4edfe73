"""The baselines: a plain Starlette app with no GraphQL, served by uvicorn the
way app.py's `serve` does. POST /me and /feed make the same store calls as the
GraphQL queries and answer the same body; /ws is a bare WebSocket endpoint
speaking just enough graphql-transport-ws to hold subscribers, and POST
/broadcast sends them all one event, the payload our server would send.
Served by `python -m bench.serve_app --plain`, through app.py's own `_serve`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from bench.execution import feed_floor, me_floor
from resolvers.core.config import Settings
from resolvers.core.context import Context
from resolvers.runtime import compose
from store.blobs import LocalBlobStore


def create_plain_app(settings: Settings) -> Starlette:
    state: dict[str, Any] = {}
    subscribers: dict[WebSocket, str] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from store.sqlite import SqliteTable

        table = SqliteTable(settings.data_dir / "mifamilias.sqlite3")
        local = LocalBlobStore(settings.data_dir / "media", settings.base_url, b"plain")
        # The same services as the app (nothing started), for the same resolvers.
        async with contextlib.AsyncExitStack() as stack:
            state["services"] = await compose(settings, table, stack, local_blobs=local)
            try:
                yield
            finally:
                await table.close()

    async def context(request: Request) -> Context:
        ctx = Context(services=state["services"], request=request)
        await ctx.authenticate(request.headers.get("authorization"))
        return ctx

    async def me(request: Request) -> Response:
        await request.json()
        ctx = await context(request)
        return JSONResponse({"data": await me_floor(ctx)})

    async def feed(request: Request) -> Response:
        body = await request.json()
        ctx = await context(request)
        return JSONResponse({"data": await feed_floor(ctx, body["variables"]["id"])})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept(subprotocol="graphql-transport-ws")
        try:
            while True:
                message = json.loads(await websocket.receive_text())
                if message["type"] == "connection_init":
                    await websocket.send_text('{"type":"connection_ack"}')
                elif message["type"] == "subscribe":
                    subscribers[websocket] = message["id"]
                elif message["type"] == "ping":
                    await websocket.send_text('{"type":"pong"}')
        except WebSocketDisconnect:
            pass
        finally:
            subscribers.pop(websocket, None)

    async def broadcast(request: Request) -> Response:
        body = await request.json()
        started = time.time()
        for websocket, sub_id in list(subscribers.items()):
            event = {
                "id": sub_id,
                "type": "next",
                "payload": {
                    "data": {
                        "capsuleUnlocked": {
                            "capsule": {"id": body["capsuleId"], "status": "AVAILABLE"},
                            "unlockedAt": body["unlockedAt"],
                        }
                    }
                },
            }
            with contextlib.suppress(Exception):
                await websocket.send_text(json.dumps(event))
        return JSONResponse({"started": started, "sent": len(subscribers)})

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/me", me, methods=["POST"]),
            Route("/feed", feed, methods=["POST"]),
            Route("/broadcast", broadcast, methods=["POST"]),
            WebSocketRoute("/ws", ws),
        ],
        lifespan=lifespan,
    )

    async def going_away() -> None:
        """app.py's `_serve` runs the app's shutdown steps; the baseline has none."""

    app.state.going_away = going_away
    return app
