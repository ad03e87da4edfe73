"""The operation deadline stops the work, not only the answer.

`asyncio.timeout` cancels an operation at its next await; a timer cannot fire
while resolving keeps the loop busy, and completing a large answer can run
long between two awaits. So execution reads the clock before each object: past
the deadline, `DeadlinePassed` unwinds the operation from wherever it is.

It derives from BaseException on purpose: graphql-core turns every Exception a
field raises into a located error and goes on with the next field; this one
must not be caught until the schema answers the operation as stopped.

The loop is shared too: a field whose value had to be awaited (a store read,
a page) takes a turn (`resolvers.core.turns`) before its value is completed,
so a large answer is built a piece at a time between other work.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from resolvers.core.turns import TURNS
from schema.multiplex import MultiplexingExecutionContext

T = TypeVar("T")

# The monotonic time past which the running operation's fields stop, if any.
_deadline: ContextVar[float | None] = ContextVar("operation_deadline", default=None)


class DeadlinePassed(BaseException):
    """Raised by the next field once the operation's deadline has passed."""


@contextmanager
def running_within(seconds: float) -> Iterator[None]:
    """Fields executed inside (and in the tasks started inside) stop after `seconds`."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


class StoppingExecutionContext(MultiplexingExecutionContext):
    """Reads the deadline once, then the clock before each object's fields
    (an object's scalars cost little; objects are where the work is)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_at = _deadline.get()

    def complete_object_value(self, *args: Any, **kwargs: Any) -> Any:
        if self.stop_at is not None and time.monotonic() > self.stop_at:
            raise DeadlinePassed
        return super().complete_object_value(*args, **kwargs)

    async def with_abort_signal(self, awaitable: Awaitable[T]) -> T:
        # graphql-core awaits every awaited value (a field's, a list item's)
        # through this coroutine already: the turn is taken inside it, so it
        # costs no coroutine of its own.
        if self.abort_signal is not None:
            return await super().with_abort_signal(awaitable)
        value = await awaitable
        turn = TURNS.due(self.context_value)
        if turn is not None:
            await turn
        return value
