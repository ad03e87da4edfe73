"""What a subscriber's frame costs, per subscriber, in microseconds (part of
section 3's analysis): the copy of a shared result and its encoding, the way
as it is (the whole message encoded per subscriber) and the way tried (the
shared bytes, the envelope alone encoded per subscriber). In process, no sockets.

    python -m bench.frame_costs
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from graphql import ExecutionResult, parse

from schema import schema
from schema.multiplex import Plan, _copy_for, plan_for
from schema.strawberry_internals import core_schema

# The way tried and measured: one shared result encoded once, each subscriber's
# event id joined into the shared bytes (not kept: see bench/NOTES.md).
# Stands for the per-viewer event id in a shared frame: NULs cannot be in an id.
_EVENT_ID = "\x00event-id\x00"
_EVENT_ID_JSON = orjson.dumps(_EVENT_ID)


class SharedFrame:
    """One shared result's data, encoded once, cut where the event ids go."""

    __slots__ = ("parts",)

    def __init__(self, data: dict[str, Any], plan: Plan) -> None:
        template = data
        if plan.event_ids:
            template = {**data, plan.root: {**data[plan.root], **dict.fromkeys(plan.event_ids, _EVENT_ID)}}
        parts = orjson.dumps(template).split(_EVENT_ID_JSON)
        # Cut once per event id, or not shared at all (the marker in the data itself).
        self.parts: tuple[bytes, ...] | None = tuple(parts) if len(parts) == len(plan.event_ids) + 1 else None

    def encoded(self, event_id: str | None) -> bytes | None:
        if self.parts is None:
            return None
        if len(self.parts) == 1:
            return self.parts[0]
        return orjson.dumps(event_id).join(self.parts)


class SharedData(dict[str, Any]):
    """A subscriber's copy of a shared result's data, with its frame."""

    __slots__ = ("event_id", "frame")

    def __init__(self, data: dict[str, Any], frame: SharedFrame, event_id: str | None) -> None:
        super().__init__(data)
        self.frame = frame
        self.event_id = event_id

    def encoded(self) -> bytes | None:
        return self.frame.encoded(self.event_id)


def encoded_message(message: object) -> bytes | None:
    """The JSON of a message (a WebSocket `next`/`data`, or an event's result)
    whose data is a `SharedData`, with the shared bytes in it; None for any other."""
    if not isinstance(message, dict):
        return None
    payload = message.get("payload")
    outer = message
    if isinstance(payload, dict):
        outer, message = message, payload
    data = message.get("data")
    if type(data) is not SharedData:
        return None
    encoded = data.encoded()
    if encoded is None:
        return None
    inner = {**message, "data": orjson.Fragment(encoded)}
    return orjson.dumps({**outer, "payload": inner} if outer is not message else inner)


def _shared_copy(result: ExecutionResult, plan: Plan, event_id: str, frame: SharedFrame) -> ExecutionResult:
    copy = _copy_for(result, plan, event_id)
    assert copy.data is not None
    return ExecutionResult(data=SharedData(copy.data, frame, event_id))


SMALL = "subscription { capsuleUnlocked { id capsule { id status } unlockedAt } }"
CONTENT = (
    "id type status title mediaUrl thumbnailUrl transcription failureReason createdAt capturedAt "
    "reactions { emoji count } commentCount"
)
LARGE = (
    "subscription { capsuleUnlocked { id unlockedAt capsule { id title unlockDate status "
    f"notificationSent content {{ {CONTENT} }} }} }} }}"
)


def payload(large: bool) -> dict[str, object]:
    capsule: dict[str, object] = {"id": "CAP01HZY3", "status": "AVAILABLE"}
    if large:
        capsule |= {
            "title": "Para Lucía, el día de su boda",
            "unlockDate": "2026-12-01T10:00:00+00:00",
            "notificationSent": True,
            "content": {
                "id": "CNT01HZY3",
                "type": "VIDEO",
                "status": "READY",
                "title": "La abuela canta",
                "mediaUrl": "https://media.example.org/" + "x" * 300,
                "thumbnailUrl": "https://media.example.org/" + "y" * 300,
                "transcription": "Había una vez " * 40,
                "failureReason": None,
                "createdAt": "2026-11-30T10:00:00+00:00",
                "capturedAt": None,
                "reactions": [{"emoji": e, "count": 3} for e in "❤😂😮"],
                "commentCount": 4,
            },
        }
    return {"capsuleUnlocked": {"id": "E0", "capsule": capsule, "unlockedAt": "2026-12-01T10:00:00+00:00"}}


def per_subscriber(step: object, n: int = 20_000) -> float:
    started = time.perf_counter()
    for k in range(n):
        step(k)  # type: ignore[operator]
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    for name, document, large in (("small selection", SMALL, False), ("every shareable field", LARGE, True)):
        plan = plan_for(core_schema(schema), parse(document).definitions[0])  # type: ignore[arg-type]
        assert plan is not None
        shared = ExecutionResult(data=payload(large))
        assert shared.data is not None
        frame = SharedFrame(shared.data, plan)

        def before(k: int, shared: ExecutionResult = shared, plan: Plan = plan) -> bytes:
            copy = _copy_for(shared, plan, f"E{k}")
            return orjson.dumps({"id": "1", "type": "next", "payload": {"data": copy.data}})

        def now(
            k: int, shared: ExecutionResult = shared, plan: Plan = plan, frame: SharedFrame = frame
        ) -> bytes | None:
            copy = _shared_copy(shared, plan, f"E{k}", frame)
            return encoded_message({"id": "1", "type": "next", "payload": {"data": copy.data}})

        def copy_only(k: int, shared: ExecutionResult = shared, plan: Plan = plan) -> object:
            return _copy_for(shared, plan, f"E{k}")

        size = len(before(0))
        best = {
            label: min(per_subscriber(f) for _ in range(5))
            for label, f in (("before", before), ("now", now), ("copy", copy_only))
        }
        print(
            f"{name} ({size} bytes): copy + encode per subscriber {best['before']:.2f} µs before, "
            f"{best['now']:.2f} µs with the bytes shared "
            f"(the per-subscriber copy alone: {best['copy']:.2f} µs)"
        )


if __name__ == "__main__":
    main()
