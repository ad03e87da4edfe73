"""MiFamilias API: the Starlette app and its command line.

python app.py [serve]            start the server (embedded store by default)
python app.py token USER_ID      print a development token
python app.py create-table       create the DynamoDB table (safe to run twice)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from resolvers.adapters.media_http import media_routes
from resolvers.core.auth import mint_token
from resolvers.core.config import ConfigError, Settings
from resolvers.core.context import Services, utc_now
from resolvers.runtime import compose, start_background
from schema.graphiql import STATIC_DIR
from schema.transport import MiFamiliasGraphQL
from store.blobs import LocalBlobStore
from store.port import Table

log = logging.getLogger("mifamilias")


@dataclass
class AppState:
    settings: Settings
    services: Services | None = None


async def _open_table(settings: Settings, stack: contextlib.AsyncExitStack) -> Table:
    if settings.uses_dynamodb:
        from store.dynamodb import open_dynamo_table

        return await stack.enter_async_context(
            open_dynamo_table(settings.table_name, settings.dynamodb_endpoint, settings.region)
        )
    from store.sqlite import SqliteTable

    table = SqliteTable(settings.data_dir / "mifamilias.sqlite3")
    stack.push_async_callback(table.close)
    return table


def create_app(
    settings: Settings | None = None,
    *,
    table: Table | None = None,
    clock: Callable[[], datetime] = utc_now,
    wrap_table: Callable[[Table], Table] | None = None,
) -> Starlette:
    settings = settings or Settings.from_env()
    state = AppState(settings)

    def services() -> Services:
        if state.services is None:
            raise RuntimeError("the app has not started")
        return state.services

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            store = table if table is not None else await _open_table(settings, stack)
            if wrap_table is not None:
                store = wrap_table(store)
            state.services = await compose(settings, store, stack, local_blobs=local_blobs, clock=clock)
            app.state.services = state.services
            await start_background(state.services, stack)
            # What exists now lives as long as the process: keep the collector
            # from walking it again on every full collection.
            gc.freeze()
            yield
        state.services = None

    async def healthz(request: Request) -> Response:
        try:
            await services().table.ping()
        except Exception:
            log.exception("health check: the store does not answer")
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    graphql = MiFamiliasGraphQL(
        services, max_body_bytes=settings.max_body_bytes, keepalive_seconds=settings.keepalive_seconds
    )
    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/graphql", graphql, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", graphql),
        Mount("/static/graphiql", app=StaticFiles(directory=STATIC_DIR), name="graphiql-static"),
    ]
    local_blobs = None
    if not settings.s3_bucket:
        local_blobs = LocalBlobStore(
            settings.data_dir / "media", settings.base_url, settings.resolved_auth_secret().encode()
        )
        routes += media_routes(local_blobs)
    middleware = []
    if settings.allowed_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.allowed_origins),
                allow_methods=["GET", "POST", "PUT"],
                allow_headers=["authorization", "content-type"],
            )
        )
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


# Command line -------------------------------------------------------------------


def _serve(settings: Settings) -> None:
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        ws_per_message_deflate=False,
        # A WebSocket frame is bounded like a request body.
        ws_max_size=settings.max_body_bytes,
    )


def _token(settings: Settings, args: argparse.Namespace) -> None:
    print(
        mint_token(
            settings.resolved_auth_secret(),
            args.user_id,
            email=args.email,
            given_name=args.given_name,
            family_name=args.family_name,
            ttl_seconds=args.days * 24 * 3600,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
        )
    )
    # On stderr, so that `$(./dev app token ana)` still captures the token alone.
    where = "MIFAMILIAS_AUTH_SECRET" if settings.auth_secret else settings.data_dir / "auth-secret"
    print(f"signed with the secret in {where}: the server must use the same settings", file=sys.stderr)


async def _create_table(settings: Settings) -> bool:
    import aioboto3

    from store.dynamodb import create_table

    session = aioboto3.Session()
    async with session.client(
        "dynamodb", endpoint_url=settings.dynamodb_endpoint, region_name=settings.region
    ) as client:
        return await create_table(client, settings.table_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python app.py", description="MiFamilias API server")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="start the server on MIFAMILIAS_HOST:MIFAMILIAS_PORT (default)")
    token = commands.add_parser("token", help="print a development token (HS256) for a user id")
    token.add_argument("user_id")
    token.add_argument("--email")
    token.add_argument("--given-name")
    token.add_argument("--family-name")
    token.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    commands.add_parser("create-table", help="create the DynamoDB table with both GSIs (safe to run twice)")
    commands.add_parser("export-schema", help="write the schema's SDL to schema.graphql")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except ConfigError as error:
        print(error, file=sys.stderr)  # names the variable and its value; no traceback
        return 2
    if args.command in (None, "serve"):
        _serve(settings)
    elif args.command == "token":
        _token(settings, args)
    elif args.command == "export-schema":
        from pathlib import Path

        from schema import schema

        target = Path(__file__).resolve().parent / "schema.graphql"
        target.write_text(schema.as_str() + "\n")
        print(f"wrote {target}")
    elif args.command == "create-table":
        import asyncio

        created = asyncio.run(_create_table(settings))
        print(f"table {settings.table_name} {'created' if created else 'already exists'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
