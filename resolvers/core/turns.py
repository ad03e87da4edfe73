"""Turns on the event loop, for work that would otherwise hold it.

asyncio runs every callback that is ready in one pass of the loop. When a
batch of store reads returns for four large answers at once, a hundred pieces
of completion (a page of a hundred objects each) become ready together, and a
health check or another family's small query waits for all of them: seconds,
not milliseconds. Work that has had its slice (`SLICE_SECONDS` of loop time,
shared by everything in the process) waits here for a turn. Turns are given
round-robin between owners (an operation each), so a small query waits for a
few pieces of each busy operation at most, never for their whole answers.

A pass that gives one turn and runs one small piece is mostly the loop's own
overhead, so the number of turns a pass gives follows what the last pass took:
twice as many after a pass well inside the slice, half after one past it. A
pass stays about a slice long, and one operation alone on the loop is not
slowed to a piece per pass.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

# Long enough that turns cost little (a pass of the loop each, every few
# milliseconds of work), short enough that a health check waits a few at most.
SLICE_SECONDS = 0.004
# A slice this far past its end means nothing has been waiting: work arriving
# at an idle process goes on at once.
IDLE_SECONDS = 0.05
# The most turns one pass gives: a bound on what a health check waits for
# while the last pass's measure catches up.
MOST_TURNS_PER_PASS = 64


class Turns:
    def __init__(
        self,
        slice_seconds: float = SLICE_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slice_seconds = slice_seconds
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._ends = 0.0
        # Insertion order is the round: the owner at the front has the next turn.
        self._waiting: dict[int, deque[asyncio.Future[None]]] = {}  # by id(owner)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._giving = False
        # Owners served in the last pass that still wait, in the order served.
        self._served: dict[int, deque[asyncio.Future[None]]] = {}
        self._per_pass = 1
        self._last_pass: float | None = None

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in (*self._waiting.values(), *self._served.values()))

    def waiting_for(self, owner: object) -> bool:
        """Whether some of `owner`'s work waits for a turn (its loaders hold their
        batch until it has asked what it will: `resolvers.core.loaders`)."""
        key = id(owner)
        return key in self._waiting or key in self._served

    async def take(self, owner: object) -> None:
        """Returns at once within the slice; past it, after a turn of the loop
        in which whatever else was ready has run. `owner` (an operation's
        context) has one place in the round, however much of it waits."""
        turn = self.due(owner)
        if turn is not None:
            await turn

    def due(self, owner: object) -> asyncio.Future[None] | None:
        """`take` without a coroutine, for code that awaits anyway: None to go
        on at once, or the future of `owner`'s turn."""
        now = self._clock()
        if now <= self._ends:
            return None
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (a test's, say): nothing of the old one waits
            self._loop, self._waiting, self._served, self._giving = loop, {}, {}, False
            self._per_pass, self._last_pass = 1, None
        if not self._waiting and not self._served and now > self._ends + self.idle_seconds:
            self._ends = now + self.slice_seconds
            return None
        turn = loop.create_future()
        self._waiting.setdefault(id(owner), deque()).append(turn)
        if not self._giving:
            self._giving = True
            loop.call_soon(self._give)
        return turn

    def _give(self) -> None:
        """Turns for this pass, one per owner in the order of the round, going
        round again while this pass has turns to give. The owners served go to
        the back only at the next pass, behind any owner that started waiting
        since."""
        now = self._clock()
        self._size_pass(now)
        self._ends = now + self.slice_seconds
        for owner, rest in self._served.items():
            rest.extend(self._waiting.pop(owner, ()))
            self._waiting[owner] = rest
        served: dict[int, deque[asyncio.Future[None]]] = {}
        given = 0
        while given < self._per_pass:
            if not self._waiting:
                if not served:
                    break
                self._waiting, served = served, {}  # round again
            owner = next(iter(self._waiting))
            queue = self._waiting.pop(owner)
            while queue:
                turn = queue.popleft()
                if not turn.done():  # a cancelled wait (its operation stopped) has no turn
                    turn.set_result(None)
                    given += 1
                    break
            if queue:
                served[owner] = queue
        self._served = served
        if (self._waiting or self._served) and self._loop is not None:
            self._loop.call_soon(self._give)
        else:
            self._giving = False
            self._last_pass = None

    def _size_pass(self, now: float) -> None:
        """Twice the turns after a pass that took under half a slice, half
        after one that took more than a slice."""
        if self._last_pass is not None:
            took = now - self._last_pass
            if took < self.slice_seconds / 2:
                self._per_pass = min(self._per_pass * 2, MOST_TURNS_PER_PASS)
            elif took > self.slice_seconds:
                self._per_pass = max(self._per_pass // 2, 1)
        self._last_pass = now


# One loop per process: one set of turns for everything that runs on it.
TURNS = Turns()
