"""A push to a public push service connects to the address that was checked
and verifies the service's certificate against its host name: a TLS push
service on loopback, its name resolved there by the test and the address
check told that loopback is public, so the sender's own path runs whole."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from resolvers.adapters import webpush
from tests.push_service import b64url

NAME = "push.pinned.example"


def certificate(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "push.pem", tmp / "push.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class Seen:
    names: list[str | None] = field(default_factory=list)  # the TLS names asked for
    hosts: list[str] = field(default_factory=list)  # the Host headers of the requests


@contextlib.contextmanager
def tls_push_service(cert: Path, key: Path) -> Iterator[tuple[int, Seen]]:
    seen = Seen()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: seen.names.append(name)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.hosts.append(self.headers.get("Host", ""))
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def subscription(endpoint: str) -> webpush.Subscription:
    browser = ec.generate_private_key(ec.SECP256R1()).public_key()
    raw = browser.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return webpush.Subscription(endpoint, b64url(raw), b64url(b"0123456789abcdef"))


async def test_a_push_goes_to_the_checked_address_and_is_verified_against_its_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate(tmp_path, NAME)
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo
    resolved: list[str] = []

    async def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if str(host).endswith(".example"):
            resolved.append(str(host))
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return await real(host, port, *args, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(webpush, "public_address", lambda address: True)
    monkeypatch.setattr(webpush, "tls_context", lambda: ssl.create_default_context(cafile=str(cert)))
    vapid = webpush.load_vapid(tmp_path, None)
    sender = webpush.WebPushSender(vapid, "mailto:ops@example.org", allowed_origins=())
    message = webpush.Message(b'{"title": "hola"}', ttl=60, urgency="normal")
    try:
        with tls_push_service(cert, key) as (port, seen):
            good = await sender.send(subscription(f"https://{NAME}:{port}/push/a"), message)
            # Another name for the same address: the certificate does not name it.
            other = await sender.send(subscription(f"https://push.other.example:{port}/push/b"), message)
    finally:
        await sender.close()
    assert good.status == 201
    assert seen.hosts == [f"{NAME}:{port}"]  # the pushes that got through: the first alone
    assert NAME in seen.names and "push.other.example" in seen.names
    assert other.status == 0  # not verified, so nothing sent
    # Each name was resolved once, by the check; the connection went to its answer.
    assert resolved == [NAME, "push.other.example"]
