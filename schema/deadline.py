"""The operation deadline stops the work, not only the answer.

`asyncio.timeout` cancels an operation at its next await; a timer cannot fire
while resolving keeps the loop busy, and completing a large answer can run
long between two awaits. So execution reads the clock before each field: past
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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from resolvers.core.turns import TURNS
from schema.multiplex import MultiplexingExecutionContext

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
    """Reads the deadline once, then the clock before each field."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_at = _deadline.get()

    def execute_field(self, *args: Any, **kwargs: Any) -> Any:
        if self.stop_at is not None and time.monotonic() > self.stop_at:
            raise DeadlinePassed
        return super().execute_field(*args, **kwargs)

    def complete_awaitable_value(
        self,
        return_type: Any,
        field_details_list: Any,
        info: Any,
        path: Any,
        result: Any,
        position_context: Any,
    ) -> Any:
        return super().complete_awaitable_value(
            return_type, field_details_list, info, path, self._then_a_turn(result), position_context
        )

    async def _then_a_turn(self, result: Any) -> Any:
        value = await result
        await TURNS.take(self.context_value)
        return value
