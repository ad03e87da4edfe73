"""Time capsules through the API: the lifecycle, the refusals, notifications,
and the secrecy of sealed content on every read path."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from resolvers.domain import notifications
from resolvers.processes.scheduler import CLAIM_BATCH, UnlockScheduler
from store import keys
from store.blobs import ABANDONED_UPLOAD_DAYS
from store.items import Capsule, iso
from store.port import Update
from tests.api.conftest import Api, dump
from tests.counting import CountingTable
from tests.factories import (
    capsule_rows,
    family_rows,
    family_with_members,
    put_bytes,
    settle,
    start_upload,
    upload,
)

CREATE = """mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) {
  id status title unlockDate notificationSent recipients { user { id } notifiedAt viewedAt } } }"""
SCHEDULE = "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }"
CANCEL = "mutation($id: ID!) { cancelCapsule(capsuleId: $id) { status } }"
OPEN = "mutation($id: ID!) { openCapsule(capsuleId: $id) { status recipients { user { id } viewedAt } } }"
CAPSULE = """query($id: ID!) { capsule(id: $id) { id status notificationSent creator { id }
  content { id status mediaUrl } recipients { user { id } notifiedAt viewedAt } } }"""
CONTENT = "query($id: ID!) { content(id: $id) { id status mediaUrl } }"
FEED = "query($id: ID!) { family(id: $id) { feed { edges { node { id } } } } }"
NOTES = "{ notifications { edges { node { id type read capsule { id } content { id } } } } }"


def unlock_in(api: Api, **delta: float) -> str:
    return (api.clock.moment + timedelta(**delta)).isoformat()


async def make_capsule(api: Api, creator: str, family_id: str, recipients: list[str], **delta: float) -> str:
    variables = {
        "i": {
            "familyId": family_id,
            "title": "Para ti",
            "unlockDate": unlock_in(api, **delta or {"days": 1}),
            "recipientIds": recipients,
        }
    }
    return str((await api.ok(CREATE, variables, as_=creator))["createCapsule"]["id"])


async def sealed_capsule(api: Api) -> tuple[str, str, str]:
    """ana's capsule for ben, LOCKED around real bytes: (family, capsule, content)."""
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    capsule_id = await make_capsule(api, "ana", family_id, ["ben"], days=1)
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    content_id = await upload(
        api, "ana", family_id, "TEXT", b"te quiero", "text/plain", capsule_id=capsule_id
    )
    await settle(api)
    return family_id, capsule_id, content_id


async def unlock(api: Api) -> Any:
    api.clock.advance(days=1, seconds=1)
    return await api.services.scheduler.run_once()


async def test_the_whole_lifecycle(api: Api) -> None:
    family_id, capsule_id, content_id = await sealed_capsule(api)
    assert (await api.ok(CAPSULE, {"id": capsule_id}, as_="ana"))["capsule"]["status"] == "LOCKED"
    mine = await api.ok("{ myCapsules { edges { node { id status } } } }", as_="ana")
    assert mine["myCapsules"]["edges"] == [{"node": {"id": capsule_id, "status": "LOCKED"}}]
    received = await api.ok("{ receivedCapsules { edges { node { id status content { id } } } } }", as_="ben")
    assert received["receivedCapsules"]["edges"] == [
        {"node": {"id": capsule_id, "status": "LOCKED", "content": None}}
    ]

    result = await unlock(api)
    assert result.unlocked == 1
    capsule = (await api.ok(CAPSULE, {"id": capsule_id}, as_="ben"))["capsule"]
    assert capsule["status"] == "AVAILABLE" and capsule["notificationSent"] is True
    assert capsule["content"]["id"] == content_id and capsule["content"]["mediaUrl"]
    assert capsule["recipients"][0]["notifiedAt"] is not None
    assert [
        e["node"]["id"] for e in (await api.ok(FEED, {"id": family_id}, as_="cy"))["family"]["feed"]["edges"]
    ] == [content_id]
    for person in ("ana", "ben"):
        notes = [e["node"] for e in (await api.ok(NOTES, as_=person))["notifications"]["edges"]]
        unlocked = [n for n in notes if n["type"] == "CAPSULE_UNLOCKED"]
        assert len(unlocked) == 1 and unlocked[0]["capsule"] == {"id": capsule_id}
    # A second pass, or a second process, opens nothing twice.
    assert (await api.services.scheduler.run_once()).unlocked == 0

    opened = (await api.ok(OPEN, {"id": capsule_id}, as_="ben"))["openCapsule"]
    assert opened["status"] == "VIEWED" and opened["recipients"][0]["viewedAt"] is not None
    again = (await api.ok(OPEN, {"id": capsule_id}, as_="ben"))["openCapsule"]
    assert again["recipients"][0]["viewedAt"] == opened["recipients"][0]["viewedAt"]

    # Retention: VIEWED -> ARCHIVED once the period after the first view has passed.
    from resolvers.domain.capsules import archive_viewed

    assert await archive_viewed(api.table, api.clock(), 365) == 0
    api.clock.advance(days=366)
    assert await archive_viewed(api.table, api.clock(), 365) == 1
    archived = (await api.ok(CAPSULE, {"id": capsule_id}, as_="ben"))["capsule"]
    assert archived["status"] == "ARCHIVED" and archived["content"]["id"] == content_id


async def test_sealed_content_is_the_creators_alone_on_every_read_path(api: Api) -> None:
    family_id, capsule_id, content_id = await sealed_capsule(api)
    for outsider in ("ben", "cy"):
        assert (await api.error(CONTENT, {"id": content_id}, as_=outsider))[0] == "NOT_FOUND"
        assert (await api.ok(FEED, {"id": family_id}, as_=outsider))["family"]["feed"]["edges"] == []
        notes = [e["node"] for e in (await api.ok(NOTES, as_=outsider))["notifications"]["edges"]]
        assert all(n["content"] is None and n["type"] != "NEW_CONTENT" for n in notes)
        code, _ = await api.error(
            'mutation($id: ID!) { addReaction(contentId: $id, emoji: "👍") { id } }',
            {"id": content_id},
            as_=outsider,
        )
        assert code == "NOT_FOUND"
    capsule = (await api.ok(CAPSULE, {"id": capsule_id}, as_="ben"))["capsule"]
    assert capsule["content"] is None
    assert (await api.error(CAPSULE, {"id": capsule_id}, as_="cy"))[0] == "NOT_FOUND"
    # The creator sees it all along, with its media.
    assert (await api.ok(CONTENT, {"id": content_id}, as_="ana"))["content"]["mediaUrl"]
    assert (await api.ok(CAPSULE, {"id": capsule_id}, as_="ana"))["capsule"]["content"]["id"] == content_id
    # Tags on it stay hidden from search too.
    await api.ok(
        'mutation($id: ID!) { setTags(contentId: $id, values: ["sorpresa"]) { value } }',
        {"id": content_id},
        as_="ana",
    )
    search = 'query($f: ID!) { searchTags(familyId: $f, prefix: "sor") { edges { node { value } } } }'
    assert (await api.ok(search, {"f": family_id}, as_="ben"))["searchTags"]["edges"] == []
    await unlock(api)
    assert (await api.ok(CONTENT, {"id": content_id}, as_="cy"))["content"]["id"] == content_id
    assert (await api.ok(search, {"f": family_id}, as_="ben"))["searchTags"]["edges"] == [
        {"node": {"value": "sorpresa"}}
    ]


async def test_refusals_change_nothing(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    other_family = await family_with_members(api, "zoe", ["yan"], name="Otra")
    await api.sign_in("cy")
    before = await api.snapshot()
    bad_inputs: list[tuple[dict[str, Any], str]] = [
        ({"unlockDate": unlock_in(api, days=-1)}, "BAD_USER_INPUT"),
        ({"unlockDate": unlock_in(api, days=365 * 101)}, "BAD_USER_INPUT"),
        ({"recipientIds": ["yan"]}, "BAD_USER_INPUT"),
        ({"recipientIds": ["cy"]}, "BAD_USER_INPUT"),
        ({"recipientIds": []}, "BAD_USER_INPUT"),
        ({"title": ""}, "BAD_USER_INPUT"),
        ({"title": "x" * 201}, "BAD_USER_INPUT"),
        ({"familyId": other_family}, "NOT_FOUND"),
    ]
    base = {
        "familyId": family_id,
        "title": "Para ti",
        "unlockDate": unlock_in(api, days=1),
        "recipientIds": ["ben"],
    }
    for change, code in bad_inputs:
        assert (await api.error(CREATE, {"i": {**base, **change}}, as_="ana"))[0] == code, change
    assert await api.snapshot() == before

    family_id, capsule_id, _ = await sealed_capsule(api)
    draft = await make_capsule(api, "ana", family_id, ["ben"])
    before = await api.snapshot()
    assert (await api.error(CANCEL, {"id": capsule_id}, as_="ana"))[0] == "CONFLICT"  # LOCKED
    assert (await api.error(SCHEDULE, {"id": draft}, as_="ben"))[0] == "NOT_FOUND"  # a draft is the creator's
    assert (await api.error(SCHEDULE, {"id": capsule_id}, as_="ben"))[0] == "FORBIDDEN"
    assert (await api.error(SCHEDULE, {"id": capsule_id}, as_="ana"))[0] == "CONFLICT"
    assert (await api.error(OPEN, {"id": capsule_id}, as_="ben"))[0] == "CONFLICT"  # not open yet
    assert (await api.error(OPEN, {"id": capsule_id}, as_="cy"))[0] == "NOT_FOUND"  # not a recipient
    await unlock(api)
    assert (await api.error(OPEN, {"id": capsule_id}, as_="cy"))[0] == "NOT_FOUND"
    code, _ = await api.error(OPEN, {"id": capsule_id}, as_="ana")
    assert code == "FORBIDDEN"  # the creator is not a recipient here


async def upload_under_way(api: Api) -> tuple[str, dict[str, Any]]:
    """A SCHEDULED capsule of ana's for ben, and its content's upload, started
    and not completed: the capsule's id and `createUpload`'s answer."""
    family_id = await family_with_members(api, "ana", ["ben"])
    capsule_id = await make_capsule(api, "ana", family_id, ["ben"])
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    started = await start_upload(api, "ana", family_id, "TEXT", "text/plain", 4, capsule_id=capsule_id)
    return capsule_id, started


async def test_the_upload_of_a_cancelled_capsule_is_deletable_by_its_author(api: Api) -> None:
    scheduled, started = await upload_under_way(api)
    content_id = started["content"]["id"]
    delete = "mutation($id: ID!) { deleteContent(contentId: $id) }"
    assert (await api.error(delete, {"id": content_id}, as_="ana"))[0] == "CONFLICT"  # still its capsule's
    assert (await api.ok(CANCEL, {"id": scheduled}, as_="ana"))["cancelCapsule"]["status"] == "CANCELLED"
    assert (await api.error(delete, {"id": content_id}, as_="ben"))[0] == "NOT_FOUND"
    assert (await api.ok(delete, {"id": content_id}, as_="ana"))["deleteContent"] is True
    assert await api.table.get(keys.content(content_id)) is None


async def test_a_cancelled_capsules_abandoned_upload_is_swept(media_api: Api) -> None:
    api = media_api
    capsule_id, started = await upload_under_way(api)
    content_id = started["content"]["id"]
    # The bytes arrive, but nobody completes the upload before the capsule goes.
    assert await put_bytes(api, started["uploadUrl"], b"hola", "text/plain") == 200
    original = f"content/{content_id}/original"
    pipeline = api.services.pipeline
    assert await pipeline.sweep_abandoned() == 0  # nothing is listed while the capsule stands
    await api.ok(CANCEL, {"id": capsule_id}, as_="ana")

    api.clock.advance(days=ABANDONED_UPLOAD_DAYS - 1)
    assert await pipeline.sweep_abandoned() == 0  # the upload could still finish
    assert await api.services.blobs.head(original) == 4
    api.clock.advance(days=2)
    assert await pipeline.sweep_abandoned() == 1
    assert await api.table.get(keys.content(content_id)) is None
    assert await api.services.blobs.head(original) is None
    assert await pipeline.sweep_abandoned() == 0  # once


async def test_a_cancelled_capsules_finished_upload_is_not_swept(api: Api) -> None:
    capsule_id, started = await upload_under_way(api)
    content_id = started["content"]["id"]
    await api.ok(CANCEL, {"id": capsule_id}, as_="ana")
    # Its upload finishes after all (the condition the sweep deletes on stops holding).
    await api.table.update(Update(keys.content(content_id), set={"status": "PROCESSING"}))
    api.clock.advance(days=ABANDONED_UPLOAD_DAYS + 1)
    assert await api.services.pipeline.sweep_abandoned() == 0
    assert await api.table.get(keys.content(content_id)) is not None


async def test_cancel_and_a_capsule_left_empty(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    draft = await make_capsule(api, "ana", family_id, ["ben"])
    assert (await api.ok(CANCEL, {"id": draft}, as_="ana"))["cancelCapsule"]["status"] == "CANCELLED"
    scheduled = await make_capsule(api, "ana", family_id, ["ben"])
    await api.ok(SCHEDULE, {"id": scheduled}, as_="ana")
    received = await api.ok("{ receivedCapsules { edges { node { id status } } } }", as_="ben")
    assert received["receivedCapsules"]["edges"] == [{"node": {"id": scheduled, "status": "SCHEDULED"}}]
    # Its date comes with no content: it stays closed and its creator is told once.
    await unlock(api)
    await api.services.scheduler.run_once()
    assert (await api.ok(CAPSULE, {"id": scheduled}, as_="ana"))["capsule"]["status"] == "SCHEDULED"
    notes = [e["node"]["type"] for e in (await api.ok(NOTES, as_="ana"))["notifications"]["edges"]]
    assert notes.count("CAPSULE_EMPTY") == 1
    code, _ = await api.error(
        """mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl } }""",
        {
            "i": {
                "familyId": family_id,
                "type": "TEXT",
                "mimeType": "text/plain",
                "sizeBytes": 3,
                "capsuleId": scheduled,
            }
        },
        as_="ana",
    )
    assert code == "CONFLICT"


async def unlocked_notes(api: Api) -> Counter[tuple[str, str]]:
    return Counter(
        (item["userId"], item["capsuleId"])
        for item in (await dump(api.table)).values()
        if item.get("type") == "Notification" and item.get("notificationType") == "CAPSULE_UNLOCKED"
    )


async def counted_scheduler(api: Api) -> tuple[UnlockScheduler, CountingTable]:
    """A scheduler of its own on the app's table, whose store calls are counted
    apart from whatever else the app does meanwhile. The capsules it opens are
    due a day ahead, when the app's own scheduler (whose first pass has run by
    the end of a request) sleeps for its hour-long poll."""
    await api.ok("{ me { id } }", as_="ana")
    counting = CountingTable(api.table.inner)  # type: ignore[attr-defined]
    services = api.services
    scheduler = UnlockScheduler(
        table=counting, broker=services.broker, settings=services.settings, clock=services.clock
    )
    return scheduler, counting


# A few due at once, in batches of CLAIM_BATCH; and a burst of 128, won 16 at a
# time (a batch grows with the burst), whose reads and outbox clearings its
# batches share.
BURSTS = [(2 * CLAIM_BATCH, 2), (128, 8)]


@pytest.mark.parametrize(("burst", "batches"), BURSTS)
async def test_capsules_for_a_few_people_open_in_one_transaction_each(
    api: Api, burst: int, batches: int
) -> None:
    people = ["ben", "cy", "dee"]
    await api.table.batch_write(family_rows("fewfamily", "ana", people))
    scheduler, counting = await counted_scheduler(api)
    due = api.clock.moment + timedelta(days=1)
    rows: list[dict[str, Any]] = []
    for n in range(burst):
        chosen = (people[n % 3], people[(n + 1) % 3])
        _, more = capsule_rows("fewfamily", "ana", chosen, due, scheduler.shards, tag=f"{n:03d}")
        rows += more
    await api.table.batch_write(rows)
    api.clock.advance(days=1, seconds=1)
    result = await scheduler.run_once()
    assert result.unlocked == burst and result.failed == 0
    # Each capsule: one transaction, which wins it too (notes, counts, stamps,
    # the opening conditioned on LOCKED, and its outbox item); each batch: one
    # batch get for its reads and one batch write for its outbox items once
    # published. The only updates are the first pass's claims of every shard's
    # lease (it runs alone).
    calls = counting.calls
    assert calls["update"] == scheduler.shards and calls["transact"] == burst, counting.rounds()
    assert calls["batch_get"] == calls["batch_write"] == batches and calls["delete"] == 0, counting.rounds()
    notes = await unlocked_notes(api)
    assert len(notes) == 3 * burst and set(notes.values()) == {1}
    unread = await api.ok("{ notifications { unreadCount } }", as_="ana")
    assert unread["notifications"]["unreadCount"] == burst
    assert not [key for key in await dump(api.table) if key[0].startswith("OUTBOX#")]
    assert (await scheduler.run_once()).unlocked == 0


async def test_a_small_capsule_taken_over_with_a_note_written_counts_it_once(api: Api) -> None:
    await api.table.batch_write(family_rows("fewfamily", "ana", ["ben", "cy"]))
    scheduler, _ = await counted_scheduler(api)
    # UNLOCKING for a minute (a process died after writing ben's note): any
    # pass takes it over, and its one transaction meets that note.
    won = api.clock.moment + timedelta(days=1)
    capsule_id, rows = capsule_rows("fewfamily", "ana", ["ben", "cy"], won, scheduler.shards)
    capsule = Capsule.from_item(next(row for row in rows if row["type"] == "Capsule"))
    await api.table.batch_write(rows)
    await api.table.update(Update(capsule.key, set={"status": "UNLOCKING", "unlockingAt": iso(won)}))
    content_id = capsule.content_id or ""
    (note,) = await notifications.unlocked_notes(capsule, content_id, ["ben"], iso(won))
    assert len(await notifications.write(api.table, None, [note])) == 1
    api.clock.advance(days=1, minutes=1)
    result = await scheduler.run_once()
    assert result.unlocked == 1 and result.failed == 0
    assert await unlocked_notes(api) == Counter({(p, capsule_id): 1 for p in ("ana", "ben", "cy")})
    for person in ("ana", "ben", "cy"):
        unread = await api.ok("{ notifications { unreadCount } }", as_=person)
        assert unread["notifications"]["unreadCount"] == 1, person


async def test_unlock_waits_for_the_content_to_be_ready(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    capsule_id = await make_capsule(api, "ana", family_id, ["ben"])
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    # Garbage for a VIDEO: the pipeline fails it, so the capsule cannot open.
    await upload(api, "ana", family_id, "VIDEO", b"not a video at all", "video/mp4", capsule_id=capsule_id)
    await settle(api)
    result = await unlock(api)
    assert result.unlocked == 0 and result.waiting == 1
    assert (await api.ok(CAPSULE, {"id": capsule_id}, as_="ana"))["capsule"]["status"] == "UNLOCKING"


async def test_notifications_unread_and_mark_read(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy", "dee"])
    for n in range(3):
        await upload(api, "ben", family_id, "TEXT", f"hola {n}".encode(), "text/plain")
    await settle(api)
    notes = [e["node"] for e in (await api.ok(NOTES, as_="ana"))["notifications"]["edges"]]
    kinds = [n["type"] for n in notes]
    assert kinds[:3] == ["NEW_CONTENT"] * 3  # newest first
    assert kinds.count("MEMBER_JOINED") == 3
    first_id = notes[0]["id"]
    marked = await api.ok(
        "mutation($ids: [ID!]) { markNotificationsRead(ids: $ids) }", {"ids": [first_id]}, as_="ana"
    )
    assert marked["markNotificationsRead"] == 1
    unread = await api.ok("{ notifications(unreadOnly: true) { edges { node { id } } } }", as_="ana")
    assert first_id not in [e["node"]["id"] for e in unread["notifications"]["edges"]]
    assert len(unread["notifications"]["edges"]) == len(notes) - 1
    assert (await api.ok("mutation { markNotificationsRead }", as_="ana"))["markNotificationsRead"] == len(
        notes
    ) - 1
    assert (await api.ok("mutation { markNotificationsRead }", as_="ana"))["markNotificationsRead"] == 0
    empty = await api.ok(
        "{ notifications(unreadOnly: true) { edges { node { id } } pageInfo { hasNextPage } } }", as_="ana"
    )
    assert empty["notifications"] == {"edges": [], "pageInfo": {"hasNextPage": False}}
    # ben, the author, is not told of his own content.
    assert "NEW_CONTENT" not in [
        e["node"]["type"] for e in (await api.ok(NOTES, as_="ben"))["notifications"]["edges"]
    ]
