"""Resuming a person's streams with `after`, in process on both engines: the
replay sends what came after that event, oldest first, then the stream goes on
live; an event committed and published while the replay reads the table comes
once, whichever side of the read it lands on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from resolvers.core.context import Context
from resolvers.domain import notifications
from schema import schema
from store import keys
from store.enums import NotificationType
from store.items import Notification, iso
from tests.api.conftest import Api
from tests.factories import family_with_members, settle, upload

NOTES = "subscription($after: ID) { notificationAdded(after: $after) { id type } }"
CAPSULES = "subscription($after: ID) { capsuleUnlocked(after: $after) { id capsule { id } } }"


@contextlib.asynccontextmanager
async def stream(api: Api, query: str, after: str | None, user: str) -> AsyncIterator[Any]:
    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token(user)}")
    result = await schema.subscribe(query, variable_values={"after": after}, context_value=context)
    assert hasattr(result, "__anext__"), result
    try:
        yield result
    finally:
        await result.aclose()


async def next_data(events: Any) -> dict[str, Any]:
    # A hang guard only: an event that never comes fails here, not in CI's timeout.
    result = await asyncio.wait_for(events.__anext__(), 30)
    assert not result.errors, result.errors
    data: dict[str, Any] = result.data
    return data


async def note_for(
    api: Api, user: str, family_id: str, type: str = NotificationType.MEMBER_JOINED
) -> Notification:
    """A notification written and announced as the domain does it."""
    note = Notification(
        user_id=user,
        id=notifications.notification_id("test", iso(api.clock())),
        type=type,
        created_at=iso(api.clock()),
        family_id=family_id,
    )
    await notifications.write(api.table, api.services.broker, [note])
    return note


def raw(public_id: str) -> str:
    """The stored id inside a public one (`<id>.<epoch>.<createdAt>`)."""
    return public_id.split(".", 1)[0]


async def ids_newest_first(api: Api, user: str) -> list[str]:
    page = await api.table.query(keys.user_pk(user), descending=True)
    return [item["id"] for item in page.items if item.get("type") == "Notification"]


async def test_resume_replays_what_was_missed_oldest_first_then_goes_live(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    for title in ("uno", "dos", "tres"):
        await upload(api, "ana", family_id, "TEXT", title.encode(), "text/plain", title=title)
    await settle(api)
    newest_first = await ids_newest_first(api, "ben")
    assert len(newest_first) == 3
    last_seen, missed = newest_first[-1], newest_first[-2::-1]
    async with stream(api, NOTES, last_seen, "ben") as events:
        replayed = [(await next_data(events))["notificationAdded"]["id"] for _ in missed]
        assert [raw(i) for i in replayed] == missed
        live = await note_for(api, "ben", family_id)
        assert raw((await next_data(events))["notificationAdded"]["id"]) == live.id
    # The public id of the last one seen holds its place: the same replay, read from there.
    async with stream(api, NOTES, replayed[0], "ben") as events:
        again = [(await next_data(events))["notificationAdded"]["id"] for _ in range(2)]
    assert [raw(i) for i in again] == [*missed[1:], live.id]


@pytest.mark.parametrize("lands", ["before the read", "after the read"])
async def test_an_event_published_during_the_replay_comes_once(api: Api, lands: str) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    first = await note_for(api, "ben", family_id)
    missed = await note_for(api, "ben", family_id)
    racing: list[Notification] = []
    table = api.table
    replay_read = table.query

    async def query_racing_a_publish(pk: str, *args: Any, **kwargs: Any) -> Any:
        # The replay's read of ben's notifications, with a new one committed and
        # published on one side of it or the other.
        if pk == keys.user_pk("ben") and kwargs.get("descending") and not racing:
            if lands == "before the read":
                racing.append(await note_for(api, "ben", family_id))
                return await replay_read(pk, *args, **kwargs)
            page = await replay_read(pk, *args, **kwargs)
            racing.append(await note_for(api, "ben", family_id))
            return page
        return await replay_read(pk, *args, **kwargs)

    table.query = query_racing_a_publish  # type: ignore[method-assign]
    try:
        async with stream(api, NOTES, first.id, "ben") as events:
            got = [raw((await next_data(events))["notificationAdded"]["id"]) for _ in range(2)]
            sentinel = await note_for(api, "ben", family_id)
            got.append(raw((await next_data(events))["notificationAdded"]["id"]))
    finally:
        del table.query
    # The racing event once, in its place; the sentinel shows nothing came twice before it.
    assert got == [missed.id, racing[0].id, sentinel.id]


async def test_capsule_events_carry_a_stable_id_and_resume(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    before = await note_for(api, "ben", family_id)
    capsule_id = await open_capsule_for(api, family_id, "ben")
    event_id = notifications.notification_id(NotificationType.CAPSULE_UNLOCKED, capsule_id, "ben")
    async with stream(api, CAPSULES, before.id, "ben") as events:
        data = await next_data(events)
    public = data["capsuleUnlocked"]["id"]
    assert raw(public) == event_id and data["capsuleUnlocked"]["capsule"] == {"id": capsule_id}
    listed = await api.ok("{ notifications { edges { node { id type } } } }", as_="ben")
    assert {"id": public, "type": "CAPSULE_UNLOCKED"} in [e["node"] for e in listed["notifications"]["edges"]]
    # Resuming from the capsule's own event id replays nothing of it.
    async with stream(api, CAPSULES, public, "ben") as events:
        nothing = asyncio.ensure_future(events.__anext__())
        later = await open_capsule_for(api, family_id, "ben")
        result = await asyncio.wait_for(nothing, 30)
    assert result.data["capsuleUnlocked"]["capsule"]["id"] == later
    assert raw(result.data["capsuleUnlocked"]["id"]) == notifications.notification_id(
        NotificationType.CAPSULE_UNLOCKED, later, "ben"
    )


RESUMED = {
    "notificationAdded": "subscription($after: ID, $received: [ID!]) "
    "{ notificationAdded(after: $after, received: $received) { id } }",
    "capsuleUnlocked": "subscription($after: ID, $received: [ID!]) "
    "{ capsuleUnlocked(after: $after, received: $received) { id } }",
}


async def event_of(api: Api, field: str, family_id: str) -> str:
    """A new event of `field`'s stream for ben, committed and published; its public id."""
    if field == "notificationAdded":
        note = await note_for(api, "ben", family_id)
    else:
        capsule_id = await open_capsule_for(api, family_id, "ben")
        found = await api.table.get(
            keys.notification(
                "ben",
                (await api.table.get(keys.capsule(capsule_id)) or {})["unlockedAt"],
                notifications.notification_id(NotificationType.CAPSULE_UNLOCKED, capsule_id, "ben"),
            )
        )
        assert found is not None
        note = Notification.from_item(found)
    api.clock.advance(seconds=1)
    return notifications.public_id(note)


@pytest.mark.parametrize("field", sorted(RESUMED))
@pytest.mark.parametrize("told", [True, False], ids=["received told", "received not told"])
async def test_what_the_client_received_out_of_order_is_not_sent_again(
    api: Api, field: str, told: bool
) -> None:
    """ben's client got C, then A (a note dated before its commit arrives
    after a later-dated one), and resumes after A: the replay reads B and C,
    and sends C again unless the client says it holds it, live as well."""
    family_id = await family_with_members(api, "ana", ["ben"])
    a, b, c = [await event_of(api, field, family_id) for _ in range(3)]
    received = [c] if told else None
    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token('ben')}")
    events = await schema.subscribe(
        RESUMED[field], variable_values={"after": a, "received": received}, context_value=context
    )
    assert hasattr(events, "__anext__"), events
    try:
        got = [(await next_data(events))[field]["id"]]
        if not told:
            got.append((await next_data(events))[field]["id"])
        # C published again (as an outbox's recovery would), then a new event.
        if field == "notificationAdded":
            note_id, _, created_at = c.split(".", 2)
            await api.services.broker.publish(*notifications.announcement("ben", created_at, note_id))
        sentinel = await event_of(api, field, family_id)
        got.append((await next_data(events))[field]["id"])
    finally:
        await events.aclose()
    assert [raw(i) for i in got] == [raw(b), *([] if told else [raw(c)]), raw(sentinel)]


@pytest.mark.parametrize("field", sorted(RESUMED))
async def test_received_is_bounded_written_in_the_document_too(api: Api, field: str) -> None:
    """Over HTTP a variable's list is bounded before anything runs
    (schema.cost); a list written in the document is bounded by the stream."""
    await family_with_members(api, "ana", ["ben"])
    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token('ben')}")
    listed = ", ".join(f'"x{n}"' for n in range(101))
    events = await schema.subscribe(
        f"subscription {{ {field}(received: [{listed}]) {{ id }} }}", context_value=context
    )
    assert hasattr(events, "__anext__"), events
    try:
        result = await asyncio.wait_for(events.__anext__(), 30)
    finally:
        await events.aclose()
    assert result.errors and result.errors[0].extensions is not None
    assert result.errors[0].extensions["code"] == "BAD_USER_INPUT"
    assert "at most 100" in result.errors[0].message


async def test_an_unknown_after_is_refused_with_a_reason(api: Api) -> None:
    await family_with_members(api, "ana", ["ben"])
    async with stream(api, NOTES, "no-such-event", "ben") as events:
        result = await asyncio.wait_for(events.__anext__(), 30)
    assert result.errors
    assert result.errors[0].extensions["code"] == "BAD_USER_INPUT"
    assert "refetch" in result.errors[0].message


async def open_capsule_for(api: Api, family_id: str, recipient: str) -> str:
    """A capsule for `recipient`, unlocked by the scheduler now."""
    due = api.clock.moment + timedelta(minutes=5)
    made = await api.ok(
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {
            "i": {
                "familyId": family_id,
                "title": "t",
                "unlockDate": due.isoformat(),
                "recipientIds": [recipient],
            }
        },
        as_="ana",
    )
    capsule_id = str(made["createCapsule"]["id"])
    await api.ok(
        "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { id } }", {"id": capsule_id}, as_="ana"
    )
    await upload(api, "ana", family_id, "TEXT", b"dentro", "text/plain", capsule_id=capsule_id)
    await settle(api)
    api.clock.advance(minutes=6)
    result = await api.services.scheduler.run_once()
    assert result.unlocked == 1, result
    return capsule_id
