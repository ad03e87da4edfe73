"""Web Push (RFC 8030) to browsers: VAPID (RFC 8292) and aes128gcm payload
encryption (RFC 8291) by pywebpush and py-vapid, sent with aiohttp.

Nothing here is our own cryptography: pywebpush encrypts (through http_ece),
py-vapid signs. What is ours is where a request may go. A push endpoint is a
URL a browser gave us, so a person could name any host: every endpoint's host
is resolved, and an address that is not on the public internet (private,
loopback, link-local, carrier-grade NAT, cloud metadata) is refused, at
registration and again at each send; the send then connects to the address
that was checked (TLS still checks the certificate against the host name), so
a DNS answer that changes between the check and the connection (rebinding)
changes nothing. Origins listed in MIFAMILIAS_PUSH_ALLOWED_ORIGINS skip the
address check (a push service on loopback, for development and tests).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import ipaddress
import os
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02, b64urlencode
from pywebpush import WebPusher

MAX_ENDPOINT = 2048
# Addresses of cloud metadata services that are public addresses all the same.
METADATA = frozenset(
    {
        ipaddress.ip_address("168.63.129.16"),  # Azure's wire server
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("169.254.169.254"),
        ipaddress.ip_address("fd00:ec2::254"),
    }
)
# A VAPID token lasts 12 hours (RFC 8292 allows up to 24) and is signed again
# an hour before it runs out: one signature per push service and half-day.
VAPID_LIFETIME = 12 * 3600
VAPID_RENEW = 3600
# Sends at once to one push service, each on a keep-alive connection of its
# pool: more than a person's devices (20), so one person's slow pushes never
# hold all of a push service's connections.
PER_ORIGIN = 32
# The most of a push service's answer that is read: its status and headers say
# what became of the push.
MAX_ANSWER = 64 * 1024
# Push services with a pool of their own; the rest share one.
MAX_POOLS = 64
OTHER_ORIGINS = "other"


class Refused(ValueError):
    """An endpoint we will not send to; the message says why, for a person."""


def b64url_decode(value: str) -> bytes:
    text = value.strip()
    if not text or any(
        c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=" for c in text
    ):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError) as error:
        raise ValueError("not base64url") from error


def check_p256dh(value: str) -> None:
    """An uncompressed point on P-256 (65 bytes, 0x04 first), as browsers give."""
    try:
        raw = b64url_decode(value)
    except ValueError:
        raise Refused("must be base64url, as PushSubscription.toJSON() gives it") from None
    if len(raw) != 65 or raw[0] != 4:
        raise Refused("must be an uncompressed P-256 public key (65 bytes)")
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
    except ValueError:
        raise Refused("is not a point on the P-256 curve") from None


def check_auth(value: str) -> None:
    try:
        raw = b64url_decode(value)
    except ValueError:
        raise Refused("must be base64url, as PushSubscription.toJSON() gives it") from None
    if len(raw) != 16:
        raise Refused("must be a 16-byte secret")


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.lower()}"


def check_url(url: str, allowed: Sequence[str]) -> None:
    """The URL's form: https (or an allowed origin), a host, nothing odd."""
    if len(url) > MAX_ENDPOINT:
        raise Refused(f"must be at most {MAX_ENDPOINT} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise Refused("is not a URL") from None
    if origin_of(url) in allowed:
        return
    if parts.scheme != "https":
        raise Refused("must be an https URL")
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise Refused("must be an https URL with a host and no credentials")


# IPv6 prefixes whose last 32 bits are an IPv4 address a network delivers to:
# NAT64's well-known prefix (RFC 6052) and IPv4-compatible addresses (RFC 4291,
# deprecated, but a stack may still route them). IPv4-mapped addresses and 6to4
# (2002::/16, the address in bits 16-47) have properties of their own.
EMBEDS_LAST_32 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("::/96"))
# NAT64 for local use (RFC 8215): where the IPv4 address sits depends on a
# prefix length only the local network knows, and it is never public.
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a packet to `ip` may reach, when `ip` embeds one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in network for network in EMBEDS_LAST_32):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def public_address(address: str) -> bool:
    """Whether a push may connect to `address`: a public unicast address, and,
    for an IPv6 address that embeds an IPv4 one, a public IPv4 address too
    (a NAT64 or 6to4 gateway would deliver to it)."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in LOCAL_NAT64:
            return False
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            ip = embedded
    return ip.is_global and not ip.is_multicast and ip not in METADATA


async def resolve(url: str, allowed: Sequence[str]) -> str | None:
    """The address to connect to, once every address the host resolves to has
    been checked; None for an allowed origin (connected to by name)."""
    check_url(url, allowed)
    if origin_of(url) in allowed:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, parts.port or 443, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (OSError, UnicodeError, ValueError):
        raise Refused("has a host that does not resolve") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise Refused("has a host that does not resolve")
    if not all(public_address(a) for a in addresses):
        raise Refused("must be on the public internet (not a private, loopback or metadata address)")
    return addresses[0]


# VAPID keys ----------------------------------------------------------------------------


def load_vapid(data_dir: Path, configured: str | None) -> Vapid02:
    """MIFAMILIAS_VAPID_PRIVATE_KEY (PEM, or the raw key base64url), or the key
    in the data directory, generated there on first use (as the auth secret is);
    two processes starting at once keep the first one written."""
    if configured:
        text = configured.strip()
        if "-----BEGIN" in text:
            return Vapid02.from_pem(text.encode())
        return Vapid02.from_raw(text.encode())
    path = data_dir / "vapid-private.pem"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        fresh = Vapid02()
        fresh.generate_keys()
        draft = data_dir / f".vapid-{os.getpid()}-{time.monotonic_ns()}.pem"
        draft.write_bytes(fresh.private_pem())
        os.chmod(draft, 0o600)
        try:
            os.link(draft, path)  # atomic, and never over a key already there
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return Vapid02.from_file(str(path))


def new_private_key() -> str:
    """A fresh VAPID private key as MIFAMILIAS_VAPID_PRIVATE_KEY takes it: the
    raw P-256 scalar, base64url, on one line (a CloudFormation parameter or a
    secret holds it as it is)."""
    fresh = Vapid02()
    fresh.generate_keys()
    scalar = fresh.private_key.private_numbers().private_value.to_bytes(32, "big")
    return str(b64urlencode(scalar))


def public_key(vapid: Vapid02) -> str:
    """The application server key for `pushManager.subscribe`, base64url."""
    raw = vapid.public_key.public_bytes(
        encoding=serialization.Encoding.X962, format=serialization.PublicFormat.UncompressedPoint
    )
    return str(b64urlencode(raw))


# Sending ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    endpoint: str
    p256dh: str
    auth: str


@dataclass(frozen=True)
class Message:
    payload: bytes
    ttl: int
    urgency: str  # very-low, low, normal, high (RFC 8030 5.3)
    topic: str | None = None  # at most 32 base64url characters (RFC 8030 5.4)


@dataclass(frozen=True)
class Outcome:
    status: int
    retry_after: str | None = None

    @property
    def delivered(self) -> bool:
        return 200 <= self.status < 300

    @property
    def gone(self) -> bool:
        """The subscription is no more (RFC 8030 7.3): the device goes."""
        return self.status in (404, 410)

    @property
    def retryable(self) -> bool:
        return self.status == 429 or self.status >= 500 or self.status == 0


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS settings of every push: loading the certificate authorities takes
    tens of milliseconds, so once for the process, on its first push."""
    return httpx.create_ssl_context()


class Pool:
    """The connections to one push service, which every push to it shares: at
    most `size` sends at once, each on a keep-alive connection of one aiohttp
    session (a POST costs a sixth of httpx's CPU there, and the POSTs were most
    of a push's CPU). A send waits for a slot here, not in the session's connector,
    so the wait does not count against the request's timeout. Connections are
    kept per address and TLS name, so a send pinned to a checked address never
    reuses a connection verified for another host."""

    def __init__(self, size: int, timeout: float, tls: ssl.SSLContext | None = None) -> None:
        self.size = size
        self.timeout = timeout
        self.tls = tls
        self.slots = asyncio.Semaphore(size)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on the first send, inside the running loop, as aiohttp asks.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.size, limit_per_host=self.size, ssl=self.tls if self.tls is not None else True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        return self._session

    async def post(
        self, url: str, *, content: bytes, headers: Mapping[str, str], server_hostname: str | None = None
    ) -> Outcome:
        """One POST; a network failure or a timeout is status 0. Of the answer
        only its status and Retry-After matter: a body past `MAX_ANSWER` is
        not read, and its connection is closed rather than kept."""
        async with self.slots:
            try:
                async with self._open().post(
                    url,
                    data=content,
                    headers=headers,
                    allow_redirects=False,
                    server_hostname=server_hostname,
                ) as response:
                    await response.content.read(MAX_ANSWER)
                    return Outcome(response.status, response.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError):
                return Outcome(0)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class WebPushSender:
    def __init__(
        self,
        vapid: Vapid02,
        subject: str,
        allowed_origins: Sequence[str],
        *,
        timeout: float = 10.0,
        per_origin: int = PER_ORIGIN,
    ) -> None:
        self.vapid = vapid
        self.subject = subject
        self.allowed = tuple(allowed_origins)
        self.timeout = timeout
        self.per_origin = per_origin
        self._pools: dict[str, Pool] = {}
        self._tokens: dict[str, tuple[float, str]] = {}

    def pool(self, origin: str) -> Pool:
        """The push service's pool, made on its first push. Past `MAX_POOLS`
        push services (there are a handful; endpoints are what people give us)
        the rest share one, so the pools stay bounded whatever is registered."""
        found = self._pools.get(origin)
        if found is None and len(self._pools) >= MAX_POOLS:
            origin = OTHER_ORIGINS
            found = self._pools.get(origin)
        if found is None:
            found = self._pools[origin] = Pool(self.per_origin, self.timeout, tls_context())
        return found

    @property
    def public_key(self) -> str:
        return public_key(self.vapid)

    def authorization(self, audience: str) -> str:
        now = time.time()
        cached = self._tokens.get(audience)
        if cached is not None and cached[0] - now > VAPID_RENEW:
            return cached[1]
        expires = int(now) + VAPID_LIFETIME
        headers = self.vapid.sign({"aud": audience, "exp": expires, "sub": self.subject})
        token = str(headers["Authorization"])
        self._tokens[audience] = (float(expires), token)
        return token

    def _encrypt(self, subscription: Subscription, message: Message) -> bytes:
        pusher = WebPusher(
            {
                "endpoint": subscription.endpoint,
                "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth},
            }
        )
        body: bytes = pusher.encode(message.payload, content_encoding="aes128gcm")["body"]
        return body

    async def send(self, subscription: Subscription, message: Message) -> Outcome:
        """One push. Raises `Refused` when the endpoint's host now resolves
        somewhere it may not go; a network failure is status 0 (retried)."""
        address = await resolve(subscription.endpoint, self.allowed)
        # Encrypting is an ECDH and an AES-GCM: off the loop, with the signature.
        body, authorization = await asyncio.to_thread(self._prepare, subscription, message)
        headers = {
            "TTL": str(message.ttl),
            "Urgency": message.urgency,
            "Content-Encoding": "aes128gcm",
            "Content-Type": "application/octet-stream",
            "Authorization": authorization,
        }
        if message.topic:
            headers["Topic"] = message.topic
        url, server_hostname = _pinned(subscription.endpoint, address)
        if address is not None:
            headers["Host"] = urlsplit(subscription.endpoint).netloc
        pool = self.pool(origin_of(subscription.endpoint))
        return await pool.post(url, content=body, headers=headers, server_hostname=server_hostname)

    def _prepare(self, subscription: Subscription, message: Message) -> tuple[bytes, str]:
        return self._encrypt(subscription, message), self.authorization(origin_of(subscription.endpoint))

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(pool.close() for pool in pools))


def _pinned(endpoint: str, address: str | None) -> tuple[str, str | None]:
    """The URL with its host replaced by the checked address, and the TLS name
    to verify the certificate against (the host's own)."""
    if address is None:
        return endpoint, None
    parts = urlsplit(endpoint)
    literal = f"[{address}]" if ":" in address else address
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), parts.hostname
