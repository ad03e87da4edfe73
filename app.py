"""MiFamilias API: the Starlette app and its command line.

python app.py [serve]            start the server (embedded store by default)
python app.py token USER_ID      print a development token
python app.py demo               seed a demo world (once) and serve it
python app.py create-table       create the DynamoDB table (safe to run twice)
python app.py vapid-key          print a fresh Web Push (VAPID) private key for
                                 MIFAMILIAS_VAPID_PRIVATE_KEY
python app.py trusted-documents check PATH
                                 check a trusted-documents manifest against the schema
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import shutil
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from resolvers.adapters.media_http import media_routes
from resolvers.core import logs
from resolvers.core.auth import mint_token
from resolvers.core.config import ConfigError, Settings
from resolvers.core.context import utc_now
from resolvers.core.heap import settle_after_start
from resolvers.core.metrics import Metrics
from resolvers.domain import mail
from resolvers.runtime import compose, local_blob_store, observe_table, start_background
from resolvers.services import Services
from schema import schema_for
from schema.backpressure import ConnectionHandles
from schema.graphiql import STATIC_DIR
from schema.observability import RequestObservability
from schema.origins import cors_middleware, websocket_origins
from schema.transport import MiFamiliasGraphQL, SocketsToTheView
from store import keys
from store.port import TTL_ATTRIBUTE, NotExists, Table, any_of, eq

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("mifamilias")

READINESS_TIMEOUT_SECONDS = 2.0


@dataclass
class AppState:
    settings: Settings
    services: Services | None = None
    stopping: bool = False
    probed: bool = False  # /readyz was asked: something (a load balancer) watches readiness


# The part of the shutdown window during which the process still accepts
# connections, answering /readyz 503.
PROBE_WINDOW = 0.25
# Free space under the embedded store below which /readyz says it cannot write.
MIN_FREE_BYTES = 16 * 1024 * 1024
PROCESS_ID = uuid.uuid4().hex[:12]


async def _can_write(table: Table, data_dir: Path | None) -> None:
    """Raises unless the store takes a write: a small conditional put with a
    TTL (its own item, one per process); for the embedded store, first free
    space on its disk."""
    if data_dir is not None:
        free = shutil.disk_usage(data_dir).free
        if free < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, f"{free} bytes free under the store")
    key = keys.readiness_write(PROCESS_ID)
    item = {"PK": key[0], "SK": key[1], "process": PROCESS_ID, TTL_ATTRIBUTE: int(time.time()) + 3600}
    await table.put(item, any_of(NotExists(), eq("process", PROCESS_ID)))


async def _answers(what: str, probe: Awaitable[object]) -> str:
    """Whether `what` answers ("ok") or why not: a readiness check, bounded in time. The
    reason names the kind of failure only; the log has the whole message."""
    try:
        await asyncio.wait_for(probe, READINESS_TIMEOUT_SECONDS)
    except TimeoutError:
        reason = f"{what} did not answer within {READINESS_TIMEOUT_SECONDS:g} s"
        log.warning("readiness: %s", reason)
    except Exception as error:
        reason = f"{what} did not answer: {type(error).__name__}"
        log.warning("readiness: %s: %s", reason, error)
    else:
        return "ok"
    return reason


SQLITE_SWEEP_SECONDS = 3600.0


async def _open_table(settings: Settings, stack: contextlib.AsyncExitStack) -> Table:
    if settings.uses_dynamodb:
        from store.dynamodb import open_dynamo_table

        return await stack.enter_async_context(
            open_dynamo_table(settings.table_name, settings.dynamodb_endpoint, settings.region)
        )
    from store.sqlite import SqliteTable

    table = SqliteTable(settings.sqlite_path)
    stack.push_async_callback(table.close)
    # DynamoDB deletes expired items itself; SQLite is swept.
    sweeping = asyncio.create_task(table.sweep_every(SQLITE_SWEEP_SECONDS))
    stack.callback(sweeping.cancel)
    return table


def _otlp_tracer_provider() -> TracerProvider:
    """Spans batched to the OTLP/HTTP endpoint that OpenTelemetry's own
    variables name (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...)."""
    import os

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "mifamilias-api"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def create_app(
    settings: Settings | None = None,
    *,
    table: Table | None = None,
    clock: Callable[[], datetime] = utc_now,
    wrap_table: Callable[[Table], Table] | None = None,
    tracer_provider: TracerProvider | None = None,
    process_metrics: bool = False,
) -> Starlette:
    """The app. `tracer_provider` traces it (tests pass one with an in-memory
    exporter); without one, `settings.otel` makes one that exports over OTLP."""
    settings = settings or Settings.from_env()
    state = AppState(settings)
    metrics = Metrics(enabled=settings.metrics)
    if process_metrics and settings.metrics:
        metrics.collect_process()  # the process's CPU and memory: one app per process
    owns_provider = tracer_provider is None and settings.otel
    if owns_provider:
        tracer_provider = _otlp_tracer_provider()
    tracer = tracer_provider.get_tracer("mifamilias") if tracer_provider is not None else None

    def services() -> Services:
        if state.services is None:
            raise RuntimeError("the app has not started")
        return state.services

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if owns_provider and tracer_provider is not None:
                stack.callback(tracer_provider.shutdown)  # last: flushes what the rest traced
            store = table if table is not None else await _open_table(settings, stack)
            store = observe_table(store, metrics, tracer, settings.table_name)
            if wrap_table is not None:
                store = wrap_table(store)
            state.services = await compose(
                settings, store, stack, local_blobs=local_blobs, clock=clock, metrics=metrics, tracer=tracer
            )
            if settings.metrics and settings.metrics_port is not None:
                _serve_metrics(metrics, settings, stack)
            app.state.services = state.services
            await start_background(state.services, stack)
            settle_after_start()
            yield
            # Done already when `serve` runs (GracefulServer); not when another
            # server runs the app.
            await going_away()
        state.services = None

    async def going_away() -> None:
        """The first steps of a shutdown, before in-flight requests are waited
        for: /readyz answers 503, open WebSockets close with 1001, and the
        pipeline stops and hands its leases back. Safe to call twice."""
        state.stopping = True
        await graphql.going_away()
        if state.services is not None:
            await state.services.pipeline.stop()

    async def healthz(request: Request) -> Response:
        # Liveness: the process answers. What it depends on is /readyz's to say,
        # so that an outage of the store does not get every process restarted.
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        state.probed = True
        if state.stopping:
            return JSONResponse({"status": "unavailable", "server": "shutting down"}, status_code=503)
        running = services()
        embedded = None if settings.uses_dynamodb else settings.data_dir
        store, broker = await asyncio.gather(
            _answers("the table", _can_write(running.table, embedded)),
            _answers("Redis" if settings.redis_url else "the broker", running.broker.ping()),
        )
        if store == broker == "ok":
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable", "store": store, "broker": broker}, status_code=503)

    async def metrics_page(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    unsubscribe_links = mail.LinkSigner(settings.resolved_auth_secret(), settings.mail_link_days)

    async def unsubscribe(request: Request) -> Response:
        """RFC 8058 one-click unsubscribe: a POST switches the email off, with no
        sign-in (the signed link is the proof). A GET only shows a button, since
        link checkers and previews fetch links without anyone asking."""
        token = request.query_params.get("token", "")
        try:
            if request.method == "GET":
                unsubscribe_links.read(token, services().now())
                return HTMLResponse(
                    _page("Stop these emails?", "One click, and they stop.", _unsubscribe_form(token))
                )
            changed = await mail.unsubscribe(services().table, unsubscribe_links, token, services().now())
        except mail.ExpiredLink as error:
            return HTMLResponse(_page("Link expired", str(error)), status_code=410)
        except mail.BadLink as error:
            return HTMLResponse(_page("Link not valid", str(error)), status_code=400)
        said = "You will get no more of these emails." if changed else "These emails were already off."
        return HTMLResponse(_page("Unsubscribed", said))

    graphql = MiFamiliasGraphQL(
        services,
        max_body_bytes=settings.max_body_bytes,
        keepalive_seconds=settings.keepalive_seconds,
        # GraphiQL needs introspection: off with it (trusted documents, unless allowed).
        graphql_ide="graphiql" if settings.introspection_allowed else None,
        schema=schema_for(metrics=settings.metrics, tracing=tracer is not None),
        # Strawberry checks a WebSocket's Origin (browsers apply no CORS to them):
        # the same origins as HTTP (schema/origins.py).
        allowed_origins=websocket_origins(settings.allowed_origins),
    )
    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/graphql", graphql, methods=["GET", "POST"]),
        WebSocketRoute("/graphql", graphql),
        Mount("/static/graphiql", app=StaticFiles(directory=STATIC_DIR), name="graphiql-static"),
        # Always there: links in emails sent before mail was turned off still work.
        Route(mail.UNSUBSCRIBE_PATH, unsubscribe, methods=["GET", "POST"]),
    ]
    if settings.metrics and settings.metrics_port is None:
        routes.append(Route("/metrics", metrics_page))
    local_blobs = None
    if not settings.s3_bucket:
        local_blobs = local_blob_store(settings)
        routes += media_routes(local_blobs)
    # Outermost of ours: every request's log lines and spans, CORS refusals included.
    middleware = [Middleware(RequestObservability, tracer=tracer), cors_middleware(settings.allowed_origins)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.graphql_view = graphql
    app.state.going_away = going_away
    app.state.probed = lambda: state.probed
    return app


def _page(title: str, text: str, form: str = "") -> str:
    from html import escape

    head = f"<!doctype html><html><head><meta charset=utf-8><title>{escape(title)}</title></head>"
    return f"{head}<body><h1>{escape(title)}</h1><p>{escape(text)}</p>{form}</body></html>"


def _unsubscribe_form(token: str) -> str:
    from html import escape
    from urllib.parse import urlencode

    action = f"{mail.UNSUBSCRIBE_PATH}?{urlencode({'token': token})}"
    return (
        f'<form method="post" action="{escape(action)}">'
        '<input type="hidden" name="List-Unsubscribe" value="One-Click">'
        "<button>Stop these emails</button></form>"
    )


def _serve_metrics(metrics: Metrics, settings: Settings, stack: contextlib.AsyncExitStack) -> None:
    """`/metrics` on a port of its own (MIFAMILIAS_METRICS_PORT), from a thread,
    so the API's port does not expose it."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(
        settings.metrics_port or 0, addr=settings.host, registry=metrics.registry
    )

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    stack.callback(stop)
    log.info("metrics on http://%s:%d/metrics", settings.host, server.server_port)


# Command line -------------------------------------------------------------------


def _serve(settings: Settings) -> None:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn's server, with the app's first steps of a shutdown. On SIGTERM
        uvicorn stops accepting, closes open WebSockets itself with 1012, waits
        for requests up to `timeout_graceful_shutdown`, and only then runs the
        lifespan's shutdown, too late for a close of our own. So the app's steps
        (`going_away`: WebSockets closed with 1001, leases handed back) run here,
        between the listening sockets closing and uvicorn's wait, and one deadline,
        MIFAMILIAS_SHUTDOWN_SECONDS, covers both."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            log.info("shutting down: WebSockets close, pipeline leases go back, then requests drain")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + settings.shutdown_seconds
            try:
                await asyncio.wait_for(going_away(), settings.shutdown_seconds)
            except TimeoutError:
                log.error("shutdown: closing sockets and handing back leases took too long")
            # Still listening for the first part of the window: a new probe is
            # answered 503 "shutting down" (so the load balancer drains this
            # process) instead of finding the port closed.
            # A process nobody probes (a developer's, a test's) has no one to tell.
            if app.state.probed():
                window = min(deadline - loop.time(), settings.shutdown_seconds * PROBE_WINDOW)
                await asyncio.sleep(max(0.0, window))
            for server in self.servers:
                server.close()  # uvicorn's own close repeats it harmlessly
            # uvicorn reads the timeout when it starts waiting: what is left of ours
            # (whole seconds, as uvicorn types it).
            self.config.timeout_graceful_shutdown = max(0, int(deadline - loop.time()))
            await super().shutdown(sockets)

    # Our handler for every logger, uvicorn's included (log_config=None keeps
    # uvicorn from installing its own): one format, the request's fields, redaction.
    logs.configure(settings.log_format, settings.log_level)
    app = create_app(settings, process_metrics=True)
    going_away: Callable[[], Awaitable[None]] = app.state.going_away
    view = getattr(app.state, "graphql_view", None)  # none in the benchmark's plain app
    config = uvicorn.Config(
        # Outside Starlette's own middleware: it sees the server's own `send`,
        # so a slow client's connection can be dropped. A GraphQL socket goes
        # to its view past Starlette's layers, each a frame held while it is open.
        ConnectionHandles(SocketsToTheView(app, RequestObservability(view)) if view is not None else app),
        host=settings.host,
        port=settings.port,
        log_config=None,
        ws=settings.websocket_implementation(),
        ws_per_message_deflate=settings.ws_deflate,
        # A WebSocket frame is bounded like a request body.
        ws_max_size=settings.max_body_bytes,
        timeout_graceful_shutdown=int(settings.shutdown_seconds),  # replaced at shutdown, see above
        # X-Forwarded-For and -Proto are believed from MIFAMILIAS_TRUSTED_PROXIES
        # only; uvicorn's own default would trust 127.0.0.1.
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=list(settings.trusted_proxies),
    )
    GracefulServer(config).run()


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


def _vapid_key() -> None:
    from py_vapid import Vapid02

    from resolvers.adapters.webpush import new_private_key, public_key

    key = new_private_key()
    print(key)
    # On stderr, so that `$(python app.py vapid-key)` captures the key alone.
    print(
        "a fresh VAPID private key: set it as MIFAMILIAS_VAPID_PRIVATE_KEY on every host of the "
        "deployment (the CloudFormation parameter VapidPrivateKey), and keep it: browsers subscribed "
        f"with its public key {public_key(Vapid02.from_raw(key.encode()))} refuse pushes signed "
        "with any other",
        file=sys.stderr,
    )


def _demo(settings: Settings) -> int:
    import asyncio

    from resolvers import demo

    problem = demo.refusal(settings)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    world = demo.load_world(settings)
    seeded_now = world is None
    if world is not None:
        world = asyncio.run(demo.as_it_is_now(settings, world))
    else:
        print(
            f"Seeding a demo world in {settings.data_dir} (real media through the real pipeline)...",
            flush=True,
        )
        try:
            world = asyncio.run(demo.seed(settings))
        except demo.DemoError as error:
            print(f"the demo could not be seeded: {error}", file=sys.stderr)
            return 1
    print(demo.describe(settings, world, seeded_now=seeded_now), flush=True)
    _serve(settings)
    return 0


async def _create_table(settings: Settings) -> bool:
    import aioboto3

    from store.dynamodb import create_table

    session = aioboto3.Session()
    async with session.client(
        "dynamodb", endpoint_url=settings.dynamodb_endpoint, region_name=settings.region
    ) as client:
        return await create_table(client, settings.table_name)


def _check_trusted_documents(settings: Settings, path: Path) -> int:
    """0 when every document of the manifest can run here; 1 naming those that
    cannot; 2 when the manifest itself cannot be read."""
    from resolvers.core.persisted import ManifestError, load_manifest
    from schema.persisted import check_manifest

    try:
        entries = load_manifest(path)
    except ManifestError as error:
        print(error, file=sys.stderr)
        return 2
    bad = check_manifest(entries, settings.max_query_cost)
    for label, problems in bad.items():
        for problem in problems:
            print(f"{label}: {problem}", file=sys.stderr)
    if bad:
        print(f"{path}: {len(bad)} of {len(entries)} documents cannot run here", file=sys.stderr)
        return 1
    print(f"{path}: all {len(entries)} documents are valid against the schema")
    return 0


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
    commands.add_parser(
        "demo",
        help="seed a demo family in the data directory (once), print a GraphiQL link per member, and serve",
    )
    commands.add_parser("create-table", help="create the DynamoDB table with both GSIs (safe to run twice)")
    commands.add_parser(
        "vapid-key",
        help="print a fresh Web Push (VAPID) private key, the value of MIFAMILIAS_VAPID_PRIVATE_KEY",
    )
    commands.add_parser("export-schema", help="write the schema's SDL to schema.graphql")
    trusted = commands.add_parser(
        "trusted-documents", help="trusted documents (MIFAMILIAS_TRUSTED_DOCUMENTS)"
    )
    trusted_commands = trusted.add_subparsers(dest="trusted_command", required=True)
    check = trusted_commands.add_parser(
        "check", help="validate every document of an Apollo or Relay manifest against the schema"
    )
    check.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.command == "vapid-key":
        # Reads no settings: it is what a configuration refused for want of it needs.
        _vapid_key()
        return 0
    try:
        settings = Settings.from_env()
        if args.command in (None, "serve"):
            settings.check_serving()
    except ConfigError as error:
        print(error, file=sys.stderr)  # names the variable and its value; no traceback
        return 2
    if args.command in (None, "serve"):
        _serve(settings)
    elif args.command == "token":
        _token(settings, args)
    elif args.command == "trusted-documents":
        return _check_trusted_documents(settings, args.path)
    elif args.command == "demo":
        return _demo(settings)
    elif args.command == "export-schema":
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
