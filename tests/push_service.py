"""A Web Push service for the tests, on loopback: it checks each request as a
real push service would (RFC 8030 headers, RFC 8292 VAPID against the
server's public key) and decrypts each payload with the subscription's own
private key and auth secret (RFC 8291, http_ece), so a test sees what a
browser would show. It answers what a test tells it to (201, 410, 429 with
Retry-After...), per subscription."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import http_ece
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Browser:
    """One browser's subscription: its keys, as `PushSubscription.toJSON()` gives them."""

    name: str
    endpoint: str
    private_key: ec.EllipticCurvePrivateKey
    auth: bytes

    @property
    def p256dh(self) -> str:
        raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return b64url(raw)

    def input(self, name: str | None = None) -> dict[str, Any]:
        return {
            "platform": "WEB",
            "endpoint": self.endpoint,
            "p256dh": self.p256dh,
            "auth": b64url(self.auth),
            "name": name or self.name,
        }


@dataclass
class Received:
    browser: str
    payload: dict[str, Any]
    headers: dict[str, str]
    claims: dict[str, Any]


@dataclass
class PushService:
    origin: str
    server_key: str | None = None  # the application server's VAPID key, base64url
    browsers: dict[str, Browser] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # What to answer, per browser: a queue of (status, headers); 201 when empty.
    answers: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Browsers whose next request is held before it is read, and the requests held.
    gates: dict[str, threading.Event] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)
    # Browsers whose every request waits, read but unanswered, until the event
    # is set, then is answered as usual: a slow device, for as long as a test says.
    stalls: dict[str, threading.Event] = field(default_factory=dict)
    stalled: list[str] = field(default_factory=list)
    # Browsers whose every request is answered this many seconds after it came.
    delays: dict[str, float] = field(default_factory=dict)
    # False for the bench: every request is accepted and timed, unread.
    verify: bool = True
    accepted_at: list[float] = field(default_factory=list)

    def hold_next(self, name: str) -> threading.Event:
        """The next request to `name` waits, unread and unanswered, until the
        event is set: as if the sender were cut off mid-send."""
        with self.lock:
            self.gates[name] = threading.Event()
            return self.gates[name]

    def stall(self, name: str) -> threading.Event:
        """Every request to `name` waits until the event is set: a slow device."""
        with self.lock:
            return self.stalls.setdefault(name, threading.Event())

    def gate(self, path: str) -> bool:
        """False if the request was held (it is then dropped, never accepted)."""
        name = path.rsplit("/", 1)[-1]
        with self.lock:
            stall = self.stalls.get(name)
            if stall is not None:
                self.stalled.append(name)
        if stall is not None:
            stall.wait(120)
        delay = self.delays.get(name)
        if delay:
            time.sleep(delay)  # this request's own thread: a device that answers late
        with self.lock:
            gate = self.gates.pop(name, None)
            if gate is not None:
                self.held.append(name)
        if gate is None:
            return True
        gate.wait(120)
        return False

    def browser(self, name: str) -> Browser:
        found = Browser(
            name, f"{self.origin}/push/{name}", ec.generate_private_key(ec.SECP256R1()), os.urandom(16)
        )
        self.browsers[name] = found
        return found

    def answer(self, name: str, status: int, headers: dict[str, str] | None = None, times: int = 1) -> None:
        with self.lock:
            self.answers.setdefault(name, []).extend([(status, headers or {})] * times)

    def to(self, name: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.browser == name]

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        name = path.rsplit("/", 1)[-1]
        if not self.verify:
            with self.lock:
                self.accepted_at.append(time.monotonic())
            return 201, {}
        browser = self.browsers.get(name)
        if browser is None:
            return 404, {}
        with self.lock:
            queued = self.answers.get(name)
            if queued:
                status, extra = queued.pop(0)
                if status >= 300:
                    return status, extra
        try:
            claims = self.check(headers)
            plain = http_ece.decrypt(
                body, private_key=browser.private_key, auth_secret=browser.auth, version="aes128gcm"
            )
            payload = json.loads(plain)
        except Exception as error:
            with self.lock:
                self.problems.append(f"{name}: {type(error).__name__}: {error}")
            return 400, {}
        with self.lock:
            self.received.append(Received(name, payload, headers, claims))
        return 201, {"Location": f"{self.origin}/message/{len(self.received)}"}

    def check(self, headers: dict[str, str]) -> dict[str, Any]:
        """RFC 8030 and RFC 8292, as a push service checks them."""
        assert headers.get("content-encoding") == "aes128gcm", headers
        assert headers.get("ttl", "").isdigit(), headers
        assert headers.get("urgency") in ("very-low", "low", "normal", "high"), headers
        topic = headers.get("topic")
        if topic is not None:
            assert len(topic) <= 32 and all(c.isalnum() or c in "-_" for c in topic), topic
        scheme, _, rest = headers.get("authorization", "").partition(" ")
        assert scheme == "vapid", headers
        parts = dict(part.strip().split("=", 1) for part in rest.split(","))
        assert self.server_key is not None and parts["k"] == self.server_key, "not the server's key"
        public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(parts["k"]))
        assert jwt.get_unverified_header(parts["t"])["alg"] == "ES256"
        claims: dict[str, Any] = jwt.decode(
            parts["t"],
            public,
            algorithms=["ES256"],
            audience=self.origin,
            options={"require": ["exp", "sub"]},
        )
        assert claims["exp"] <= time.time() + 24 * 3600, "exp more than 24 hours ahead"
        assert str(claims["sub"]).startswith(("mailto:", "https:")), claims
        return claims


@contextlib.contextmanager
def running_push_service(verify: bool = True) -> Iterator[PushService]:
    holder: dict[str, PushService] = {}

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as push services do (HTTP/1.0 closes each connection,
        # which a pooled client can find closed under its next request).
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if not holder["service"].gate(self.path):
                self.close_connection = True
                return
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, extra = holder["service"].handle(self.path, headers, body)
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # A push service takes many connections at once: the pusher opens up to
        # its bound per push service together (socketserver's backlog is 5).
        request_queue_size = 256

    server = Server(("127.0.0.1", 0), Handler)
    service = PushService(f"http://127.0.0.1:{server.server_address[1]}", verify=verify)
    holder["service"] = service
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        server.shutdown()
        server.server_close()
