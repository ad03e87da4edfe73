"""Turns on the event loop, for work that would otherwise hold it.

asyncio runs every callback that is ready in one pass of the loop. When a
batch of store reads returns for four large answers at once, a hundred pieces
of completion (a page of a hundred objects each) become ready together, and a
health check or another family's small query waits for all of them: seconds,
not milliseconds. Work that has had its slice (`SLICE_SECONDS` of loop time,
shared by everything in the process) waits here for a turn. Turns are given
one per pass of the loop, round-robin between owners (an operation each), so
a small query waits for one piece of each busy operation at most, never for
their whole answers.
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
        self._served: tuple[int, deque[asyncio.Future[None]]] | None = None

    @property
    def waiting(self) -> int:
        served = len(self._served[1]) if self._served is not None else 0
        return served + sum(len(queue) for queue in self._waiting.values())

    def waiting_for(self, owner: object) -> bool:
        """Whether some of `owner`'s work waits for a turn (its loaders hold their
        batch until it has asked what it will: `resolvers.core.loaders`)."""
        key = id(owner)
        return key in self._waiting or (self._served is not None and self._served[0] == key)

    async def take(self, owner: object) -> None:
        """Returns at once within the slice; past it, after a turn of the loop
        in which whatever else was ready has run. `owner` (an operation's
        context) has one place in the round, however much of it waits."""
        now = self._clock()
        if now <= self._ends:
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (a test's, say): nothing of the old one waits
            self._loop, self._waiting, self._served, self._giving = loop, {}, None, False
        if not self._waiting and now > self._ends + self.idle_seconds:
            self._ends = now + self.slice_seconds
            return
        turn = loop.create_future()
        self._waiting.setdefault(id(owner), deque()).append(turn)
        if not self._giving:
            self._giving = True
            loop.call_soon(self._give)
        await turn

    def _give(self) -> None:
        """One turn, to the owner at the front of the round; the next pass gives
        the next. The owner just served goes to the back only now, behind any
        owner that started waiting since."""
        self._ends = self._clock() + self.slice_seconds
        if self._served is not None:
            owner, rest = self._served
            self._served = None
            rest.extend(self._waiting.pop(owner, ()))
            self._waiting[owner] = rest
        while self._waiting:
            owner = next(iter(self._waiting))
            queue = self._waiting.pop(owner)
            turn = queue.popleft()
            if not turn.done():  # a cancelled wait (its operation stopped) has no turn
                turn.set_result(None)
                if queue:
                    self._served = (owner, queue)
                break
            if queue:
                self._waiting[owner] = queue
        if (self._waiting or self._served is not None) and self._loop is not None:
            self._loop.call_soon(self._give)
        else:
            self._giving = False


# One loop per process: one set of turns for everything that runs on it.
TURNS = Turns()
