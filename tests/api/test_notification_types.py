"""Every kind of notification follows one read rule, on both engines.

The rows are keyed by `NotificationType`: a new member of the enum fails here
until it has a row that makes it happen through the API. Each kind, made twice
by what people do, is listed unread, counted in `unreadCount`, listed by
`unreadOnly`, delivered on `notificationAdded`; the first is then marked read
by its id, the second by "mark everything read"."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from resolvers.domain import notifications
from store.enums import NotificationType
from tests.api.conftest import Api
from tests.api.test_capsules import SCHEDULE, make_capsule
from tests.api.test_resume import stream
from tests.factories import join, make_family, settle, upload
from tests.servers import until

NOTES = "subscription { notificationAdded { id type } }"
STATE = """{ notifications(first: 100) { unreadCount edges { node { id type read } } }
  unread: notifications(first: 100, unreadOnly: true) { edges { node { id type read } } } }"""
COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id } }"


@dataclass
class World:
    """A family of ana (ADMIN) and ben, a family that admits by vouching, and
    a post of ana's; each row adds what it needs."""

    family_id: str
    vouched_code: str
    post_id: str
    made: int = 0
    capsules: list[str] = field(default_factory=list)

    def fresh(self, prefix: str) -> str:
        self.made += 1
        return f"{prefix}{self.made}"


async def new_content(api: Api, world: World) -> str:
    await upload(api, "ben", world.family_id, "TEXT", world.fresh("hola ").encode(), "text/plain")
    await settle(api)
    return "ana"


async def new_comment(api: Api, world: World) -> str:
    await api.ok(COMMENT, {"id": world.post_id, "b": world.fresh("qué bonito ")}, as_="ben")
    return "ana"


async def member_joined(api: Api, world: World) -> str:
    code = await api.ok(
        "query($id: ID!) { family(id: $id) { inviteCode } }", {"id": world.family_id}, as_="ana"
    )
    await join(api, world.fresh("primo"), code["family"]["inviteCode"])
    return "ana"


async def member_pending(api: Api, world: World) -> str:
    await join(api, world.fresh("vecino"), world.vouched_code)
    return "ana"


async def capsule_unlocked(api: Api, world: World) -> str:
    capsule_id = await make_capsule(api, "ana", world.family_id, ["ben"], hours=1)
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    await upload(api, "ana", world.family_id, "TEXT", b"te quiero", "text/plain", capsule_id=capsule_id)
    await settle(api)
    api.clock.advance(hours=1, seconds=1)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    return "ben"


async def capsule_empty(api: Api, world: World) -> str:
    capsule_id = await make_capsule(api, "ana", world.family_id, ["ben"], hours=1)
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    api.clock.advance(hours=1, seconds=1)
    assert (await api.services.scheduler.run_once()).told_empty == 1
    return "ana"


ROWS: dict[NotificationType, Callable[[Api, World], Awaitable[str]]] = {
    NotificationType.NEW_CONTENT: new_content,
    NotificationType.NEW_COMMENT: new_comment,
    NotificationType.MEMBER_JOINED: member_joined,
    NotificationType.MEMBER_PENDING: member_pending,
    NotificationType.CAPSULE_UNLOCKED: capsule_unlocked,
    NotificationType.CAPSULE_EMPTY: capsule_empty,
}


def test_every_type_has_a_row() -> None:
    assert set(ROWS) == set(NotificationType)


async def world_of(api: Api) -> World:
    family = await make_family(api, "ana")
    await join(api, "ben", family["inviteCode"])
    vouched = await make_family(api, "ana", name="Los Vecinos", trust="VOUCHED")
    post_id = await upload(api, "ana", family["id"], "TEXT", b"mi nota", "text/plain")
    await settle(api)
    await api.ok("mutation { markNotificationsRead }", as_="ana")
    await api.ok("mutation { markNotificationsRead }", as_="ben")
    return World(family["id"], vouched["inviteCode"], post_id)


async def listed(api: Api, person: str) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    data = await api.ok(STATE, as_=person)
    return (
        data["notifications"]["unreadCount"],
        [e["node"] for e in data["notifications"]["edges"]],
        [e["node"] for e in data["unread"]["edges"]],
    )


async def listening(api: Api, person: str) -> None:
    """Until the stream has subscribed to the person's channel (in process)."""
    broker = api.services.broker
    channel = notifications.channel(person)
    await until(lambda: broker.subscriber_count(channel), "the subscription to open", interval=0)


async def made_and_delivered(api: Api, world: World, kind: NotificationType, person: str) -> str:
    """Makes one notification of `kind` happen while `person` listens; its id."""
    async with stream(api, NOTES, None, person) as events:
        pending = asyncio.ensure_future(events.__anext__())
        await listening(api, person)
        assert await ROWS[kind](api, world) == person
        delivered = await asyncio.wait_for(pending, 30)  # a hang guard only
    assert not delivered.errors, delivered.errors
    note = delivered.data["notificationAdded"]
    assert note["type"] == kind
    return str(note["id"])


@pytest.mark.parametrize("kind", list(NotificationType))
async def test_each_type_is_unread_counted_delivered_and_marked_read(
    api: Api, kind: NotificationType
) -> None:
    world = await world_of(api)
    person = await ROWS[kind](api, world)  # who this kind is addressed to, once
    await api.ok("mutation { markNotificationsRead }", as_=person)

    first = await made_and_delivered(api, world, kind, person)
    count, everything, unread = await listed(api, person)
    assert count == 1
    assert [(n["id"], n["type"], n["read"]) for n in unread] == [(first, kind, False)]
    assert {"id": first, "type": kind, "read": False} in everything

    marked = await api.ok(
        "mutation($ids: [ID!]) { markNotificationsRead(ids: $ids) }", {"ids": [first]}, as_=person
    )
    assert marked["markNotificationsRead"] == 1
    count, everything, unread = await listed(api, person)
    assert count == 0 and unread == []
    assert {"id": first, "type": kind, "read": True} in everything

    second = await made_and_delivered(api, world, kind, person)
    count, _, unread = await listed(api, person)
    assert count == 1 and [n["id"] for n in unread] == [second]
    assert (await api.ok("mutation { markNotificationsRead }", as_=person))["markNotificationsRead"] == 1
    count, everything, unread = await listed(api, person)
    assert count == 0 and unread == []
    assert {"id": second, "type": kind, "read": True} in everything
