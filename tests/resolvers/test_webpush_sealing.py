"""Pushes are encrypted in the sealing process (resolvers/adapters/sealing.py):
the pushes asked for in one turn of the loop go to it in one request per
slice, and each body is one the browser decrypts, under a key pair of its
own. A child that dies or hangs fails only the pushes it held, and the next
push starts another."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import http_ece
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from resolvers.adapters import webpush
from tests.push_service import b64url

# RFC 8188's header: a 16-byte salt, the record size (4), the key id's length (1), the key id.
KEY_ID = slice(21, 21 + 65)


class Browser:
    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)
        point = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        self.subscription = webpush.Subscription("https://push.example/p", b64url(point), b64url(self.auth))

    def opened(self, body: bytes) -> bytes:
        opened: bytes = http_ece.decrypt(
            body, private_key=self.key, auth_secret=self.auth, version="aes128gcm"
        )
        return opened


def message(n: int) -> webpush.Message:
    return webpush.Message(f'{{"title": "hola {n}"}}'.encode(), ttl=60, urgency="normal")


@pytest.fixture
async def sealer() -> AsyncIterator[webpush.Sealer]:
    sealer = webpush.Sealer()
    try:
        yield sealer
    finally:
        await sealer.close()
    assert sealer.child.pid is None


def ended(pid: int) -> bool:
    """Whether process `pid` has ended (waited for up to 30 s, by its pidfd)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([handle], [], [], 30)[0])
    finally:
        os.close(handle)


def counting_requests(sealer: webpush.Sealer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    seal_all = sealer.child.seal_all

    def counted(asked: Sequence[tuple[webpush.Subscription, webpush.Message]]) -> Any:
        sizes.append(len(asked))
        return seal_all(asked)

    monkeypatch.setattr(sealer.child, "seal_all", counted)
    return sizes


async def started(sealer: webpush.Sealer, browser: Browser) -> int:
    """The sealing process's pid, once it has sealed a first push."""
    await sealer.seal(browser.subscription, message(1))
    pid = sealer.child.pid
    assert pid is not None
    return pid


async def seals_again_in_another(sealer: webpush.Sealer, browser: Browser, first: int) -> None:
    """The next push is sealed, by a process other than `first`."""
    assert browser.opened(await sealer.seal(browser.subscription, message(3))) == message(3).payload
    assert sealer.child.pid not in (None, first)


async def test_a_turns_pushes_go_in_slices_and_each_opens_for_its_browser_alone(
    sealer: webpush.Sealer, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = counting_requests(sealer, monkeypatch)
    browsers = [Browser() for _ in range(70)]
    bodies = await asyncio.gather(*(sealer.seal(b.subscription, message(n)) for n, b in enumerate(browsers)))
    assert requests == [32, 32, 6]
    for n, (browser, body) in enumerate(zip(browsers, bodies, strict=True)):
        assert browser.opened(body) == message(n).payload
    # Each push under a key pair of its own (RFC 8291), named in its header.
    assert len({body[KEY_ID] for body in bodies}) == len(bodies)
    # Another browser's keys do not open it.
    with pytest.raises(Exception):  # noqa: B017 - http_ece raises what cryptography does
        browsers[1].opened(bodies[0])
    # Pushes asked for later go in a request of their own.
    await sealer.seal(browsers[0].subscription, message(0))
    assert requests == [32, 32, 6, 1]


async def test_a_push_with_unusable_keys_fails_alone(sealer: webpush.Sealer) -> None:
    good = Browser()
    bad = webpush.Subscription("https://push.example/p", b64url(b"\x04" + bytes(64)), good.subscription.auth)
    results = await asyncio.gather(
        sealer.seal(good.subscription, message(1)), sealer.seal(bad, message(2)), return_exceptions=True
    )
    assert good.opened(results[0]) == message(1).payload  # type: ignore[arg-type]
    assert isinstance(results[1], webpush.SealingFailed)


async def test_a_sealing_process_that_died_is_started_again_for_the_next_push(sealer: webpush.Sealer) -> None:
    browser = Browser()
    first = await started(sealer, browser)
    os.kill(first, signal.SIGKILL)
    assert ended(first)
    await seals_again_in_another(sealer, browser, first)


async def test_a_sealing_process_killed_while_it_holds_pushes_fails_them_and_the_next_start_another(
    sealer: webpush.Sealer, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = Browser()
    first = await started(sealer, browser)
    # The child stopped, so the request waits in its pipe; killed once the
    # thread has written it and waits for the answer.
    os.kill(first, signal.SIGSTOP)
    waiting = threading.Event()
    line = webpush.SealingProcess._line

    def reading(self: webpush.SealingProcess, *args: Any) -> bytes:
        waiting.set()
        return line(self, *args)

    monkeypatch.setattr(webpush.SealingProcess, "_line", reading)
    held = asyncio.ensure_future(sealer.seal(browser.subscription, message(2)))
    assert await asyncio.to_thread(waiting.wait, 30)
    os.kill(first, signal.SIGKILL)
    with pytest.raises(webpush.SealingFailed, match="exit code -9"):
        await held
    await seals_again_in_another(sealer, browser, first)


async def test_a_sealing_process_that_hangs_is_killed_and_its_pushes_fail(
    sealer: webpush.Sealer, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = Browser()
    first = await started(sealer, browser)
    os.kill(first, signal.SIGSTOP)
    monkeypatch.setattr(webpush, "SEAL_TIMEOUT_SECONDS", 0.2)
    with pytest.raises(webpush.SealingFailed, match="no answer"):
        await sealer.seal(browser.subscription, message(2))
    assert ended(first)
    await seals_again_in_another(sealer, browser, first)


async def test_closing_ends_the_sealing_process(sealer: webpush.Sealer) -> None:
    browser = Browser()
    pid = await started(sealer, browser)
    await sealer.close()
    assert ended(pid)
    with pytest.raises(webpush.SealingFailed):
        await sealer.seal(browser.subscription, message(2))


async def test_an_answer_that_leaves_pushes_out_fails_them_rather_than_leave_them_waiting(
    sealer: webpush.Sealer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A sealing process that answers every request with no bodies at all."""
    script = tmp_path / "answers_nothing.py"
    script.write_text("import sys\nfor line in sys.stdin:\n    print('[]', flush=True)\n")
    monkeypatch.setattr(webpush, "sealing", SimpleNamespace(__file__=str(script)))
    browser = Browser()
    # A guard only: pushes left without an answer would wait for ever.
    async with asyncio.timeout(60):
        results = await asyncio.gather(
            *(sealer.seal(browser.subscription, message(n)) for n in range(3)), return_exceptions=True
        )
    assert all(isinstance(result, webpush.SealingFailed) for result in results), results
    assert "not what came back" in str(results[0])
