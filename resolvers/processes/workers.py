"""What the background workers (pipeline, exports) share about being stopped."""

from __future__ import annotations

import asyncio


def cancelling() -> bool:
    """Whether this task has been asked to stop.

    A cancel can arrive while a step is cleaning up after itself, and an
    exception raised by that cleanup (a zip closed while a thread still writes
    to it, say) replaces the CancelledError. The worker must still stop, or
    `stop()` waits for it for ever."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
