"""What every section shares: sizes, statistics, result rows, the in-process
API client and the data the sections seed."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from resolvers.core.auth import mint_token
from resolvers.core.config import Settings
from tests.typical_calls import (  # the seeding documents and helpers the tests use too
    COMMENT,
    JOIN,
    REACT,
    SET_TAGS,
    make_family,
    settle,
    upload_text,
)

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-secret-" + "x" * 32

ME_QUERY = "{ me { id } }"
VIEWER = "ben"


@dataclass(frozen=True)
class Sizes:
    # Fifteen: the median of seven rounds moved from 1.12 to 1.23 between
    # back-to-back runs of the same code (other tenants of the VM).
    exec_rounds: int = 15
    exec_iterations: int = 60
    http_rounds: int = 5
    http_seconds: float = 5.0
    http_connections: int = 16
    fanout_clients: int = 1000
    fanout_processes: int = 4
    fanout_rounds: int = 5
    # Section 3's memory per idle subscription: each of uvicorn's WebSocket
    # implementations (a server of ours and a bare one for each, deflate off and on).
    ws_implementations: tuple[str, ...] = ("websockets", "websockets-sansio", "wsproto")
    unlock_capsules: int = 10_000
    unlock_rounds: int = 3
    moto_capsules: int = 200
    round_trip_latency: float = 0.01
    robust_seconds: float = 10.0
    robust_subscribers: int = 10_000
    # (e): subscribers that stop reading, beside others that read.
    slow_readers: int = 60
    normal_readers: int = 30
    scaleout_members: int = 600
    scaleout_capsules: int = 39
    scaleout_rounds: int = 9
    scaleout_processes: int = 3
    probe_rounds: int = 5
    probes_per_round: int = 10
    push_devices: int = 1000
    push_rounds: int = 3
    soak_seconds: float = 600.0
    soak_clients: int = 50
    soak_kill_every: float = 120.0


FULL = Sizes()
QUICK = Sizes(
    exec_rounds=3,
    exec_iterations=15,
    http_rounds=2,
    http_seconds=1.5,
    http_connections=8,
    fanout_clients=100,
    fanout_processes=2,
    fanout_rounds=2,
    unlock_capsules=500,
    unlock_rounds=2,
    moto_capsules=30,
    round_trip_latency=0.005,
    robust_seconds=3.0,
    robust_subscribers=500,
    scaleout_members=120,
    scaleout_capsules=13,
    scaleout_rounds=2,
    probe_rounds=2,
    probes_per_round=5,
    push_devices=200,
    push_rounds=2,
    soak_seconds=40.0,
    soak_kill_every=25.0,
)
TINY = Sizes(
    exec_rounds=1,
    exec_iterations=2,
    http_rounds=1,
    http_seconds=0.5,
    http_connections=2,
    fanout_clients=2,
    fanout_processes=1,
    fanout_rounds=1,
    ws_implementations=("wsproto",),  # the default's, so the smoke starts 4 servers here, not 12
    unlock_capsules=20,
    unlock_rounds=1,
    moto_capsules=6,
    round_trip_latency=0.001,
    robust_seconds=0.5,
    robust_subscribers=4,
    slow_readers=4,
    normal_readers=2,
    scaleout_members=6,
    scaleout_capsules=3,
    scaleout_rounds=1,
    scaleout_processes=2,
    probe_rounds=1,
    probes_per_round=1,
    push_devices=5,
    push_rounds=1,
    soak_seconds=12.0,
    soak_clients=6,
    soak_kill_every=6.0,
)


@dataclass
class Row:
    section: str
    measure: str
    median: str
    spread: str = ""
    ratio: str = ""
    target: str = ""
    met: str = ""


def verdict(ok: bool | None) -> str:
    if ok is None:
        return ""
    return "yes" if ok else "**no**"


@dataclass(frozen=True)
class Stats:
    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        values = sorted(samples)
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), values[0], values[-1], len(values))

    def fmt(self, unit: str = "", digits: int = 1, scale: float = 1.0) -> tuple[str, str]:
        def f(v: float) -> str:
            return f"{v * scale:,.{digits}f}{unit}"

        return f(self.median), f"{f(self.low)} – {f(self.high)} (n={self.n})"


def ratio_stats(numerators: Sequence[float], denominators: Sequence[float]) -> Stats:
    """Ratios paired by round (both measured in the same round)."""
    return Stats.of([a / b for a, b in zip(numerators, denominators, strict=True) if b])


def token(user_id: str, **claims: Any) -> str:
    claims.setdefault("given_name", user_id.capitalize())
    claims.setdefault("email", f"{user_id}@example.org")
    return mint_token(SECRET, user_id, ttl_seconds=7 * 24 * 3600, **claims)


def bench_settings(data_dir: Path, **changes: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "auth_secret": SECRET,
        "unlock_poll_seconds": 3600,
        # The typical calls register push devices there (tests/typical_calls.py).
        "push_allowed_origins": ("http://127.0.0.1:9",),
    }
    values.update(changes)
    return Settings(**values)


def server_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "MIFAMILIAS_HOST": "127.0.0.1",
        "MIFAMILIAS_DATA_DIR": str(data_dir),
        "MIFAMILIAS_AUTH_SECRET": SECRET,
        "MIFAMILIAS_UNLOCK_POLL_SECONDS": "3600",
        # The fan-out scenarios subscribe thousands of times as a few people:
        # they measure delivery, not the per-person bound (section 6 does).
        "MIFAMILIAS_MAX_SUBSCRIPTIONS_PER_PERSON": "1000000",
        "MIFAMILIAS_MAX_SUBSCRIPTIONS_PER_CONNECTION": "1000",
        "PYTHONPATH": str(ROOT),
    }
    for name in ("MIFAMILIAS_REDIS_URL", "MIFAMILIAS_DYNAMODB_ENDPOINT", "MIFAMILIAS_AWS_REGION"):
        env.pop(name, None)
    env.update(extra)
    return env


class InProcessApi:
    """The app driven over httpx's ASGI transport, as tests/api/conftest.py does."""

    def __init__(self, app: Any, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def services(self) -> Any:
        return self.app.state.services

    async def post(self, query: str, variables: dict[str, Any] | None = None, *, as_: str) -> dict[str, Any]:
        response = await self.client.post(
            "/graphql",
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {token(as_)}"},
        )
        body: dict[str, Any] = response.json()
        return body

    async def ok(self, query: str, variables: dict[str, Any] | None = None, *, as_: str) -> Any:
        body = await self.post(query, variables, as_=as_)
        if body.get("errors"):
            raise RuntimeError(f"{query[:60]}...: {body['errors']}")
        return body["data"]


@contextlib.asynccontextmanager
async def in_process_app(
    settings: Settings, *, clock: Callable[[], datetime] | None = None, wrap_table: Any = None
) -> AsyncIterator[InProcessApi]:
    from app import create_app
    from resolvers.core.context import utc_now
    from tests.servers import after_the_start_up_pass

    app = create_app(settings, clock=clock or utc_now, wrap_table=wrap_table)
    async with app.router.lifespan_context(app):
        await after_the_start_up_pass(app)  # so a bench's own pass and counts are its own
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield InProcessApi(app, client)


# Seeding through the API ------------------------------------------------------------

FEED_AUTHORS = ["ana", "ben", "cy", "dee", "eve"]
EMOJI = ["❤️", "😂", "👍", "🎉"]


async def seed_feed(api: InProcessApi, contents: int = 20) -> str:
    """A family of five with `contents` READY posts, each with reactions,
    comments and tags; returns the family id."""
    family = await make_family(api, "ana", "Los García")
    for user in FEED_AUTHORS[1:]:
        await api.ok(JOIN, {"code": family["inviteCode"]}, as_=user)
    ids = []
    for n in range(contents):
        author = FEED_AUTHORS[n % 5]
        ids.append(await upload_text(api, author, family["id"], f"hola {n}".encode(), title=f"post {n}"))
    await settle(api)
    for n, content_id in enumerate(ids):
        for k in range(1 + n % 3):
            await api.ok(REACT, {"id": content_id, "e": EMOJI[(n + k) % 4]}, as_=FEED_AUTHORS[(n + k) % 5])
        for k in range(n % 5):
            await api.ok(COMMENT, {"id": content_id, "b": f"comment {k} on {n}"}, as_=FEED_AUTHORS[k])
        await api.ok(
            SET_TAGS,
            {"id": content_id, "v": ["abuela", f"verano {n % 4}"], "s": "album"},
            as_=FEED_AUTHORS[n % 5],
        )
    return family["id"]


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in (
        "strawberry-graphql",
        "graphql-core",
        "starlette",
        "uvicorn",
        "uvloop",
        "httptools",
        "websockets",
        "aiodataloader",
        "orjson",
        "moto",
        "aioboto3",
    ):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "-"
    return found


def now() -> float:
    return time.perf_counter()
