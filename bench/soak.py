"""Section 11: a soak with crashes (`./dev bench soak`). Three `python app.py
serve` processes on one DynamoDB table (moto_server) with Redis as the broker;
clients, each a person of one of five families, read, comment, react, post notes,
upload small photos and make capsules, and each holds a subscription over
graphql-transport-ws (`notificationAdded`, `capsuleUnlocked`, or
`contentStatusChanged` on what it uploads). Every `kill_every` seconds one
process (round robin) is killed with SIGKILL and started again on its port.

A client whose process goes away retries on the next one: a mutation with the
same Idempotency-Key (a retry never applies twice; an answer lost after the
write landed comes back as CONFLICT with `outcome: "APPLIED"`), a subscription
with `after` set to the last event it received and `received` to the ids of
its last 100 (the resumable streams of docs/decisions.md, "Live events that
are never lost").

At the end, once the pipeline and the capsules due have settled, what the
clients were told is compared with the table as the API answers it:
- every comment answered with data (or APPLIED, found by its unique body) is
  there once, and no body of any comment sent is there twice;
- its NEW_COMMENT notification (a deterministic id) is in the author's
  notifications once; every scheduled capsule's CAPSULE_UNLOCKED once per
  recipient; every content READY in a feed's NEW_CONTENT once per other
  member of its family; no notification id twice;
- each `notificationAdded` / `capsuleUnlocked` stream, across its reconnects,
  holds every notification of its kind its person got after it started, and
  none twice;
- each watched content's status stream ends at the status the content has.
Errors are counted by `extensions.code` (and transport failures by kind);
latency is per operation, from the first attempt to the answer, retries
included."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import signal
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import websockets
from websockets.typing import Subprotocol

from bench.common import ROOT, Row, Sizes, server_env, token, verdict

SECTION = "11. Soak"
FAMILY_SIZE = 10
# A retried operation gives up after this long (a mutation whose first attempt
# died waits out the operation deadline, 10 s, before a retry takes it over).
GIVE_UP_SECONDS = 90.0
SETTLE_SECONDS = 120.0
CAPSULE_LEAD_SECONDS = (30.0, 90.0)
MEASURE = "soak: events lost / duplicated"
# Between one operation of a client and its next: fifty clients at about 0.17
# operations a second each, what three processes on one moto_server carry on a
# shared two-core machine without the operation deadline cutting most writes.
THINK_SECONDS = (3.0, 9.0)
FINAL = ("READY", "DELIVERED", "FAILED")
STATUS_ORDER = ("UPLOADING", "PROCESSING", "TRANSCODING", "READY", "DELIVERED", "FAILED")
RETRY_CODES = ("UNAVAILABLE", "INTERNAL_SERVER_ERROR", "RATE_LIMITED")

COMMENT = "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }"
REACT = "mutation($c: ID!, $e: String!) { addReaction(contentId: $c, emoji: $e) { id } }"
CREATE_UPLOAD = """mutation($i: CreateUploadInput!) {
  createUpload(input: $i) { uploadUrl content { id } } }"""
COMPLETE = "mutation($id: ID!) { completeUpload(contentId: $id) { id status } }"
CREATE_CAPSULE = "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"
SCHEDULE = "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { id status } }"
FEED = """query($f: ID!) { family(id: $f) { feed(first: 20) { edges { node {
  id title author { id } reactions { emoji count } commentCount
  comments(first: 3) { edges { node { id body } } } } } } } }"""
NOTIFICATIONS = "{ notifications(first: 20) { unreadCount edges { node { id type read } } } }"
CONTENT = "query($id: ID!) { content(id: $id) { id status commentCount } }"
EMOJI = ("❤️", "😂", "👍", "🎉")

SUBSCRIPTIONS = {
    "notificationAdded": "subscription($a: ID, $r: [ID!]) "
    "{ notificationAdded(after: $a, received: $r) { id type } }",
    "capsuleUnlocked": "subscription($a: ID, $r: [ID!]) "
    "{ capsuleUnlocked(after: $a, received: $r) { id capsule { id } } }",
}
# The ids a resuming client says it holds: its most recent, as many as the
# API takes (a person's events do not come in the order `after` reads them).
RECEIVED_SENT = 100
STATUS_SUBSCRIPTION = "subscription($c: ID!) { contentStatusChanged(contentId: $c) { id status } }"


def stored_id(public_id: str) -> str:
    """A notification's stored id, from its public `<id>.<epoch>.<createdAt>`."""
    return public_id.split(".", 1)[0]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def waited(done: Callable[[], bool], seconds: float) -> None:
    """Until `done()` or `seconds` have passed (what is still missing then is reported)."""
    deadline = time.monotonic() + seconds
    while True:
        if done() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.5)


def tiny_png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (48, 48), (200, 120, 60)).save(out, "PNG")
    return out.getvalue()


@dataclass
class Answer:
    data: Any = None
    code: str = ""  # the first error's extensions.code
    applied: bool = False  # CONFLICT with outcome APPLIED: landed, answer lost
    gave_up: bool = False
    attempts: list[str] = field(default_factory=list)  # what each attempt ended with


@dataclass
class SentComment:
    content_id: str
    author_id: str  # the content's
    commenter: str
    body: str
    comment_id: str | None = None
    outcome: str = "unknown"  # committed | applied | refused | unknown
    attempts: list[str] = field(default_factory=list)


@dataclass
class Ledger:
    """What the clients were told."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    gave_up: int = 0
    comments: list[SentComment] = field(default_factory=list)
    # Completed content -> who uploaded it (a capsule's content is theirs alone to read until it opens).
    contents: dict[str, str] = field(default_factory=dict)
    capsules: dict[str, tuple[str, list[str]]] = field(
        default_factory=dict
    )  # scheduled -> creator, recipients
    # Per person: the notification ids each stream received, in order.
    streams: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    # Beside each of those ids, the connection (0, 1, ... a reconnect each) that carried it: a repeat
    # on one connection breaks "once within a subscription", one across a reconnect only "once".
    carried: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    reconnects: int = 0
    # Per watched content: the statuses its stream reported.
    watched: dict[str, list[str]] = field(default_factory=dict)
    kills: list[float] = field(default_factory=list)


@dataclass
class Person:
    user_id: str
    family_id: str
    home: int  # the process it talks to first
    subscription: str  # notificationAdded | capsuleUnlocked | status
    family: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, urls: list[str], ledger: Ledger, stop: asyncio.Event) -> None:
        self.urls = urls
        self.ledger = ledger
        self.stop = stop
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=100),
        )
        self.readable: dict[str, list[tuple[str, str]]] = defaultdict(list)  # family -> (content, author)
        self.photo = tiny_png()
        self.watchers: set[asyncio.Task[None]] = set()

    async def call(
        self, person: Person, kind: str, query: str, variables: dict[str, Any], *, mutation: bool
    ) -> Answer:
        """One operation, retried on the next process until it has an answer
        that is not "try again" (a mutation with the same Idempotency-Key)."""
        headers = {"Authorization": f"Bearer {token(person.user_id)}"}
        if mutation:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        started = time.monotonic()
        attempt = 0
        tried: list[str] = []
        self.ledger.operations[kind] += 1
        while True:
            url = self.urls[(person.home + attempt) % len(self.urls)]
            if attempt:
                self.ledger.retries += 1
            attempt += 1
            # Exponential backoff with jitter, as a well-behaved client retries:
            # retrying at once piles onto processes already past their deadline.
            wait = min(20.0, 0.5 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0)
            try:
                response = await self.http.post(
                    f"{url}/graphql", json={"query": query, "variables": variables}, headers=headers
                )
                body = response.json()
            except (httpx.HTTPError, ValueError) as error:
                self.ledger.errors[f"transport: {type(error).__name__}"] += 1
                tried.append(type(error).__name__)
            else:
                errors = body.get("errors") or []
                if not errors:
                    self.ledger.latencies[kind].append(time.monotonic() - started)
                    return Answer(body.get("data"), attempts=[*tried, "data"])
                extensions = errors[0].get("extensions") or {}
                code = str(extensions.get("code") or f"HTTP {response.status_code}")
                self.ledger.errors[code] += 1
                tried.append(code)
                if code == "CONFLICT" and extensions.get("outcome") == "APPLIED":
                    self.ledger.latencies[kind].append(time.monotonic() - started)
                    return Answer(applied=True, code=code, attempts=tried)
                if code not in RETRY_CODES:
                    self.ledger.latencies[kind].append(time.monotonic() - started)
                    return Answer(code=code, attempts=tried)
                wait = max(wait, float(extensions.get("retryAfter") or 0))
            if time.monotonic() - started > GIVE_UP_SECONDS:
                self.ledger.gave_up += 1
                return Answer(gave_up=True, attempts=tried)
            await asyncio.sleep(wait)

    async def put(self, person: Person, upload_url: str, body: bytes, mime: str) -> bool:
        """The bytes, to the process that signed the URL or, if it is gone, another (same signature)."""
        path = upload_url[upload_url.index("/", len("http://")) :]
        started = time.monotonic()
        for attempt in range(30):
            url = self.urls[(person.home + attempt) % len(self.urls)]
            try:
                sent = await self.http.put(f"{url}{path}", content=body, headers={"Content-Type": mime})
                if sent.status_code == 200:
                    self.ledger.latencies["upload PUT"].append(time.monotonic() - started)
                    return True
                self.ledger.errors[f"PUT HTTP {sent.status_code}"] += 1
            except httpx.HTTPError as error:
                self.ledger.errors[f"transport: {type(error).__name__}"] += 1
            await asyncio.sleep(0.3)
        return False

    # The operations ------------------------------------------------------------

    async def read(self, person: Person, rng: random.Random) -> None:
        choice = rng.random()
        if choice < 0.5:
            await self.call(person, "read feed", FEED, {"f": person.family_id}, mutation=False)
        elif choice < 0.8 or not self.readable[person.family_id]:
            await self.call(person, "read notifications", NOTIFICATIONS, {}, mutation=False)
        else:
            content_id, _ = rng.choice(self.readable[person.family_id])
            await self.call(person, "read content", CONTENT, {"id": content_id}, mutation=False)

    async def comment(self, person: Person, rng: random.Random) -> None:
        if not self.readable[person.family_id]:
            return
        content_id, author = rng.choice(self.readable[person.family_id])
        sent = SentComment(content_id, author, person.user_id, f"c-{uuid.uuid4().hex}")
        self.ledger.comments.append(sent)
        answer = await self.call(
            person, "addComment", COMMENT, {"c": content_id, "b": sent.body}, mutation=True
        )
        sent.attempts = answer.attempts
        if answer.data:
            sent.comment_id, sent.outcome = answer.data["addComment"]["id"], "committed"
        elif answer.applied:
            sent.outcome = "applied"
        elif answer.code:
            sent.outcome = "refused"

    async def react(self, person: Person, rng: random.Random) -> None:
        if self.readable[person.family_id]:
            content_id, _ = rng.choice(self.readable[person.family_id])
            variables = {"c": content_id, "e": rng.choice(EMOJI)}
            await self.call(person, "addReaction", REACT, variables, mutation=True)

    async def upload(
        self, person: Person, kind: str, body: bytes, mime: str, capsule_id: str | None = None
    ) -> str | None:
        variables = {
            "i": {
                "familyId": person.family_id,
                "type": kind,
                "mimeType": mime,
                "sizeBytes": len(body),
                "title": f"t-{uuid.uuid4().hex[:12]}",
                "capsuleId": capsule_id,
            }
        }
        label = "createUpload (capsule)" if capsule_id else f"createUpload ({kind})"
        created = await self.call(person, label, CREATE_UPLOAD, variables, mutation=True)
        if not created.data:
            return None
        content_id = str(created.data["createUpload"]["content"]["id"])
        if not await self.put(person, created.data["createUpload"]["uploadUrl"], body, mime):
            return None
        done = await self.call(person, "completeUpload", COMPLETE, {"id": content_id}, mutation=True)
        if not done.data:
            return None
        self.ledger.contents[content_id] = person.user_id
        if person.subscription == "status":
            self.watchers.add(asyncio.create_task(self.watch(person, content_id)))
        if capsule_id is None:
            self.readable[person.family_id].append((content_id, person.user_id))
        return content_id

    async def capsule(self, person: Person, rng: random.Random) -> None:
        others = [p for p in person.family if p != person.user_id]
        recipients = rng.sample(others, k=min(3, len(others)))
        unlock = datetime.now(UTC) + timedelta(seconds=rng.uniform(*CAPSULE_LEAD_SECONDS))
        variables = {
            "i": {
                "familyId": person.family_id,
                "title": f"cap-{uuid.uuid4().hex[:8]}",
                "unlockDate": unlock.isoformat(),
                "recipientIds": recipients,
            }
        }
        created = await self.call(person, "createCapsule", CREATE_CAPSULE, variables, mutation=True)
        if not created.data:
            return
        capsule_id = str(created.data["createCapsule"]["id"])
        # Scheduled first: content goes only into a SCHEDULED capsule.
        scheduled = await self.call(person, "scheduleCapsule", SCHEDULE, {"id": capsule_id}, mutation=True)
        if not scheduled.data:
            return
        # Without its content by its date a capsule never opens: only one with
        # its content is expected to.
        if await self.upload(person, "TEXT", b"para ti", "text/plain", capsule_id) is not None:
            self.ledger.capsules[capsule_id] = (person.user_id, recipients)

    async def client(self, person: Person, seed: int, ends: float) -> None:
        rng = random.Random(seed)
        await asyncio.sleep(rng.uniform(0, 2))
        while time.monotonic() < ends:
            choice = rng.random()
            if choice < 0.35:
                await self.read(person, rng)
            elif choice < 0.62:
                await self.comment(person, rng)
            elif choice < 0.80:
                await self.react(person, rng)
            elif choice < 0.89:
                await self.upload(person, "TEXT", f"nota {uuid.uuid4().hex}".encode(), "text/plain")
            elif choice < 0.96:
                await self.upload(person, "PHOTO", self.photo, "image/png")
            else:
                await self.capsule(person, rng)
            await asyncio.sleep(rng.uniform(*THINK_SECONDS))

    # Subscriptions -------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def socket(self, person: Person, attempt: int) -> AsyncIterator[Any]:
        url = self.urls[(person.home + attempt) % len(self.urls)].replace("http://", "ws://") + "/graphql"
        async with websockets.connect(
            url,
            subprotocols=[Subprotocol("graphql-transport-ws")],
            open_timeout=10,
            ping_interval=None,
            max_queue=None,
        ) as ws:
            init = {
                "type": "connection_init",
                "payload": {"Authorization": f"Bearer {token(person.user_id)}"},
            }
            await ws.send(json.dumps(init))
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if message["type"] == "connection_ack":
                    break
                if message["type"] == "ping":
                    await ws.send('{"type":"pong"}')
                elif message["type"] != "pong":
                    raise ConnectionError(f"refused: {message}")
            yield ws

    async def messages(self, ws: Any) -> AsyncIterator[dict[str, Any]]:
        """The subscription's payloads until it ends (None data: an error event, counted)."""
        async for raw in ws:
            message = json.loads(raw)
            if message["type"] == "next":
                payload = message["payload"]
                if payload.get("errors"):
                    code = (payload["errors"][0].get("extensions") or {}).get("code", "?")
                    self.ledger.errors[f"subscription: {code}"] += 1
                    return
                yield payload["data"]
            elif message["type"] == "ping":
                await ws.send('{"type":"pong"}')
            elif message["type"] == "error":
                code = (message["payload"][0].get("extensions") or {}).get("code", "?")
                self.ledger.errors[f"subscription: {code}"] += 1
                return
            elif message["type"] == "complete":
                return

    async def stream(self, person: Person, ready: asyncio.Event) -> None:
        """A person's stream, resumed after its last event on every reconnect."""
        name = person.subscription
        received = self.ledger.streams[(person.user_id, name)]
        carried = self.ledger.carried[(person.user_id, name)]
        attempt = 0
        while True:
            try:
                async with self.socket(person, attempt) as ws:
                    after = received[-1] if received else None
                    variables = {"a": after, "r": received[-RECEIVED_SENT:] or None}
                    payload = {"query": SUBSCRIPTIONS[name], "variables": variables}
                    await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": payload}))
                    ready.set()
                    async for data in self.messages(ws):
                        received.append(str(data[name]["id"]))
                        carried.append(attempt)
            except (TimeoutError, OSError, websockets.WebSocketException) as error:
                self.ledger.errors[f"subscription transport: {type(error).__name__}"] += 1
            self.ledger.reconnects += 1
            attempt += 1
            await asyncio.sleep(0.3)

    async def watch(self, person: Person, content_id: str) -> None:
        """contentStatusChanged on one content until it is READY (or FAILED)."""
        seen = self.ledger.watched.setdefault(content_id, [])
        attempt = 0
        started = time.monotonic()
        while time.monotonic() - started < SETTLE_SECONDS * 2:
            try:
                async with self.socket(person, attempt) as ws:
                    payload = {"query": STATUS_SUBSCRIPTION, "variables": {"c": content_id}}
                    await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": payload}))
                    async for data in self.messages(ws):
                        seen.append(str(data["contentStatusChanged"]["status"]))
                        if seen[-1] in ("READY", "DELIVERED", "FAILED"):
                            return
            except (TimeoutError, OSError, websockets.WebSocketException) as error:
                self.ledger.errors[f"subscription transport: {type(error).__name__}"] += 1
            self.ledger.reconnects += 1
            attempt += 1
            await asyncio.sleep(0.3)

    async def close(self) -> None:
        await self.http.aclose()


# The run ------------------------------------------------------------------------


@contextlib.contextmanager
def dynamodb_and_redis(log_dir: Path, table_name: str) -> Iterator[dict[str, str]]:
    """A table on a moto_server of the soak's own, and Redis: the servers' environment."""
    from bench.scaleout import shared_redis
    from bench.unlock import use_moto_credentials
    from resolvers.adapters.webpush import new_private_key
    from store.dynamodb import create_table, open_dynamo_table
    from tests.servers import moto_server_process

    async def made(url: str) -> None:
        async with open_dynamo_table(table_name, url, "us-east-1") as table:
            await create_table(table.client, table_name)

    use_moto_credentials()
    with moto_server_process(log_dir) as (url, _), shared_redis(log_dir) as redis_url:
        asyncio.run(made(url))
        yield {
            "MIFAMILIAS_DYNAMODB_ENDPOINT": url,
            "MIFAMILIAS_AWS_REGION": "us-east-1",
            "MIFAMILIAS_TABLE_NAME": table_name,
            "MIFAMILIAS_VAPID_PRIVATE_KEY": new_private_key(),
            "MIFAMILIAS_REDIS_URL": redis_url,
        }


async def gql(http: httpx.AsyncClient, url: str, user: str, query: str, variables: dict[str, Any]) -> Any:
    response = await http.post(
        f"{url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {token(user)}"},
    )
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(f"{query[:50]}: {body['errors']}")
    return body["data"]


async def pages(
    http: httpx.AsyncClient, url: str, user: str, query: str, variables: dict[str, Any], path: str
) -> list[Any]:
    """Every node of a connection (`path`: where it is in the answer), 100 at a time."""
    nodes: list[Any] = []
    after = None
    while True:
        data = await gql(http, url, user, query, {**variables, "after": after})
        for step in path.split("."):
            data = data[step]
        nodes += [edge["node"] for edge in data["edges"]]
        if not data["pageInfo"]["hasNextPage"]:
            return nodes
        after = data["pageInfo"]["endCursor"]


ALL_NOTIFICATIONS = """query($after: String) { notifications(first: 100, after: $after) {
  edges { node { id type } } pageInfo { hasNextPage endCursor } } }"""
ALL_COMMENTS = """query($id: ID!, $after: String) { content(id: $id) { comments(first: 100, after: $after) {
  edges { node { id body } } pageInfo { hasNextPage endCursor } } } }"""
CAPSULE = "query($id: ID!) { capsule(id: $id) { id status } }"
STATUS = "query($id: ID!) { content(id: $id) { status } }"


async def seed(http: httpx.AsyncClient, urls: list[str], people: list[Person], run_id: str) -> None:
    """Families of ten, each member with one note to comment on, all READY
    (the families made side by side, each on a process)."""
    families: dict[int, list[Person]] = defaultdict(list)
    for n, person in enumerate(people):
        families[n // FAMILY_SIZE].append(person)
    notes: list[tuple[Person, str]] = []

    async def family(n: int, members: list[Person]) -> None:
        url = urls[n % len(urls)]
        made = await gql(
            http,
            url,
            members[0].user_id,
            "mutation($n: String!) { createFamily(input: {name: $n}) { id inviteCode } }",
            {"n": f"Soak {run_id}"},
        )
        family_id, code = made["createFamily"]["id"], made["createFamily"]["inviteCode"]
        join = "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }"
        for member in members[1:]:
            await gql(http, url, member.user_id, join, {"c": code})
        for member in members:
            member.family_id = family_id
            member.family = [m.user_id for m in members]
            body = f"hola de {member.user_id}".encode()
            upload = {"familyId": family_id, "type": "TEXT", "mimeType": "text/plain", "sizeBytes": len(body)}
            created = await gql(http, url, member.user_id, CREATE_UPLOAD, {"i": upload})
            upload_url = created["createUpload"]["uploadUrl"]
            sent = await http.put(upload_url, content=body, headers={"Content-Type": "text/plain"})
            sent.raise_for_status()
            content_id = created["createUpload"]["content"]["id"]
            await gql(http, url, member.user_id, COMPLETE, {"id": content_id})
            notes.append((member, content_id))

    await asyncio.gather(*(family(n, members) for n, members in families.items()))
    deadline = time.monotonic() + SETTLE_SECONDS
    for member, content_id in notes:
        while True:
            found = await gql(http, urls[0], member.user_id, STATUS, {"id": content_id})
            if found["content"]["status"] == "READY":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"seeded note {content_id} never became READY")
            await asyncio.sleep(0.2)


@dataclass
class Outcome:
    ledger: Ledger
    seconds: float
    clients: int
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what else was seen, not a loss
    unpromised: list[str] = field(default_factory=list)  # stream misses outside the contract
    counted: Counter[str] = field(default_factory=Counter)


# A process starting on a loaded machine has taken over a minute to import.
START_SECONDS = 300.0


def start_server(server: Any) -> None:
    server.start(timeout=START_SECONDS)


async def soak(sizes: Sizes, servers: list[Any], run_id: str) -> Outcome:
    ledger = Ledger()
    stop = asyncio.Event()
    urls = [s.url for s in servers]
    runner = Soak(urls, ledger, stop)
    kinds = ("notificationAdded", "capsuleUnlocked", "status")
    people = [
        Person(f"sk{run_id}p{n:03d}", "", n % len(servers), kinds[n % len(kinds)])
        for n in range(sizes.soak_clients)
    ]
    tasks: list[asyncio.Task[Any]] = []
    try:
        await seed(runner.http, urls, people, run_id)
        for person in people:
            runner.readable[person.family_id] = []
        for person in people:
            contents = await pages(
                runner.http,
                urls[0],
                person.user_id,
                """query($f: ID!, $after: String) { family(id: $f) { feed(first: 100, after: $after) {
                  edges { node { id author { id } } } pageInfo { hasNextPage endCursor } } } }""",
                {"f": person.family_id},
                "family.feed",
            )
            if not runner.readable[person.family_id]:
                runner.readable[person.family_id] = [(c["id"], c["author"]["id"]) for c in contents]
        # The streams start before any write they are checked against.
        baseline: dict[str, set[str]] = {}
        for person in people:
            notes = await pages(runner.http, urls[0], person.user_id, ALL_NOTIFICATIONS, {}, "notifications")
            baseline[person.user_id] = {stored_id(n["id"]) for n in notes}
        readies = []
        for person in people:
            if person.subscription in SUBSCRIPTIONS:
                ready = asyncio.Event()
                readies.append(ready)
                tasks.append(asyncio.create_task(runner.stream(person, ready)))
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        await asyncio.sleep(1.0)  # the SUBSCRIBEs reach Redis before the first write
        started = time.monotonic()
        ends = started + sizes.soak_seconds
        clients = [asyncio.create_task(runner.client(p, n, ends)) for n, p in enumerate(people)]
        kills = asyncio.create_task(killer(servers, sizes, started, ends, ledger))
        await asyncio.gather(*clients)
        seconds = time.monotonic() - started
        await kills
        outcome = Outcome(ledger, seconds, len(people))
        await settle(runner, people, outcome)
        await check(runner, people, baseline, outcome)
        return outcome
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.close()


async def killer(servers: list[Any], sizes: Sizes, started: float, ends: float, ledger: Ledger) -> None:
    """One process killed with SIGKILL, and started again, every `soak_kill_every` seconds, round robin."""
    n = 0
    while True:
        at = started + (n + 1) * sizes.soak_kill_every
        if at >= ends:
            return
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        server = servers[n % len(servers)]
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(server.process.wait)
        ledger.kills.append(time.monotonic() - started)
        await asyncio.to_thread(start_server, server)
        n += 1


async def settle(runner: Soak, people: list[Person], outcome: Outcome) -> None:
    """Until every completed content is READY (or FAILED) and every scheduled
    capsule is open, and the streams have what the table holds; bounded."""
    url = runner.urls[0]
    creators = {p.user_id: p for p in people}
    deadline = time.monotonic() + SETTLE_SECONDS
    pending = dict(runner.ledger.contents)
    while pending and time.monotonic() < deadline:
        for content_id, uploader in list(pending.items()):
            found = await gql(runner.http, url, uploader, STATUS, {"id": content_id})
            if found["content"] is None or found["content"]["status"] in ("READY", "DELIVERED", "FAILED"):
                del pending[content_id]
        await asyncio.sleep(0.5)
    if pending:
        outcome.notes.append(f"{len(pending)} contents not READY {SETTLE_SECONDS:.0f} s after the end")
    closed = dict(runner.ledger.capsules)
    while closed and time.monotonic() < deadline:
        for capsule_id, (creator, _) in list(closed.items()):
            found = await gql(runner.http, url, creators[creator].user_id, CAPSULE, {"id": capsule_id})
            if found["capsule"]["status"] in ("AVAILABLE", "VIEWED"):
                del closed[capsule_id]
        await asyncio.sleep(0.5)
    if closed:
        outcome.notes.append(
            f"{len(closed)} scheduled capsules not open {SETTLE_SECONDS:.0f} s after the end"
        )
    # The watchers end at a final status; give the last ones a moment.
    await waited(lambda: all(seen and seen[-1] in FINAL for seen in runner.ledger.watched.values()), 30)


async def check(runner: Soak, people: list[Person], baseline: dict[str, set[str]], outcome: Outcome) -> None:
    from resolvers.domain.notifications import notification_id, unlocked_id
    from store.enums import NotificationType

    ledger = runner.ledger
    url = runner.urls[0]
    # Comments: each content's, by body.
    on_content: dict[str, list[SentComment]] = defaultdict(list)
    for sent in ledger.comments:
        on_content[sent.content_id].append(sent)
    comment_ids: dict[str, str] = {}  # body -> id, as stored
    for content_id, sent_list in on_content.items():
        nodes = await pages(
            runner.http, url, sent_list[0].commenter, ALL_COMMENTS, {"id": content_id}, "content.comments"
        )
        bodies = Counter(n["body"] for n in nodes)
        ids = Counter(n["id"] for n in nodes)
        for node in nodes:
            comment_ids[node["body"]] = node["id"]
        for sent in sent_list:
            outcome.counted[f"comments {sent.outcome}"] += 1
            times = bodies[sent.body]
            if times > 1:
                outcome.doubled.append(f"comment {sent.body} stored {times} times")
            if sent.outcome in ("committed", "applied") and times == 0:
                outcome.lost.append(f"comment {sent.body} ({sent.outcome}) missing")
            if sent.comment_id and ids[sent.comment_id] != 1 and times == 1:
                outcome.lost.append(f"comment {sent.comment_id} answered, stored under another id")
            if sent.outcome == "unknown" and times == 1:
                outcome.counted["comments unknown, found landed"] += 1
    # Notifications, as each person's list holds them.
    held: dict[str, Counter[str]] = {}
    types: dict[str, dict[str, str]] = {}
    for person in people:
        notes = await pages(runner.http, url, person.user_id, ALL_NOTIFICATIONS, {}, "notifications")
        held[person.user_id] = Counter(stored_id(n["id"]) for n in notes)
        types[person.user_id] = {stored_id(n["id"]): n["type"] for n in notes}
        for note_id, times in held[person.user_id].items():
            if times > 1:
                outcome.doubled.append(f"notification {note_id} of {person.user_id} listed {times} times")
    expected_notes = 0
    by_note: dict[str, SentComment] = {}  # to say, of a note a stream missed, how its comment went
    for sent in ledger.comments:
        comment_id = sent.comment_id or comment_ids.get(sent.body)
        if comment_id is not None:
            by_note[notification_id(NotificationType.NEW_COMMENT, comment_id, sent.author_id)] = sent
        if (
            sent.outcome not in ("committed", "applied")
            or comment_id is None
            or sent.author_id == sent.commenter
        ):
            continue
        expected_notes += 1
        note = notification_id(NotificationType.NEW_COMMENT, comment_id, sent.author_id)
        if held[sent.author_id][note] == 0:
            outcome.lost.append(f"NEW_COMMENT {note} for comment {comment_id} missing")
    for capsule_id, (_, recipients) in ledger.capsules.items():
        for user in recipients:
            expected_notes += 1
            if held[user][unlocked_id(capsule_id, user)] == 0:
                outcome.lost.append(f"CAPSULE_UNLOCKED of {capsule_id} for {user} missing")
    # Content that ended READY in the feed has told every other member of its
    # family, in the move's own commit (docs/decisions.md, "READY and the
    # family's NEW_CONTENT notes commit together").
    members_of = {p.family_id: p.family for p in people}
    for family_id, contents in runner.readable.items():
        for content_id, author in contents:
            now = (await gql(runner.http, url, author, STATUS, {"id": content_id}))["content"]
            if now is None or now["status"] not in ("READY", "DELIVERED"):
                continue
            for user in members_of[family_id]:
                if user == author:
                    continue
                expected_notes += 1
                outcome.counted["NEW_CONTENT expected"] += 1
                if held[user][notification_id(NotificationType.NEW_CONTENT, content_id, user)] == 0:
                    outcome.lost.append(f"NEW_CONTENT of {content_id} for {user} missing")
    outcome.counted["notifications expected from committed writes"] = expected_notes
    # The streams: every notification of their kind since they started, once.
    streaming = [p for p in people if p.subscription in SUBSCRIPTIONS]
    wanted = {
        person.user_id: {
            note_id
            for note_id, kind in types[person.user_id].items()
            if note_id not in baseline[person.user_id]
            and (person.subscription == "notificationAdded" or kind == "CAPSULE_UNLOCKED")
        }
        for person in streaming
    }

    def missing(person: Person) -> set[str]:
        got = {stored_id(i) for i in ledger.streams[(person.user_id, person.subscription)]}
        return wanted[person.user_id] - got

    await waited(lambda: not any(missing(p) for p in streaming), 30)  # the last events on their way
    for person in streaming:
        key = (person.user_id, person.subscription)
        got = Counter(stored_id(i) for i in ledger.streams[key])
        outcome.counted["stream events received"] += sum(got.values())
        for note_id, times in got.items():
            if times > 1:
                connections = [
                    connection
                    for event_id, connection in zip(ledger.streams[key], ledger.carried[key], strict=True)
                    if stored_id(event_id) == note_id
                ]
                where = "within one connection" if len(set(connections)) == 1 else "across a reconnect"
                outcome.doubled.append(
                    f"{person.subscription} of {person.user_id} sent {note_id} {times} times, "
                    f"on connections {', '.join(map(str, connections))} ({where})"
                )
        for note_id in sorted(missing(person)):
            how = ""
            sent_with = by_note.get(note_id)
            if sent_with is not None:
                how = f", its comment {sent_with.outcome}: {' → '.join(sent_with.attempts)}"
            found = (
                f"{person.subscription} of {person.user_id} never sent {note_id} "
                f"({types[person.user_id][note_id]}{how})"
            )
            # A comment whose first attempt ended without an answer (its process
            # killed, or its deadline passing while the commit was in flight)
            # may have committed without publishing: comment notes have no
            # outbox, so only a stream resumed from before them promises them.
            unanswered = sent_with is not None and sent_with.attempts[:1] != ["data"]
            (outcome.unpromised if unanswered else outcome.lost).append(found)
    # Status streams end where the content is.
    for content_id, seen in ledger.watched.items():
        outcome.counted["status streams watched"] += 1
        uploader = ledger.contents[content_id]
        now = (await gql(runner.http, url, uploader, STATUS, {"id": content_id}))["content"]
        if now is None:
            continue
        if not seen or (
            seen[-1] != now["status"] and not (seen[-1] == "READY" and now["status"] == "DELIVERED")
        ):
            outcome.lost.append(
                f"contentStatusChanged of {content_id}: saw {seen}, the content is {now['status']}"
            )
        steps = [STATUS_ORDER.index(s) for s in seen if s in STATUS_ORDER]
        if steps != sorted(steps):
            outcome.notes.append(f"contentStatusChanged of {content_id} stepped back: {seen}")


def run(sizes: Sizes, tmp: Path) -> list[Row]:
    from tests.servers import ServerProcess

    run_id = uuid.uuid4().hex[:6]
    log_dir = tmp / "soak"
    log_dir.mkdir(parents=True, exist_ok=True)
    with dynamodb_and_redis(log_dir, f"soak-{run_id}") as engine:
        env = server_env(
            log_dir,
            **engine,
            # Capsules made during the run open in it; one shard, as the tests run
            # DynamoDB: eight, polled every second by three processes, were most
            # of what the one-threaded moto_server did.
            MIFAMILIAS_UNLOCK_POLL_SECONDS="2",
            MIFAMILIAS_UNLOCK_SHARDS="1",
            # A killed process's content is taken over after its lease, not a minute.
            MIFAMILIAS_PIPELINE_LEASE_SECONDS="10",
            MIFAMILIAS_PIPELINE_RECOVERY_SECONDS="5",
            # Fifty people posting for ten minutes: past the hourly upload and capsule
            # limits, which are not what the soak is about.
            MIFAMILIAS_RATE_LIMITS="upload=600/3600,capsule=300/3600",
        )
        servers = [
            ServerProcess(log_dir, env, argv=[sys.executable, str(ROOT / "app.py"), "serve"], name=f"soak{n}")
            for n in range(3)
        ]
        try:
            with ThreadPoolExecutor(len(servers)) as pool:
                list(pool.map(start_server, servers))
            outcome = asyncio.run(soak(sizes, servers, run_id))
        finally:
            for server in servers:
                server.stop()
    return rows_of(sizes, outcome)


def rows_of(sizes: Sizes, outcome: Outcome) -> list[Row]:
    ledger = outcome.ledger
    for kind, found in (
        ("lost", outcome.lost),
        ("doubled", outcome.doubled),
        ("unpromised", outcome.unpromised),
    ):
        for line in found:
            print(f"[soak] {kind}: {line}", file=sys.stderr, flush=True)
    lost, doubled = len(outcome.lost), len(outcome.doubled)
    counted = outcome.counted
    detail = (
        f"{counted['comments committed']} comments answered, {counted['comments applied']} APPLIED, "
        f"{counted['comments unknown']} unknown ({counted['comments unknown, found landed']} landed), "
        f"{counted['comments refused']} refused; {counted['notifications expected from committed writes']} "
        f"notifications expected from them, from {len(ledger.capsules)} scheduled capsules and from "
        f"content READY in the feed ({counted['NEW_CONTENT expected']} NEW_CONTENT); "
        f"{counted['stream events received']} stream events, "
        f"{counted['status streams watched']} status streams"
    )
    if outcome.lost or outcome.doubled:
        detail += "; first: " + "; ".join((outcome.lost + outcome.doubled)[:3])
    rows = [
        Row(
            SECTION,
            MEASURE,
            f"{lost} / {doubled}",
            detail,
            target="0 / 0",
            met=verdict(lost == 0 and doubled == 0),
        ),
        Row(
            SECTION,
            "  kills done (SIGKILL, then started again)",
            str(len(ledger.kills)),
            f"every {sizes.soak_kill_every:.0f} s round robin over 3 processes, at "
            + ", ".join(f"{k:.0f} s" for k in ledger.kills),
        ),
        Row(
            SECTION,
            "  operations done",
            f"{sum(ledger.operations.values()):,}",
            f"{outcome.clients} clients for {outcome.seconds:.0f} s; "
            + ", ".join(f"{k} {v}" for k, v in ledger.operations.most_common())
            + f"; {ledger.retries} retries, {ledger.gave_up} given up, {ledger.reconnects} stream reconnects",
        ),
    ]
    every = [v for values in ledger.latencies.values() for v in values]
    rows.append(
        Row(
            SECTION,
            "  latency p50 / p99 (ms), every operation, retries included",
            f"{percentile(every, 50) * 1000:.0f} / {percentile(every, 99) * 1000:.0f}",
            f"n={len(every)}, max {max(every, default=float('nan')) * 1000:,.0f} ms",
        )
    )
    for kind, values in sorted(ledger.latencies.items()):
        rows.append(
            Row(
                SECTION,
                f"    {kind}",
                f"{percentile(values, 50) * 1000:.0f} / {percentile(values, 99) * 1000:.0f}",
                f"n={len(values)}, median {statistics.median(values) * 1000:.0f} ms" if values else "",
            )
        )
    errors = ", ".join(f"{code} {n}" for code, n in ledger.errors.most_common()) or "none"
    rows.append(Row(SECTION, "  errors by code", str(sum(ledger.errors.values())), errors))
    if outcome.unpromised:
        rows.append(
            Row(
                SECTION,
                "  stream misses outside the promise (a comment committed by an attempt that never answered)",
                str(len(outcome.unpromised)),
                "; ".join(outcome.unpromised[:3]),
            )
        )
    if outcome.notes:
        rows.append(Row(SECTION, "  also seen", str(len(outcome.notes)), "; ".join(outcome.notes[:5])))
    return rows
