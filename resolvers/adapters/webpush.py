"""Web Push (RFC 8030) to browsers: VAPID (RFC 8292) and aes128gcm payload
encryption (RFC 8291) by http_ece and py-vapid, sent with aiohttp.

Nothing here is our own cryptography: http_ece encrypts (in a process of its
own, :mod:`resolvers.adapters.sealing`), py-vapid signs. What is ours is where
a request may go. A push endpoint is a URL a browser gave us, so a person
could name any host: every endpoint's host is resolved, and an address that is
not on the public internet (private, loopback, link-local, carrier-grade NAT,
cloud metadata) is refused, at registration and again at each send; the send
then connects to the address that was checked (TLS still checks the
certificate against the host name), so a DNS answer that changes between the
check and the connection (rebinding) changes nothing. Origins listed in
MIFAMILIAS_PUSH_ALLOWED_ORIGINS skip the address check (a push service on
loopback, for development and tests).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import ipaddress
import json
import logging
import os
import select
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02, b64urlencode

from resolvers.adapters import sealing

log = logging.getLogger(__name__)

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
# Pushes sealed in one request to the sealing process at most. An opening asks
# for a thousand in one turn of the loop; in slices, the first are on their way
# while the rest are still being encrypted.
SEAL_SLICE = 32
# A slice takes the sealing process a few milliseconds; one it has not answered
# in this long it never will: it is stopped, and those pushes are tried again.
SEAL_TIMEOUT_SECONDS = 30.0


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


Waiting = list[tuple["Subscription", "Message", "asyncio.Future[bytes]"]]


class SealingFailed(Exception):
    """A push the sealing process did not encrypt: it stopped, or that push's keys are unusable."""


class SealingProcess:
    """The child that encrypts pushes (:mod:`resolvers.adapters.sealing`), driven
    from one thread alone: started on the first request, started again after it
    stopped. Each request waits for its answer with a deadline, so a child that
    hangs is stopped rather than waited for."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._unread = b""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def seal_all(self, asked: Sequence[tuple[Subscription, Message]]) -> list[bytes | SealingFailed]:
        """Each push's body, or why it has none. Raises `SealingFailed` for
        them all when the child stopped or did not answer (it is killed, and
        the next request starts another)."""
        request = [[base64.b64encode(m.payload).decode(), s.p256dh, s.auth] for s, m in asked]
        try:
            process = self._started()
            assert process.stdin is not None
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
            answers = json.loads(self._line(process, time.monotonic() + SEAL_TIMEOUT_SECONDS))
            if not isinstance(answers, list) or len(answers) != len(asked):
                # Every push waits for its own answer: one missing would wait for ever.
                raise SealingFailed(f"{len(asked)} pushes asked for, not what came back")
        except (OSError, ValueError, SealingFailed) as error:
            self.stop(gently=False)
            raise SealingFailed(f"the push sealing process failed: {error}") from None
        return [
            base64.b64decode(found) if isinstance(found, str) else SealingFailed(found["error"])
            for found in answers
        ]

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", sealing.__file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
            self._unread = b""
            log.info("push sealing process %d started", self._process.pid)
        return self._process

    def _line(self, process: subprocess.Popen[bytes], deadline: float) -> bytes:
        """One line of the child's answers, read as it comes (no buffer past it
        is lost: what follows stays for the next)."""
        assert process.stdout is not None
        fd = process.stdout.fileno()
        while b"\n" not in self._unread:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SealingFailed(f"no answer in {SEAL_TIMEOUT_SECONDS:.0f} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise SealingFailed(f"exit code {process.wait()}")
            self._unread += chunk
        line, _, self._unread = self._unread.partition(b"\n")
        return line

    def stop(self, *, gently: bool = True) -> None:
        """Ends the child: its stdin closes and it exits (or is killed if it
        does not within seconds); not `gently`, it is killed at once."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        if not gently:
            process.kill()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


class Sealer:
    """Encrypts pushes in the sealing process, those asked for in one turn of
    the loop together. The encryption (a key pair, an ECDH, two HKDFs and an
    AES-GCM) is about twice a push's POST in CPU: in the server's process it
    held the loop's GIL for most of it, and a hand-off per push to a thread
    cost the loop about as much again. Here the loop hands a turn's pushes to
    one thread, which writes them to the child in slices and waits for its
    answers with the GIL let go; the child runs on another core."""

    def __init__(self) -> None:
        self._waiting: Waiting = []
        self.child = SealingProcess()
        # One thread: the child is driven from it alone, so its requests and
        # answers never interleave.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webpush-sealing")

    async def seal(self, subscription: Subscription, message: Message) -> bytes:
        """The push's encrypted body. Raises `SealingFailed`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._hand_off, loop)
        self._waiting.append((subscription, message, future))
        return await future

    def _hand_off(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting, self._waiting = self._waiting, []
        for start in range(0, len(waiting), SEAL_SLICE):
            some = waiting[start : start + SEAL_SLICE]
            try:
                done = loop.run_in_executor(self._thread, self.child.seal_all, [(s, m) for s, m, _ in some])
            except RuntimeError:  # closed meanwhile
                _answer(some, SealingFailed("the server is stopping"))
                continue
            done.add_done_callback(functools.partial(_answered, some))

    async def close(self) -> None:
        def stop() -> None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self.child.stop()

        await asyncio.to_thread(stop)


def _answered(waiting: Waiting, done: asyncio.Future[list[bytes | SealingFailed]]) -> None:
    if done.cancelled():
        _answer(waiting, SealingFailed("the server is stopping"))
    elif (error := done.exception()) is not None:
        _answer(waiting, error if isinstance(error, Exception) else SealingFailed(repr(error)))
    else:
        _answer(waiting, done.result())


def _answer(waiting: Waiting, answers: Exception | list[bytes | SealingFailed]) -> None:
    for n, (_, _, future) in enumerate(waiting):
        if future.done():
            continue  # its sender was cancelled
        answer = answers if isinstance(answers, Exception) else answers[n]
        if isinstance(answer, Exception):
            future.set_exception(answer)
        else:
            future.set_result(answer)


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
        self._sealer = Sealer()

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

    async def send(self, subscription: Subscription, message: Message) -> Outcome:
        """One push. Raises `Refused` when the endpoint's host now resolves
        somewhere it may not go; a network failure is status 0 (retried)."""
        address = await resolve(subscription.endpoint, self.allowed)
        body = await self._sealer.seal(subscription, message)
        authorization = self.authorization(origin_of(subscription.endpoint))
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

    async def close(self) -> None:
        await self._sealer.close()
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
