"""Section 6: robustness. `/healthz` latency (p50, p99) from a prober process
while the server takes, one at a time: (a) the amplification query sent over and
over, (b) a 9400×9400 PNG going through the pipeline, (c) 30 MB request bodies,
(d) one status change delivered to many `contentStatusChanged` subscriptions,
(e) 60 subscribers that stop reading beside 30 that read, (f) the cost-bypass
forms (a size sent as `100.0`, or a declared default) from 4 clients, (g) 20
heavy subscriptions of one person (the per-person default bound, on the
default cost budget) while another person comments, (h) 4 clients sending the most expensive
query the cost limit admits, on a feed of 100, (i) 20 replays (`after`) of that
heavy selection by one person at once; and, measured apart, (e) on DynamoDB
(moto) with Redis too, (j) another person's push behind 20 slow devices, and
(k) a long recording (two hours in the full run) being transcoded.
The baseline is the same prober against the idle server, in the same run. For
(b), the server's memory (its own, and with its child processes) during and after."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, Row, Sizes, server_env, token, verdict
from bench.fanout import Clients
from bench.processes import LOAD_CPU, cpu_seconds, graphql_server, pinned
from tests.api.test_limits import amplification, bypass

SECTION = "6. Robustness"
P99_TARGET_MS = 100.0
RSS_TARGET_MB = 300.0
HEAVY_SUBSCRIPTIONS = 20
PARALLEL_REPLAYS = 20
SUBSCRIBING_PEOPLE = 100


class Probe:
    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            pinned(LOAD_CPU, [sys.executable, "-m", "bench.probe", url]),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "READY":
            raise RuntimeError("the prober did not start")

    def stop(self) -> tuple[list[float], int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("STOP\n")
        self.proc.stdin.flush()
        found = json.loads(self.proc.stdout.readline())
        self.proc.wait(timeout=30)
        return list(found["latencies"]), int(found["failures"])


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def tree_rss_kb(pid: int) -> tuple[int, int]:
    """(the process's own VmRSS, with every descendant's) in KB."""

    def rss(p: int) -> int:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return 0
        return 0

    def children(p: int) -> list[int]:
        found: list[int] = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                found += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
        return found

    own = rss(pid)
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss(p)
        stack += children(p)
    return own, total


def gql(base: str, user: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    response = httpx.post(
        f"{base}/graphql",
        json={"query": query, "variables": variables or {}},
        headers={"Authorization": f"Bearer {token(user)}"},
        timeout=120,
    )
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(f"{query[:60]}: {body['errors']}")
    return body["data"]


def upload(base: str, user: str, family_id: str, kind: str, body: bytes, mime: str) -> str:
    """Content made from `body`, sent in one PUT or, above the server's
    threshold, in parts, then completed: its id."""
    created = gql(
        base,
        user,
        "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl partSizeBytes"
        " parts { number url sizeBytes } content { id } } }",
        {"i": {"familyId": family_id, "type": kind, "mimeType": mime, "sizeBytes": len(body)}},
    )["createUpload"]
    step = created["partSizeBytes"]
    if step is None:
        sends = [(created["uploadUrl"], body, {"Content-Type": mime})]
    else:  # a part's URL is signed for no type
        sends = [(p["url"], body[(p["number"] - 1) * step :][: p["sizeBytes"]], {}) for p in created["parts"]]
    for url, data, headers in sends:
        httpx.put(url, content=data, headers=headers, timeout=120).raise_for_status()
    content_id = str(created["content"]["id"])
    gql(base, user, "mutation($id: ID!) { completeUpload(contentId: $id) { id } }", {"id": content_id})
    return content_id


def status(base: str, user: str, content_id: str) -> tuple[str, str | None]:
    found = gql(
        base, user, "query($id: ID!) { content(id: $id) { status failureReason } }", {"id": content_id}
    )
    return str(found["content"]["status"]), found["content"]["failureReason"]


def png(side: int) -> bytes:
    from PIL import Image, ImageDraw

    picture = Image.new("RGBA", (side, side), (210, 180, 140, 255))
    ImageDraw.Draw(picture).ellipse(
        (side // 4, side // 4, side * 3 // 4, side * 3 // 4), fill=(40, 90, 160, 200)
    )
    out = io.BytesIO()
    picture.save(out, "PNG", optimize=True)
    return out.getvalue()


def repeatedly(seconds: float, threads: int, send: Callable[[httpx.Client], None]) -> int:
    """`send` from `threads` threads for `seconds`; how many were sent."""
    deadline = time.monotonic() + seconds
    sent = [0] * threads

    def worker(n: int) -> None:
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < deadline:
                # A refused 30 MB body may end with a reset connection.
                with contextlib.suppress(httpx.HTTPError):
                    send(client)
                sent[n] += 1

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(sent)


def run(sizes: Sizes, log_dir: Path, cases: str = "") -> list[Row]:
    """Every case, or those whose letters `cases` names (`d`, `a,d`); the idle
    baseline always."""

    def wanted(case: str) -> bool:
        return not cases or case in {c.strip() for c in cases.split(",")}

    data_dir = log_dir / "robustness"
    data_dir.mkdir(parents=True, exist_ok=True)
    # (g) holds 20 subscriptions as one person, as the default bound allows, and
    # pays each event from the default budget; (d) holds thousands as one person.
    env = server_env(data_dir, MIFAMILIAS_PIPELINE_WORKERS="2")
    seconds = sizes.robust_seconds
    results: dict[str, tuple[list[float], int, str]] = {}
    memory: dict[str, float] = {}
    fan_out: list[Row] = []
    with graphql_server(env, log_dir) as server:
        base = server.url
        health = f"{base}/healthz"
        family = gql(base, "ana", 'mutation { createFamily(input: {name: "Bench"}) { id inviteCode } }')
        family_id = family["createFamily"]["id"]
        invite = family["createFamily"]["inviteCode"]
        gql(base, "ben", "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }", {"c": invite})

        def measure(name: str, load: Callable[[], str]) -> None:
            probe = Probe(health)
            try:
                detail = load()
            finally:
                latencies, failures = probe.stop()
            results[name] = (latencies, failures, detail)

        def idle() -> str:
            time.sleep(seconds)  # the baseline: the prober alone against the idle server
            return "no load"

        measure("idle (baseline)", idle)

        query = amplification()

        def amplify() -> str:
            def send(client: httpx.Client) -> None:
                client.post(
                    f"{base}/graphql",
                    json={"query": query, "variables": {"id": family_id}},
                    headers={"Authorization": f"Bearer {token('ana')}"},
                )

            return f"{repeatedly(seconds, 4, send)} queries from 4 threads, each refused by the cost limit"

        if wanted("a"):
            measure("(a) amplification query, repeatedly", amplify)

        def photo(side: int, key: str) -> Callable[[], str]:
            def load() -> str:
                body = png(side)
                own_before, tree_before = tree_rss_kb(server.process.pid)  # type: ignore[union-attr]
                content_id = upload(base, "ana", family_id, "PHOTO", body, "image/png")
                peak_own, peak_tree = own_before, tree_before
                deadline = time.monotonic() + 300
                state, reason = status(base, "ana", content_id)
                while state not in ("READY", "FAILED") and time.monotonic() < deadline:
                    own, tree = tree_rss_kb(server.process.pid)  # type: ignore[union-attr]
                    peak_own, peak_tree = max(peak_own, own), max(peak_tree, tree)
                    time.sleep(0.02)
                    state, reason = status(base, "ana", content_id)
                time.sleep(1.0)  # let the child process exit and the allocator settle
                own_after, _ = tree_rss_kb(server.process.pid)  # type: ignore[union-attr]
                memory[f"{key} peak"] = (peak_own - own_before) / 1024
                memory[f"{key} peak, with child processes"] = (peak_tree - tree_before) / 1024
                memory[f"{key} after"] = (own_after - own_before) / 1024
                return f"{len(body) // 1024} KB PNG, {side}×{side} RGBA: {state}" + (
                    f" ({reason})" if reason else ""
                )

            return load

        if wanted("b"):
            measure("(b) 9400×9400 PNG through the pipeline", photo(9400, "(b)"))
            measure("(b′) 6000×6000 PNG (36 MP, under the cap)", photo(6000, "(b′)"))

        big = b'{"query": "{ me { id } }", "variables": {"ids": [' + b",".join([b'"xx"'] * 6_000_000) + b"]}}"

        def bodies() -> str:
            def send(client: httpx.Client) -> None:
                client.post(
                    f"{base}/graphql",
                    content=big,
                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {token('ana')}"},
                )

            return (
                f"{repeatedly(seconds, 2, send)} bodies of {len(big) / 1e6:.0f} MB from 2 threads, each 413"
            )

        if wanted("c"):
            measure("(c) 30 MB bodies", bodies)

        forms = [
            (bypass("$n: Int"), {"id": family_id, "n": 100.0}),
            (bypass("$n: Int = 100"), {"id": family_id}),
        ]

        def bypasses() -> str:
            def send(client: httpx.Client) -> None:
                query, variables = forms[int(time.monotonic() * 10) % 2]
                answer = client.post(
                    f"{base}/graphql",
                    json={"query": query, "variables": variables},
                    headers={"Authorization": f"Bearer {token('cy')}"},
                ).json()
                refused.append("cost" in (answer.get("errors") or [{}])[0].get("extensions", {}))

            refused: list[bool] = []
            sent = repeatedly(seconds, 4, send)
            return (
                f"{sent} queries from 4 threads (float and default forms), "
                f"{sum(refused)} refused by the cost limit"
            )

        gql(base, "cy", "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }", {"c": invite})
        if wanted("f"):
            measure("(f) the cost-bypass forms, 4 clients", bypasses)

        # A feed of 100 for (g) and (h): half from each member (the upload limit is per person).
        for n in range(100 if wanted("g") or wanted("h") or wanted("i") else 0):
            upload(base, "ana" if n % 2 else "ben", family_id, "TEXT", f"nota {n}".encode(), "text/plain")
        note_id = upload(base, "ana", family_id, "TEXT", b"de ana", "text/plain")

        # (g): about 4,500 points an event: 15 aliased feeds of 100 with authors.
        feeds = " ".join(
            f"f{n}: feed(first: 100) {{ edges {{ node {{ id title author {{ givenName }} }} }} }}"
            for n in range(15)
        )
        heavy = f"subscription {{ notificationAdded {{ id family {{ {feeds} }} }} }}"
        holding = HEAVY_SUBSCRIPTIONS if wanted("g") or wanted("i") else 0
        heavy_clients = Clients(server.ws_url, [token("ana")] * holding, 1, heavy)

        def comments() -> str:
            sent = failed = 0
            for n in range(10):
                try:
                    gql(
                        base,
                        "ben",
                        "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
                        {"c": note_id, "b": f"comentario {n}"},
                    )
                    sent += 1
                except RuntimeError:  # stopped at its deadline: said in the row
                    failed += 1
            time.sleep(seconds)
            return (
                f"{HEAVY_SUBSCRIPTIONS} subscriptions of ~4,500 points an event (one person), "
                f"{sent} comments by another ({failed} stopped at the deadline); "
                "the default budget; "
                f"{heavy_clients.count()} events delivered"
            )

        try:
            heavy_clients.wait_ready()
            if wanted("g") or wanted("i"):  # (i) replays what (g)'s comments made
                measure(f"(g) {HEAVY_SUBSCRIPTIONS} heavy subscriptions while another comments", comments)
        finally:
            heavy_clients.stop()

        # (i): the same heavy selection, replayed by 20 subscriptions of one
        # person at once from their oldest notification (the comments above).
        oldest = gql(base, "ana", "{ notifications(first: 100) { edges { node { id } } } }")
        after = (oldest["notifications"]["edges"] or [{"node": {"id": ""}}])[-1]["node"]["id"]
        replay = heavy.replace("notificationAdded {", f"notificationAdded(after: {json.dumps(after)}) {{")

        def replays() -> str:
            clients = Clients(server.ws_url, [token("ana")] * PARALLEL_REPLAYS, 1, replay)
            try:
                clients.started()
                time.sleep(seconds)
            finally:
                received = clients.stop()
            refused = sum(1 for _, label in received if label == "REFUSED")
            return (
                f"{PARALLEL_REPLAYS} replays of one person at once, each of "
                f"{len(oldest['notifications']['edges']) - 1} notifications at ~4,500 points an event; "
                f"the default budget and replay turns; {len(received) - refused} events delivered, "
                f"{refused} replays refused by the budget"
            )

        if wanted("i"):
            measure(f"(i) {PARALLEL_REPLAYS} parallel replays of one person", replays)

        # (h): 24 aliased feeds of 100 ids and titles: 4,825, under the limit of 5,000.
        admitted = " ".join(
            f"f{n}: feed(first: 100) {{ edges {{ node {{ id title }} }} }}" for n in range(24)
        )
        most = f"query($id: ID!) {{ family(id: $id) {{ {admitted} }} }}"

        def expensive() -> str:
            def send(client: httpx.Client) -> None:
                client.post(
                    f"{base}/graphql",
                    json={"query": most, "variables": {"id": family_id}},
                    headers={"Authorization": f"Bearer {token('cy')}"},
                )

            return f"{repeatedly(seconds, 4, send)} queries of cost 4,825 from 4 threads"

        if wanted("h"):
            measure("(h) the most expensive admitted query, 4 clients", expensive)

        content_id = upload(base, "ana", family_id, "TEXT", b"hola", "text/plain")
        deadline = time.monotonic() + 60
        while status(base, "ana", content_id)[0] != "READY" and time.monotonic() < deadline:
            time.sleep(0.05)
        subscribers = sizes.robust_subscribers
        query_text = (
            f"subscription {{ contentStatusChanged(contentId: {json.dumps(content_id)}) {{ id status }} }}"
        )
        # Spread over members, each well within the budget (every subscription's
        # first event, the status now, is charged): one person holding thousands of
        # subscriptions would spend theirs at the start, which is (g)'s point, not this row's.
        people = [f"fan{n}" for n in range(SUBSCRIBING_PEOPLE)]
        for person in people:
            gql(base, person, "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }", {"c": invite})
        tokens = [token(people[n % len(people)]) for n in range(subscribers)]
        clients = Clients(server.ws_url, tokens, sizes.fanout_processes, query_text)

        def status_change() -> str:
            started = time.monotonic()
            gql(
                base,
                "ben",
                "mutation($id: ID!) { markContentViewed(contentId: $id) { status } }",
                {"id": content_id},
            )
            return f"{subscribers} subscriptions; the change published at +{time.monotonic() - started:.2f} s"

        try:
            clients.wait_ready()
            # Every subscription's first event (the status now) is in before the change.
            settle = time.monotonic() + 120
            while clients.count("READY") < subscribers and time.monotonic() < settle:
                time.sleep(0.2)
            measure_started = time.monotonic()
            probe = Probe(health)
            try:
                cpu_before = cpu_seconds(server.process.pid)  # type: ignore[union-attr]
                published = time.time()
                detail = status_change()
                # Until every subscriber has the change, or a minute has passed.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and clients.count("DELIVERED") < subscribers:
                    time.sleep(0.05)
                cpu = cpu_seconds(server.process.pid) - cpu_before  # type: ignore[union-attr]
                time.sleep(max(0.0, 1.0 - (time.monotonic() - measure_started)))
            finally:
                latencies, failures = probe.stop()
        finally:
            received = clients.stop()
        stamps = [stamp for stamp, label in received if label == "DELIVERED"]
        delivered = len(stamps)
        last = max(stamps, default=float("nan")) - published
        within = (
            f"{delivered:,} of {subscribers:,} received it, the last {last:.2f} s after the change; "
            f"the server's CPU meanwhile {cpu:.2f} s"
        )
        results[f"(d) one status change to {subscribers} subscriptions"] = (
            latencies,
            failures,
            f"{detail}; {within}",
        )
        load = f"load average {os.getloadavg()[0]:.2f} after"
        fan_out += [
            Row(
                SECTION,
                f"{subscribers:,} status subscribers, budget on: change → last delivery",
                f"{last:.2f} s",
                f"{within}; {SUBSCRIBING_PEOPLE} people, the default budget; {load}",
                target="≤ 2 s, every one",
                met=verdict(delivered == subscribers and last <= 2.0),
            ),
            Row(
                SECTION,
                f"/healthz p99 during the {subscribers:,}-subscriber fan-out",
                f"{percentile(latencies, 99):.1f} ms",
                f"p50 {percentile(latencies, 50):.1f} ms, n={len(latencies)}, {failures} failed, "
                f"from the change until the last delivery (at least 1 s); {load}",
                target="≤ 50 ms",
                met=verdict(failures == 0 and percentile(latencies, 99) <= 50.0),
            ),
        ]
    rows = rows_of(results, memory) + fan_out
    if wanted("e"):
        rows += slow_readers(sizes, log_dir, "sqlite")
        rows += slow_readers(sizes, log_dir, "dynamodb")
    if wanted("j"):
        rows += push_behind_slow_devices(log_dir)
    if wanted("k"):
        rows += long_transcode(sizes, log_dir)
    return rows


def recording_seconds(sizes: Sizes) -> int:
    """Two hours in the full run; the smaller sizes keep it in proportion."""
    return int(7200 * min(1.0, sizes.robust_seconds / 10.0) ** 2) or 1


def long_recording(dir: Path, seconds: int) -> bytes:
    """A voice message of `seconds` (a tone: speech recognition is not what is measured)."""
    from imageio_ffmpeg import get_ffmpeg_exe

    out = dir / "recording.m4a"
    tone = f"sine=frequency=220:duration={seconds}"
    encode = ["-ac", "1", "-ar", "16000", "-c:a", "aac", "-b:a", "24k", str(out)]
    subprocess.run([get_ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", tone, *encode], check=True)
    return out.read_bytes()


def long_transcode(sizes: Sizes, log_dir: Path) -> list[Row]:
    """(k) `/healthz` while a long recording is transcoded (the media work runs
    in child processes at a lower priority), in a server of its own: the
    measure starts once the content is TRANSCODING and lasts the scenario's
    seconds, or until the transcode ends."""
    data_dir = log_dir / "long-transcode"
    data_dir.mkdir(parents=True, exist_ok=True)
    seconds = recording_seconds(sizes)
    body = long_recording(data_dir, seconds)
    with graphql_server(server_env(data_dir), log_dir) as server:
        base = server.url
        family = gql(base, "ana", 'mutation { createFamily(input: {name: "Bench"}) { id } }')
        content_id = upload(base, "ana", family["createFamily"]["id"], "AUDIO", body, "audio/mp4")
        deadline = time.monotonic() + 300
        state, _ = status(base, "ana", content_id)
        while state in ("UPLOADING", "PROCESSING") and time.monotonic() < deadline:
            time.sleep(0.05)
            state, _ = status(base, "ana", content_id)
        probe = Probe(f"{base}/healthz")
        started = time.monotonic()
        try:
            while state == "TRANSCODING" and time.monotonic() - started < sizes.robust_seconds:
                time.sleep(0.1)
                state, _ = status(base, "ana", content_id)
        finally:
            latencies, failures = probe.stop()
        measured = time.monotonic() - started
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    return [
        Row(
            SECTION,
            "/healthz p50 / p99 (ms): (k) a long recording transcoded",
            f"{p50:.1f} / {p99:.1f}",
            f"n={len(latencies)}, max {max(latencies, default=float('nan')):.1f} ms, {failures} failed; "
            f"a {seconds / 3600:.2f} h recording ({len(body) // 1024} KB), measured for {measured:.1f} s "
            f"of its transcode (then {state})",
            target=f"p99 ≤ {P99_TARGET_MS:.0f} ms",
            met=verdict(p99 <= P99_TARGET_MS and failures == 0),
        )
    ]


DELIVERY_TARGET_S = 2.0


def slow_readers(sizes: Sizes, log_dir: Path, engine: str) -> list[Row]:
    """(e) 60 subscribers that stop reading, with large selections, beside 30
    of another family that read (fewer in the smaller sizes) (tests/test_slow_clients.py's scenario):
    /healthz p99 meanwhile, and how late after its date the normal ones get a
    capsule's opening. A server of its own, on `engine` (DynamoDB: a table on
    a moto_server of its own, and Redis): the scheduler polls, slow clients are
    let go after 5 s."""
    from tests.servers import SECRET as TEST_SECRET  # the scenario's tokens
    from tests.test_slow_clients import slow_and_normal

    slow_count, normal_count = sizes.slow_readers, sizes.normal_readers
    data_dir = log_dir / f"slow-readers-{engine}"
    data_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        extra: dict[str, str] = {}
        if engine == "dynamodb":
            extra = stack.enter_context(dynamodb_with_redis(log_dir))
        env = server_env(
            data_dir,
            MIFAMILIAS_UNLOCK_POLL_SECONDS="0.5",
            MIFAMILIAS_SLOW_CLIENT_SECONDS="5",
            MIFAMILIAS_AUTH_SECRET=TEST_SECRET,
            **extra,
        )
        with graphql_server(env, log_dir) as server:
            probe = Probe(f"{server.url}/healthz")
            try:
                outcome = asyncio.run(slow_and_normal(server, slow_count, normal_count))
            finally:
                latencies, failures = probe.stop()
    on = "SQLite" if engine == "sqlite" else "DynamoDB (moto) and Redis"
    name = f"(e) {slow_count} slow readers beside {normal_count} normal subscribers, {on}"
    closed = sum(1 for code in outcome.codes if code == 4408)
    rows = rows_of(
        {
            name: (
                latencies,
                failures,
                f"{closed} of {slow_count} slow sockets closed 4408, {outcome.let_go:.0f} counted; "
                f"{outcome.processed - normal_count:.0f} events processed for the slow connections",
            )
        },
        {},
    )[:1]
    late_p50, late_p99 = percentile(outcome.late, 50), percentile(outcome.late, 99)
    rows.append(
        Row(
            SECTION,
            f"normal subscribers' delivery after the capsule's date (s), {name}",
            f"{late_p50:.2f} / {late_p99:.2f}",
            f"p50 / p99 of {len(outcome.late)}; the unlock poll is 0.5 s",
            target=f"≤ {DELIVERY_TARGET_S:.0f} s",
            met=verdict(len(outcome.late) == normal_count and late_p99 <= DELIVERY_TARGET_S),
        )
    )
    return rows


@contextlib.contextmanager
def dynamodb_with_redis(log_dir: Path) -> Iterator[dict[str, str]]:
    """A table on a moto_server of its own, and Redis: a server's environment."""
    from bench.scaleout import shared_redis
    from bench.unlock import use_moto_credentials
    from resolvers.adapters.webpush import new_private_key
    from store.dynamodb import create_table, open_dynamo_table
    from tests.servers import moto_server_process

    async def made(url: str, name: str) -> None:
        async with open_dynamo_table(name, url, "us-east-1") as table:
            await create_table(table.client, name)

    use_moto_credentials()
    with moto_server_process(log_dir) as (url, _), shared_redis(log_dir) as redis_url:
        asyncio.run(made(url, "bench-slow-readers"))
        yield {
            "MIFAMILIAS_DYNAMODB_ENDPOINT": url,
            "MIFAMILIAS_AWS_REGION": "us-east-1",
            "MIFAMILIAS_TABLE_NAME": "bench-slow-readers",
            "MIFAMILIAS_UNLOCK_SHARDS": "1",
            # A server on DynamoDB is given its VAPID key, as a deployment's hosts are.
            "MIFAMILIAS_VAPID_PRIVATE_KEY": new_private_key(),
            "MIFAMILIAS_REDIS_URL": redis_url,
        }


SLOW_DEVICES, SLOW_DEVICE_SECONDS, SLOW_NOTES = 20, 9.0, 30
PUSH_TARGET_S = 1.0


def push_behind_slow_devices(log_dir: Path) -> list[Row]:
    """(j) One person's 20 devices answer 9 s after each push; 30 notes for
    them are queued before another person's one (tests/api/test_push.py's
    scenario, timed): how long the other's push takes, against the same with
    devices that answer at once, in the same run."""

    late = asyncio.run(_push_latency(log_dir / "push-slow", SLOW_DEVICE_SECONDS))
    quick = asyncio.run(_push_latency(log_dir / "push-quick", 0.0))
    return [
        Row(
            SECTION,
            f"another person's push latency (s), (j) behind {SLOW_DEVICES} devices answering in "
            f"{SLOW_DEVICE_SECONDS:.0f} s",
            f"{late:.2f}",
            f"{SLOW_NOTES} notes to the slow devices queued first; the same with devices answering "
            f"at once: {quick:.2f} s (ratio {late / max(quick, 1e-3):.2f}); embedded store, in process",
            target=f"≤ {PUSH_TARGET_S:.0f} s",
            met=verdict(late <= PUSH_TARGET_S),
        )
    ]


async def _push_latency(data_dir: Path, device_seconds: float) -> float:
    from store.enums import NotificationType
    from tests.api.conftest import running_api
    from tests.api.test_push import pushed, register
    from tests.api.test_resume import note_for
    from tests.factories import family_with_members
    from tests.push_service import running_push_service

    with running_push_service() as service:
        changes = {"push_allowed_origins": (service.origin,)}
        async with running_api("sqlite", "local", data_dir, None, **changes) as api:  # type: ignore[arg-type]
            service.server_key = (await api.ok("{ webPushPublicKey }", as_="ana"))["webPushPublicKey"]
            family_id = await family_with_members(api, "ana", ["ben", "cy"])
            slow = [f"ben-{n}" for n in range(SLOW_DEVICES)]
            for name in slow:
                await register(api, service, "ben", name)
            await register(api, service, "cy", "cy-phone")
            await pushed(api)
            for name in slow:
                service.delays[name] = device_seconds
            pending = NotificationType.MEMBER_PENDING  # pushed by default
            bens = [(await note_for(api, "ben", family_id, pending)).key for _ in range(SLOW_NOTES)]
            cys = (await note_for(api, "cy", family_id, pending)).key
            started = time.monotonic()
            for key in [*bens, cys]:
                api.services.pusher.submit(key)
            deadline = started + 300
            while not service.to("cy-phone"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the other person's push never came")
                await asyncio.sleep(0.01)
            took = time.monotonic() - started
            for name in slow:
                service.delays[name] = 0.0  # what is left goes out at once
            return took


def rows_of(results: dict[str, tuple[list[float], int, str]], memory: dict[str, float]) -> list[Row]:
    rows: list[Row] = []
    for name, (latencies, failures, detail) in results.items():
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        baseline = name.startswith("idle")
        rows.append(
            Row(
                SECTION,
                f"/healthz p50 / p99 (ms): {name}",
                f"{p50:.1f} / {p99:.1f}",
                f"n={len(latencies)}, max {max(latencies, default=float('nan')):.1f} ms, "
                f"{failures} failed; {detail}",
                target="" if baseline else f"p99 ≤ {P99_TARGET_MS:.0f} ms",
                met="" if baseline else verdict(p99 <= P99_TARGET_MS and failures == 0),
            )
        )
    for key, growth in memory.items():
        peak = "peak" in key
        rows.append(
            Row(
                SECTION,
                f"server RSS growth, {key} (MB)",
                f"{growth:.0f}",
                "during the pipeline's work" if peak else "1 s after the content reached its final state",
                target=f"≤ {RSS_TARGET_MB:.0f} MB" + ("" if peak else ", returned"),
                met=verdict(growth <= RSS_TARGET_MB) if key.startswith("(b)") else "",
            )
        )
    if results:
        all_p99 = [percentile(v[0], 99) for v in results.values()]
        rows.append(Row(SECTION, "median of the scenarios' p99 (ms)", f"{statistics.median(all_p99):.1f}"))
    return rows
