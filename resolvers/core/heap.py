"""The collector and long-lived subscriptions.

A subscription is a few hundred objects that live as long as its socket: with
ten thousand of them, every full collection walks millions of objects that
cannot be garbage, and the event loop stands still for it (about 1.8 s
measured, bench/NOTES.md). After a burst of subscriptions has settled, the
heap is frozen (`gc.freeze`): what exists then moves to the permanent
generation, which no collection walks. Frozen objects are still freed by
their reference counts; only frozen reference cycles wait, so once half the
subscriptions frozen have ended, the heap is thawed and collected once, and
frozen again.

The young generation is collected every `YOUNG_THRESHOLD` allocations, not
CPython's 700. An answer of a few thousand objects allocates tens of
thousands of containers that live as long as its operation: at 700, each is
walked again and again and promoted, until the old generation is large
enough that full collections come every few hundred milliseconds and each
stops the loop for up to 200 ms (measured with four answers of 2,400 objects
at once, bench/NOTES.md). Most of those objects die by their reference counts
when the operation ends, so fewer young collections promote almost none of
them."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

QUIET_SECONDS = 1.0  # no new subscription for this long: the burst is over
MOST_SECONDS = 5.0  # a steady trickle is frozen at least this often
THAW_AFTER = 1_000  # ended subscriptions at least, before a thaw is worth its pause
YOUNG_THRESHOLD = 50_000


def tune_collector() -> None:
    """The process's collector thresholds (the older generations keep CPython's)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def settle_after_start() -> None:
    """What a server process does once it has started: its collector tuned,
    and what exists then (modules, the composed services) frozen, since it
    lives as long as the process and no full collection need walk it again.
    A measurement of the server's work done in another process calls this
    too, so that it runs under the server's collector."""
    tune_collector()
    gc.freeze()


class SubscriptionHeap:
    """Counts subscriptions coming and going, and freezes or thaws the heap."""

    def __init__(self, enabled: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self._clock = clock
        self._new = 0  # started since the last freeze
        self._last_new = 0.0
        self._first_new = 0.0
        self._frozen = 0  # live when the heap was last frozen
        self.live = 0
        self._ended = 0  # ended since the last thaw
        self._timer: asyncio.TimerHandle | None = None
        self.freezes = 0
        self.thaws = 0

    def started(self) -> None:
        self.live += 1
        if not self.enabled:
            return
        now = self._clock()
        if self._new == 0:
            self._first_new = now
        self._new += 1
        self._last_new = now
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(QUIET_SECONDS, self._settle)

    def ended(self) -> None:
        self.live -= 1
        if not self.enabled:
            return
        self._ended += 1
        if self._frozen and self._ended >= max(THAW_AFTER, self._frozen // 2):
            self._thaw()

    def _settle(self) -> None:
        self._timer = None
        now = self._clock()
        if now - self._last_new < QUIET_SECONDS and now - self._first_new < MOST_SECONDS:
            self._timer = asyncio.get_running_loop().call_later(
                QUIET_SECONDS - (now - self._last_new), self._settle
            )
            return
        self._freeze()

    def _freeze(self) -> None:
        gc.freeze()
        self.freezes += 1
        self._frozen = self.live
        self._new = 0

    def _thaw(self) -> None:
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        self.thaws += 1
        self._ended = 0
        self._freeze()
        log.info("heap thawed and collected once: %.0f ms", (time.perf_counter() - started) * 1000)
