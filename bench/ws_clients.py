"""A client process for the fan-out section: holds many graphql-transport-ws
subscriptions with raw `websockets` (a ws:// URL), or Server-Sent Events
streams (graphql-sse, distinct connections) with httpx (an http:// URL), and
stamps every event it receives.

    python -m bench.ws_clients URL [QUERY] < tokens (comma-separated, one line)

Prints "READY <n>" once every subscription is sent; on "COUNT" (stdin) prints
"COUNT <events received so far>" (on "COUNT <label>", those of that label), so
a caller can wait for its deliveries without guessing how long they take; on "STOP" prints one JSON line:
[[time.time(), capsule id], ...] and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx
import websockets
from websockets.typing import Subprotocol

SUBSCRIPTION = "subscription { capsuleUnlocked { capsule { id status } unlockedAt } }"


def label(data: dict[str, object]) -> str:
    """What an event is about: the capsule's id, or the content's status."""
    (value,) = data.values()
    assert isinstance(value, dict)
    if "capsule" in value:
        return str(value["capsule"]["id"])
    return str(value.get("status", ""))


async def client(
    url: str,
    token: str,
    received: list[tuple[float, str]],
    ready: asyncio.Event,
    limit: asyncio.Semaphore,
    query: str = SUBSCRIPTION,
) -> None:
    async with limit:  # a few handshakes at a time
        ws = await websockets.connect(
            url,
            subprotocols=[Subprotocol("graphql-transport-ws")],
            open_timeout=120,
            ping_interval=None,
            max_queue=None,
        )
        await ws.send(
            json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}})
        )
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "connection_ack":
                break
            if message["type"] not in ("ping", "pong"):
                raise RuntimeError(f"refused: {message}")
        await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": query}}))
    ready.set()
    async with ws:
        async for raw in ws:
            stamp = time.time()
            message = json.loads(raw)
            if message["type"] == "next":
                data = message["payload"].get("data")
                # A refusal (the budget spent) is an event too, with errors and no data.
                received.append((stamp, label(data) if data else "REFUSED"))
            elif message["type"] == "ping":
                await ws.send('{"type":"pong"}')
            elif message["type"] in ("error", "complete"):
                raise RuntimeError(f"subscription ended: {message}")


async def sse_client(
    http: httpx.AsyncClient,
    url: str,
    token: str,
    received: list[tuple[float, str]],
    ready: asyncio.Event,
    limit: asyncio.Semaphore,
    query: str = SUBSCRIPTION,
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    async with limit:  # a few requests at a time
        stream = http.stream("POST", url, json={"query": query}, headers=headers)
        response = await stream.__aenter__()
    try:
        if response.status_code != 200:
            raise RuntimeError(f"refused: {response.status_code} {await response.aread()!r}")
        ready.set()
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "next":
                stamp = time.time()
                payload = json.loads(line.split(":", 1)[1])
                received.append((stamp, label(payload["data"])))
            elif line.startswith("data:") and event == "complete":
                raise RuntimeError("subscription ended")
    finally:
        await stream.__aexit__(None, None, None)


async def main() -> None:
    url = sys.argv[1]
    query = sys.argv[2] if len(sys.argv) > 2 else SUBSCRIPTION
    tokens = [t for t in sys.stdin.readline().strip().split(",") if t]
    received: list[tuple[float, str]] = []
    limit = asyncio.Semaphore(20)
    events = [asyncio.Event() for _ in tokens]
    http = httpx.AsyncClient(timeout=httpx.Timeout(None), limits=httpx.Limits(max_connections=None))
    if url.startswith("http"):
        tasks = [
            asyncio.create_task(sse_client(http, url, t, received, e, limit, query))
            for t, e in zip(tokens, events, strict=True)
        ]
    else:
        tasks = [
            asyncio.create_task(client(url, t, received, e, limit, query))
            for t, e in zip(tokens, events, strict=True)
        ]
    everyone: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in events)))
    waiting: list[asyncio.Future[Any]] = [everyone, *tasks]
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    failed = [repr(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception()]
    print(f"READY {len(tokens)} {len(failed)} {'; '.join(failed[:3])}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "STOP":
            break
        if line.strip() == "COUNT":
            print(f"COUNT {len(received)}", flush=True)
        elif line.startswith("COUNT "):  # the events of one label
            wanted = line[len("COUNT ") :].strip()
            print(f"COUNT {sum(1 for _, seen in received if seen == wanted)}", flush=True)
    failed = [repr(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception()]
    print(json.dumps({"received": received, "failed": failed[:5], "failures": len(failed)}), flush=True)
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main())
