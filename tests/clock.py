"""A clock tests can move; it starts at the real time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.moment = start or datetime.now(UTC)

    def __call__(self) -> datetime:
        # Each reading is a millisecond after the last, as real time would be.
        self.moment += timedelta(milliseconds=1)
        return self.moment

    def advance(self, **delta: float) -> None:
        self.moment += timedelta(**delta)
