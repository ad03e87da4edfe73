"""A content's walk to READY cut short at each of its writes, as a killed
process would leave it, then resumed by the pipeline's recovery: the content
ends READY, each other member of the family is told of it once (a
NEW_CONTENT note, counted unread once), and each note is announced once.

The crash points are generated: the walk is cut at its first write, then its
second, and so on, until a walk runs through, so a write added to the walk is
crashed at too. A family small enough for its notes to go with the move, and one
too large for that, whose first notes go in transactions before it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from resolvers.domain import notifications
from store import keys
from store.enums import NotificationType
from store.items import Content
from store.port import StoreError
from tests.api.conftest import Api, dump
from tests.factories import family_rows, put_bytes, settle, start_upload

WRITES = ("put", "update", "delete", "batch_write", "transact")
COUNT = "{ notifications(first: 1) { unreadCount } }"


class Killed(StoreError):
    """What a write of a dead process gets."""


class Crashes:
    """Cuts a process's writes off from the `at`-th on (1-based), as a SIGKILL
    there would: that write and every later one fail until `revive`."""

    def __init__(self, api: Api) -> None:
        self.table = api.table
        self.at: int | None = None
        self.writes = 0
        for name in WRITES:
            setattr(self.table, name, self._cut(getattr(self.table, name)))

    def _cut(self, write: Any) -> Any:
        async def cut(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            if self.at is not None and self.writes >= self.at:
                raise Killed("the process died here")
            return await write(*args, **kwargs)

        return cut

    def arm(self, at: int) -> None:
        self.at, self.writes = at, 0

    def revive(self) -> None:
        self.at = None


class Announced:
    """The notifications published on people's channels, by stored id."""

    def __init__(self, api: Api) -> None:
        self.ids: Counter[str] = Counter()
        broker = api.services.broker
        publish_many = broker.publish_many

        async def recorded(events: Sequence[tuple[str, dict[str, Any]]]) -> None:
            self.ids.update(e["id"] for _, e in events if e.get("kind") == "notification")
            await publish_many(events)

        broker.publish_many = recorded


async def processing_text(api: Api, family_id: str) -> str:
    """A note whose bytes are in, PROCESSING and queued nowhere (as after a
    crash before its worker took it): only a recovery pass starts its walk."""
    started = await start_upload(api, "ana", family_id, "TEXT", "text/plain", 4, title="hola")
    content_id = str(started["content"]["id"])
    assert await put_bytes(api, started["uploadUrl"], b"hola", "text/plain") == 200
    item = await api.table.get(keys.content(content_id))
    assert item is not None
    await api.table.update(Content.from_item(item).transition("PROCESSING", api.services.now_iso()))
    return content_id


@pytest.mark.parametrize("others", [3, notifications.WRITTEN_PER_TRANSACTION + 10], ids=["small", "large"])
async def test_a_walk_killed_at_any_write_ends_ready_with_each_member_told_once(
    api: Api, others: int
) -> None:
    people = [f"m{n:03d}" for n in range(others)]
    family_id = "crashfamily"
    await api.table.batch_write(family_rows(family_id, "ana", people))
    crashes, announced = Crashes(api), Announced(api)
    pipeline = api.services.pipeline
    lease = api.services.settings.pipeline_lease_seconds
    at = 1
    while True:
        content_id = await processing_text(api, family_id)
        crashes.arm(at)
        assert await pipeline.recover() == 1
        await settle(api)
        cut = crashes.writes >= at
        crashes.revive()
        if cut:
            # The dead worker's lease runs out, and the next pass resumes the walk
            # (if it stopped short of READY: nothing resumes READY content).
            api.clock.advance(seconds=lease + 1)
            await pipeline.recover()
            await settle(api)
        content = await api.table.get(keys.content(content_id))
        assert content is not None and content["status"] == "READY", (at, content)
        told = Counter(
            item["userId"]
            for item in (await dump(api.table)).values()
            if item.get("type") == "Notification" and item.get("contentId") == content_id
        )
        assert told == dict.fromkeys(people, 1), f"cut at write {at}"
        ids = {notifications.notification_id(NotificationType.NEW_CONTENT, content_id, p) for p in people}
        assert {i: announced.ids[i] for i in ids} == dict.fromkeys(ids, 1), f"cut at write {at}"
        if not cut:
            break
        at += 1
    assert at >= 3  # the claim, the notes with the move, the words: each was cut
    # Each note counted unread once: the first and the last told have one per walk.
    for person in (people[0], people[-1]):
        assert (await api.ok(COUNT, as_=person))["notifications"]["unreadCount"] == at
