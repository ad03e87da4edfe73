"""Multiplexed events, in process on both engines: subscribers alike share one
execution of an event, each still gets what its own execution would answer,
and a document that selects a field not known to be shareable runs per
subscriber."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from resolvers.core.context import Context
from schema import schema
from schema.multiplex import SHAREABLE, SHARED
from schema.strawberry_internals import core_schema
from store import keys
from store.port import Update
from tests.api.conftest import Api, running_api
from tests.counting import CountingTable
from tests.factories import family_with_members, settle, upload
from tests.servers import until

# Every shareable field under a capsule's opening, the per-viewer id included.
CAPSULE_FIELDS = """id title unlockDate status notificationSent
  content { id type status title mediaUrl thumbnailUrl transcription failureReason createdAt capturedAt
            reactions { emoji count } commentCount }"""
SHARED_DOC = f"subscription {{ capsuleUnlocked {{ id unlockedAt capsule {{ {CAPSULE_FIELDS} }} }} }}"
OWN_DOC = "subscription { capsuleUnlocked { id capsule { id content { id viewerReactions } } } }"
QUERY = f"query($id: ID!) {{ capsule(id: $id) {{ {CAPSULE_FIELDS} }} }}"
URLS = ("mediaUrl", "thumbnailUrl")


@contextlib.asynccontextmanager
async def stream(api: Api, query: str, user: str) -> AsyncIterator[Any]:
    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token(user)}")
    result = await schema.subscribe(query, context_value=context)
    assert hasattr(result, "__anext__"), result
    try:
        yield result
    finally:
        await result.aclose()


async def listening(api: Api, users: list[str]) -> None:
    """Returns once every user's capsule stream listens (polled, never slept on)."""
    channels = [f"user:{user}:capsules" for user in users]
    broker = api.services.broker
    await until(lambda: all(broker.subscriber_count(c) for c in channels), "every stream", interval=0)


async def opened_capsule(api: Api, family_id: str, recipients: list[str]) -> str:
    due = api.clock.moment + timedelta(minutes=5)
    made = await api.ok(
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {
            "i": {
                "familyId": family_id,
                "title": "Para todos",
                "unlockDate": due.isoformat(),
                "recipientIds": recipients,
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
    return capsule_id


async def events_for(
    api: Api, document: str, users: list[str], family_id: str, recipients: list[str]
) -> dict[str, Any]:
    """Each user's first capsuleUnlocked result once a capsule opens."""
    capsule_id = await opened_capsule(api, family_id, recipients)
    async with contextlib.AsyncExitStack() as stack:
        streams = {user: await stack.enter_async_context(stream(api, document, user)) for user in users}
        pending = {user: asyncio.ensure_future(events.__anext__()) for user, events in streams.items()}
        await listening(api, users)
        api.clock.advance(minutes=6)
        assert (await api.services.scheduler.run_once()).unlocked == 1
        results = {user: await asyncio.wait_for(task, 30) for user, task in pending.items()}
    for result in results.values():
        assert not result.errors, result.errors
    return {
        "capsule": capsule_id,
        **{user: result.data["capsuleUnlocked"] for user, result in results.items()},
    }


def without_urls(tree: Any) -> Any:
    """A signed URL is signed for each request: compare that there is one."""
    if isinstance(tree, dict):
        return {k: (v is not None) if k in URLS else without_urls(v) for k, v in tree.items()}
    return tree


async def test_alike_subscribers_share_one_execution_and_each_gets_its_own_answer(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy", "dee"])
    before = SHARED.executions
    got = await events_for(api, SHARED_DOC, ["ana", "ben", "cy", "dee"], family_id, ["ben", "cy", "dee"])
    # ben, cy and dee (MEMBERs, recipients) are alike; ana created it: two executions.
    assert SHARED.executions - before == 2
    notes = {}
    for user in ("ana", "ben", "cy", "dee"):
        listed = await api.ok("{ notifications { edges { node { id type } } } }", as_=user)
        notes[user] = next(
            e["node"]["id"]
            for e in listed["notifications"]["edges"]
            if e["node"]["type"] == "CAPSULE_UNLOCKED"
        )
        # The event is what this viewer's own reading of the capsule answers...
        own = await api.ok(QUERY, {"id": got["capsule"]}, as_=user)
        assert without_urls(got[user]["capsule"]) == without_urls(own["capsule"])
        # ...and its id is this viewer's own.
        assert got[user]["id"] == notes[user]
    assert len(set(notes.values())) == 4


def _read_for_openings(counting: CountingTable, family_id: str, people: list[str]) -> set[str]:
    """Whose membership the batch reads that carried the opening's notes asked for."""
    read = set()
    for _, name, what in counting.trace:
        if name == "batch_get" and "/NOTIF#" in what:
            read |= {p for p in people if "{}/{}".format(*keys.member(family_id, p)) in what}
    return read


async def test_an_opening_is_read_for_the_people_with_a_stream_here_and_a_later_stream_reads_its_own(
    api: Api,
) -> None:
    """With a family's streams spread over processes, each process reads the
    memberships and notes of its own share of the recipients; a stream that
    starts after that read, with the read still fresh, reads for itself and
    is told like everyone else."""
    people = ["ben", "cy", "dee"]
    family_id = await family_with_members(api, "ana", people)
    capsule_id = await opened_capsule(api, family_id, people)
    counting = api.table
    assert isinstance(counting, CountingTable)
    async with stream(api, SHARED_DOC, "ben") as bens:
        first = asyncio.ensure_future(bens.__anext__())
        await listening(api, ["ben"])
        counting.reset()
        api.clock.advance(minutes=6)
        assert (await api.services.scheduler.run_once()).unlocked == 1
        told = (await asyncio.wait_for(first, 30)).data["capsuleUnlocked"]
        assert told["capsule"]["id"] == capsule_id
        assert _read_for_openings(counting, family_id, ["ana", *people]) == {"ben"}
        # cy's stream starts now, and the opening is published again (as the
        # outbox's recovery would): the shared read is fresh, and not cy's.
        async with stream(api, SHARED_DOC, "cy") as cys:
            second = asyncio.ensure_future(cys.__anext__())
            await listening(api, ["cy"])
            stored = await api.table.get(keys.capsule(capsule_id))
            assert stored is not None
            counting.reset()
            await api.services.broker.publish(
                "user:cy:capsules",
                {"kind": "capsule", "capsuleId": capsule_id, "unlockedAt": stored["unlockedAt"]},
            )
            got = (await asyncio.wait_for(second, 30)).data["capsuleUnlocked"]
    assert got["capsule"]["id"] == capsule_id and got["unlockedAt"] == told["unlockedAt"]
    assert _read_for_openings(counting, family_id, ["ana", *people]) == {"cy"}
    listed = await api.ok("{ notifications { edges { node { id type } } } }", as_="cy")
    assert got["id"] in {e["node"]["id"] for e in listed["notifications"]["edges"]}


async def test_a_field_not_known_to_be_shareable_runs_per_subscriber(api: Api) -> None:
    assert "Content.viewerReactions" not in SHAREABLE
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    before = SHARED.executions
    got = await events_for(api, OWN_DOC, ["ben", "cy"], family_id, ["ben", "cy"])
    assert SHARED.executions == before
    for user in ("ben", "cy"):
        assert got[user]["capsule"]["content"]["viewerReactions"] == []


def test_only_listed_fields_are_shared_generated_from_the_schema() -> None:
    """Every field of the payloads' types, one document each: shared exactly
    when listed, so a field added tomorrow runs per subscriber until someone
    lists it; and every listed field exists."""
    from graphql import GraphQLObjectType, get_named_type, parse

    from schema.multiplex import plan_for

    core = core_schema(schema)
    wraps = {
        "CapsuleUnlockedEvent": "capsuleUnlocked { %s }",
        "Capsule": "capsuleUnlocked { capsule { %s } }",
        "Content": "capsuleUnlocked { capsule { content { %s } } }",
    }
    checked = 0
    for type_name, wrap in wraps.items():
        owner = core.type_map[type_name]
        assert isinstance(owner, GraphQLObjectType)
        for name, field in owner.fields.items():
            inner = get_named_type(field.type)
            selection = f"{name} {{ __typename }}" if isinstance(inner, GraphQLObjectType) else name
            operation = parse("subscription { " + wrap % selection + " }").definitions[0]
            shared = plan_for(core, operation) is not None  # type: ignore[arg-type]
            assert shared == (f"{type_name}.{name}" in SHAREABLE), f"{type_name}.{name}"
            checked += 1
    assert checked > 25
    for entry in SHAREABLE:
        type_name, name = entry.split(".")
        listed = core.type_map[type_name]
        assert isinstance(listed, GraphQLObjectType) and name in listed.fields, entry


async def test_one_status_change_is_read_once_for_all_its_subscribers(api: Api) -> None:
    """Each subscriber's answer is still decided by the read rule, on what one
    shared read of the content, its family and the family's memberships found:
    the store is read the same number of times for two subscribers as for
    twelve."""
    members = ["ben", "cy", "dee"]
    family_id = await family_with_members(api, "ana", members)
    content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    document = f'subscription {{ contentStatusChanged(contentId: "{content_id}") {{ id status }} }}'
    view = "mutation($id: ID!) { markContentViewed(contentId: $id) { status } }"

    counting = api.table
    assert isinstance(counting, CountingTable)

    async def reads_for_one_change(users: list[str]) -> tuple[int, list[str]]:
        async with contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(stream(api, document, user)) for user in users]
            for events in streams:  # the status now, first
                assert (await events.__anext__()).data["contentStatusChanged"]["status"] == "READY"
            counting.reset()
            await api.ok(view, {"id": content_id}, as_="ben")
            answers = await asyncio.gather(*(events.__anext__() for events in streams))
            reads = counting.calls["get"] + counting.calls["batch_get"] + counting.calls["query"]
            return reads, [a.data["contentStatusChanged"]["status"] for a in answers]

    few_reads, few = await reads_for_one_change(["ana", "ben"])
    await api.table.update(Update(keys.content(content_id), set={"status": "READY"}))
    many_reads, many = await reads_for_one_change(["ana", *members] * 3)
    assert few == ["DELIVERED"] * 2 and many == ["DELIVERED"] * 12
    assert many_reads == few_reads


async def test_a_class_waits_for_its_lead_and_a_lead_that_runs_nothing_lets_go() -> None:
    from graphql import ExecutionResult

    from schema.multiplex import SharedResults

    shared = SharedResults()
    assert shared.lead("class") is None  # the first leads
    fellow = shared.lead("class")
    assert fellow is not None and not fellow.done()
    shared.release("class")  # its stream ended before it executed
    assert await fellow is None  # the fellow runs its own
    assert shared.lead("class") is None  # the next event starts afresh
    fellow = shared.lead("class")
    assert fellow is not None
    ran = shared.result("class", lambda: ExecutionResult(data={"capsule": 1}))
    assert ran is fellow and (await fellow) is not None
    assert (await fellow).data == {"capsule": 1} and shared.executions == 1  # type: ignore[union-attr]
    shared.release("class")  # executed: nothing to let go
    assert shared.lead("class") is fellow


async def test_a_lead_is_waited_for_past_the_results_lifetime() -> None:
    from graphql import ExecutionResult

    from schema.multiplex import SharedResults

    shared = SharedResults()
    shared.TTL_SECONDS = 0.0  # every result expires at once; a lead must not
    assert shared.lead("class") is None
    fellow = shared.lead("class")
    assert fellow is not None  # the lead still stands: not a second lead
    shared.result("class", lambda: ExecutionResult(data={"capsule": 2}))
    assert (await fellow).data == {"capsule": 2}  # type: ignore[union-attr]
    assert shared.lead("class") is None  # that result expired: the next event leads afresh


def test_a_class_frame_takes_each_event_id_and_no_text_that_spells_its_stand_in() -> None:
    import json

    from graphql import ExecutionResult

    from schema.frames import _EVENT_ID, Encoded
    from schema.multiplex import Plan

    plan = Plan(text="subscription", root="opened", event_ids=("id", "again"))
    data = {"opened": {"id": "first's", "again": "first's", "capsule": {"title": "Para todos"}}}
    encoded = Encoded(ExecutionResult(data=data), plan)
    assert encoded.usable
    for event_id in ("n1.0.2026-12-01T00:00:00+00:00", 'quote " and \\ back'):
        sent = json.loads(encoded.payload(event_id))
        assert sent == {
            "data": {"opened": {"id": event_id, "again": event_id, "capsule": {"title": "Para todos"}}}
        }
    spelled = {"opened": {"id": "x", "again": "x", "capsule": {"title": _EVENT_ID}}}
    assert not Encoded(ExecutionResult(data=spelled), plan).usable  # that one goes the ordinary way


async def stopped(pending: Mapping[str, asyncio.Future[Any]]) -> None:
    for task in pending.values():
        task.cancel()
    await asyncio.gather(*pending.values(), return_exceptions=True)


async def opening_streams(
    api: Api, stack: contextlib.AsyncExitStack, frames: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, asyncio.Future[Any]]]:
    """Each viewer's capsuleUnlocked stream with its frames, waiting for its
    next event, then the opening made in `opened_capsule` let open."""
    from resolvers.processes import live

    streams: dict[str, Any] = {}
    for viewer, own in frames.items():
        context = Context(services=api.services)
        await context.authenticate(f"Bearer {api.token(viewer)}")
        streams[viewer] = live.capsules_unlocked(context, frames=own)
        stack.push_async_callback(streams[viewer].aclose)
    pending = {viewer: asyncio.ensure_future(anext(events)) for viewer, events in streams.items()}
    stack.push_async_callback(stopped, pending)
    await listening(api, list(frames))
    api.clock.advance(minutes=6)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    return streams, pending


class ClassFramesSeen:
    """Stands for each subscriber's WebSocket frames (`schema.frames`) where
    they cannot execute an event themselves: the first to ask about a class is
    told it has no lead (so it leads, the ordinary way), the others that it
    has; each frame sent is noted."""

    def __init__(self, viewer: str, asked: set[Any], sent: list[tuple[str, str]]) -> None:
        self.viewer = viewer
        self.asked = asked
        self.sent = sent

    async def send_shared(self, share: Any, event_id: str, opening: Any = None) -> bool | None:
        if share not in self.asked:
            self.asked.add(share)
            return None
        self.sent.append((self.viewer, event_id))
        return True


class FirstWriteFails(ClassFramesSeen):
    """The first frame the turn writes, to whichever subscriber, fails."""

    def __init__(self, viewer: str, asked: set[Any], sent: list[tuple[str, str]], failed: list[str]) -> None:
        super().__init__(viewer, asked, sent)
        self.failed = failed

    async def send_shared(self, share: Any, event_id: str, opening: Any = None) -> bool | None:
        if share in self.asked and not self.failed:
            self.failed.append(self.viewer)
            raise RuntimeError("the socket failed")
        return await super().send_shared(share, event_id, opening)


async def test_an_opening_is_sent_in_one_turn_to_every_waiting_subscriber_but_its_lead(api: Api) -> None:
    """The subscribers an opening wakes while they wait are taken in one turn:
    one is given the event back and leads its class through its own stream,
    the others' frames are sent from the turn with their own event ids; a
    member who does not receive the capsule gets nothing, and the same opening
    published again is sent to nobody twice."""
    from resolvers.adapters.broker import user_channel

    family_id = await family_with_members(api, "ana", ["ben", "cai", "dora", "eli"])
    recipients = ["ben", "cai", "dora"]
    capsule_id = await opened_capsule(api, family_id, recipients)
    asked: set[Any] = set()
    sent: list[tuple[str, str]] = []
    viewers = [*recipients, "eli"]
    async with contextlib.AsyncExitStack() as stack:
        streams, pending = await opening_streams(
            api, stack, {viewer: ClassFramesSeen(viewer, asked, sent) for viewer in viewers}
        )
        await until(lambda: len(sent) == 2, lambda: f"two frames from the turn, {sent}", interval=0)
        [lead] = [viewer for viewer, task in pending.items() if task.done()]
        capsule, _, lead_event_id, share, _ = pending[lead].result()
        assert capsule.id == capsule_id and share is not None
        # The same opening again (a recovery pass publishes at least once).
        again = {"kind": "capsule", "capsuleId": capsule_id, "unlockedAt": capsule.unlocked_at}
        pending[lead] = asyncio.ensure_future(anext(streams[lead]))
        for viewer in viewers:
            await api.services.broker.publish(user_channel(viewer, "capsules"), dict(again))
        sentinel = await opened_capsule(api, family_id, recipients)
        api.clock.advance(minutes=6)
        assert (await api.services.scheduler.run_once()).unlocked == 1
        await until(lambda: len(sent) == 4, lambda: f"the sentinel's two frames, {sent}", interval=0)
        assert not pending["eli"].done()
    notes = {}
    for viewer in recipients:
        found = await api.ok("{ notifications { edges { node { id capsule { id } } } } }", as_=viewer)
        notes[viewer] = {e["node"]["capsule"]["id"]: e["node"]["id"] for e in found["notifications"]["edges"]}
    assert lead_event_id == notes[lead][capsule_id]
    turn = [(viewer, event_id) for viewer, event_id in sent[:2]]
    assert sorted(turn) == sorted(
        (viewer, notes[viewer][capsule_id]) for viewer in recipients if viewer != lead
    )
    # The second opening's turn: the first capsule's again was sent to nobody.
    assert {event_id for _, event_id in sent[2:]} <= {notes[v][sentinel] for v in recipients}


async def test_a_frame_the_turn_cannot_send_goes_back_to_its_own_stream(api: Api) -> None:
    """One subscriber's failed write does not stop the turn: that subscriber's
    stream gets the opening the ordinary way, the one after it its frame."""

    family_id = await family_with_members(api, "ana", ["ben", "cai", "dora"])
    recipients = ["ben", "cai", "dora"]
    capsule_id = await opened_capsule(api, family_id, recipients)
    asked: set[Any] = set()
    sent: list[tuple[str, str]] = []
    failed: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        _, pending = await opening_streams(
            api, stack, {viewer: FirstWriteFails(viewer, asked, sent, failed) for viewer in recipients}
        )
        await until(
            lambda: failed and sent, lambda: f"a failed write and a frame, {failed}, {sent}", interval=0
        )
        [failing] = failed
        yielded = await asyncio.wait_for(pending[failing], 30)
        assert yielded[0].id == capsule_id
        # One lead through its own stream, the failed one given back, one frame from the turn.
        led = [viewer for viewer, task in pending.items() if task.done() and viewer != failing]
        assert len(led) == 1 and len(sent) == 1
        assert sorted([*led, failing, sent[0][0]]) == recipients


class SocketSeen:
    """A WebSocket that takes every frame at once, noting it (`frames.Socket`)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def live(self, operation_id: str) -> bool:
        return True

    async def send_frame(self, frame: str) -> None:
        self.frames.append(json.loads(frame))

    async def send_frame_at_once(self, frame: str) -> None:
        self.frames.append(json.loads(frame))

    def backed_up(self) -> bool:
        return False

    async def room(self) -> bool:
        return True


async def test_an_opening_leads_each_class_in_its_turn_and_sends_every_frame_from_it(api: Api) -> None:
    """On WebSockets, the opening's turn leads a class nobody leads yet with
    the first subscriber's own stream executor: every subscriber's answer,
    the leads' too, leaves as a frame from the turn, one execution a class,
    and no stream is given the event back; each answer is what an ordinary
    execution answers that subscriber."""
    from schema import frames

    family_id = await family_with_members(api, "ana", ["ben", "cy", "dee"])
    recipients = ["ben", "cy", "dee"]
    users = ["ana", *recipients]
    ordinary = await events_for(api, SHARED_DOC, users, family_id, recipients)
    capsule_id = await opened_capsule(api, family_id, recipients)
    sockets = {user: SocketSeen() for user in users}
    async with contextlib.AsyncExitStack() as stack:
        pending = {}
        for user in users:
            events = await stack.enter_async_context(stream(api, SHARED_DOC, user))
            # The connection's handler sets the target in the task it starts for the operation.
            token = frames.target.set(frames.Target(sockets[user], f"op-{user}", "next"))
            pending[user] = asyncio.ensure_future(events.__anext__())
            frames.target.reset(token)
        stack.push_async_callback(stopped, pending)
        await listening(api, users)
        before = SHARED.executions
        api.clock.advance(minutes=6)
        assert (await api.services.scheduler.run_once()).unlocked == 1
        await until(lambda: all(s.frames for s in sockets.values()), lambda: "a frame each", interval=0)
        # ana (the creator) is a class of her own; ben, cy and dee are one.
        assert SHARED.executions - before == 2
        assert not [user for user, task in pending.items() if task.done()]
    notes = {}
    for user in recipients:
        found = await api.ok("{ notifications { edges { node { id capsule { id } } } } }", as_=user)
        notes[user] = {e["node"]["capsule"]["id"]: e["node"]["id"] for e in found["notifications"]["edges"]}
    for user, socket in sockets.items():
        [frame] = socket.frames
        assert frame["id"] == f"op-{user}" and frame["type"] == "next"
        event = frame["payload"]["data"]["capsuleUnlocked"]
        assert event["capsule"]["id"] == capsule_id
        if user in notes:
            assert event["id"] == notes[user][capsule_id]
        # The same answer as the capsule opened before, run the ordinary way, but for its own ids and dates.
        alike = {**ordinary[user], "id": event["id"], "unlockedAt": event["unlockedAt"]}
        own_ids = {k: event["capsule"][k] for k in ("id", "unlockDate")}
        content = {k: event["capsule"]["content"][k] for k in ("id", "createdAt", "capturedAt")}
        alike["capsule"] = {
            **ordinary[user]["capsule"],
            **own_ids,
            "content": {**ordinary[user]["capsule"]["content"], **content},
        }
        assert without_urls(event) == without_urls(alike)


VIEW = "mutation($id: ID!) { markContentViewed(contentId: $id) { status } }"


async def note_moved_at_first_read(
    api: Api, monkeypatch: Any, moves: Callable[[str], Awaitable[None]], *, before: bool
) -> tuple[str, list[bool]]:
    """A READY note of Ana's, read by Ben too, and `moves` made on it once,
    just before or just after the first batch read of it: its id, and a list
    that holds True once the moves were made."""
    family_id = await family_with_members(api, "ana", ["ben"])
    content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    read_once = api.table.batch_get
    moved: list[bool] = []

    async def read_and_move(keys_: Any) -> Any:
        here = not moved and keys.content(content_id) in list(keys_)
        if here:
            moved.append(True)
            monkeypatch.undo()
        if here and before:
            await moves(content_id)
        found = await read_once(keys_)
        if here and not before:
            await moves(content_id)
        return found

    monkeypatch.setattr(api.table, "batch_get", read_and_move)
    return content_id, moved


async def test_a_move_committed_right_after_a_streams_first_read_is_heard(api: Api, monkeypatch: Any) -> None:
    """The status stream listens before it reads: a move committed between its
    first read and the moment it would otherwise start listening reaches it."""

    async def viewed(content_id: str) -> None:
        await api.ok(VIEW, {"id": content_id}, as_="ben")

    content_id, moved = await note_moved_at_first_read(api, monkeypatch, viewed, before=False)
    document = f'subscription {{ contentStatusChanged(contentId: "{content_id}") {{ status }} }}'
    async with stream(api, document, "ana") as events:
        first = await events.__anext__()
        assert moved, "the stream read the content some other way: this test no longer places the move"
        assert first.data["contentStatusChanged"]["status"] == "READY"
        then = await asyncio.wait_for(events.__anext__(), 30)
        assert then.data["contentStatusChanged"]["status"] == "DELIVERED"


async def test_moves_made_before_a_streams_first_read_are_not_reported_again(
    api: Api, monkeypatch: Any
) -> None:
    """Moves committed after the stream listens but before its first read
    arrive as events once it has read where they led: they are not reported
    (the stream would otherwise step back, to DELIVERED after ARCHIVED); the
    next move is."""

    async def viewed_and_archived(content_id: str) -> None:
        await api.ok(VIEW, {"id": content_id}, as_="ben")  # READY -> DELIVERED
        api.clock.advance(days=91)
        assert await api.services.pipeline.archive_due(90) == 1  # -> ARCHIVED

    content_id, moved = await note_moved_at_first_read(api, monkeypatch, viewed_and_archived, before=True)
    document = f'subscription {{ contentStatusChanged(contentId: "{content_id}") {{ status }} }}'
    async with stream(api, document, "ana") as events:
        first = await events.__anext__()
        assert moved, "the stream read the content some other way: this test no longer places the moves"
        assert first.data["contentStatusChanged"]["status"] == "ARCHIVED"
        restore = "mutation($id: ID!) { restoreContent(contentId: $id) { status } }"
        await api.ok(restore, {"id": content_id}, as_="ana")
        then = await asyncio.wait_for(events.__anext__(), 30)
        assert then.data["contentStatusChanged"]["status"] == "READY"


@pytest.fixture(params=["sqlite", "dynamodb"])
async def still_api(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Api]:
    """The default budget, refilling too slowly to see: what a turn charges stays charged."""
    async with running_api(request.param, "local", tmp_path, request, cost_restore_rate=0.0001) as api:
        yield api


STATUS_DOC = "subscription($id: ID!) { contentStatusChanged(contentId: $id) { id status } }"


async def ready_note(api: Api, members: list[str]) -> tuple[str, str]:
    """A family of Ana's with `members`, and a READY note of hers: the family's id and the note's."""
    family_id = await family_with_members(api, "ana", members)
    content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    return family_id, content_id


async def status_streams(
    api: Api, stack: contextlib.AsyncExitStack, content_id: str, sockets: Mapping[str, SocketSeen]
) -> dict[str, asyncio.Future[Any]]:
    """Each stream (named `user` or `user-n`) on its own socket, its first
    event (the status now) taken, then waiting for the next."""
    from schema import frames

    pending: dict[str, asyncio.Future[Any]] = {}
    for name, socket in sockets.items():
        context = Context(services=api.services)
        await context.authenticate(f"Bearer {api.token(name.split('-')[0])}")
        result = await schema.subscribe(STATUS_DOC, variable_values={"id": content_id}, context_value=context)
        assert hasattr(result, "__anext__"), result
        stack.push_async_callback(result.aclose)
        # The connection's handler sets the target in the task it starts for the operation.
        token = frames.target.set(frames.Target(socket, f"op-{name}", "next"))
        first = await asyncio.ensure_future(result.__anext__())
        frames.target.reset(token)
        assert first.data is not None and first.data["contentStatusChanged"]["status"] == "READY", first
        pending[name] = asyncio.ensure_future(result.__anext__())
    stack.push_async_callback(stopped, pending)
    return pending


async def available(api: Api, user: str) -> int:
    """The points left in the person's bucket, once what is on its way has landed."""
    budget = api.services.rates.budget
    await budget.drain()
    return (await budget.state(f"user:{user}", api.services.now())).remaining


async def test_a_status_change_is_sent_in_one_turn_each_frame_charged_to_its_person(still_api: Api) -> None:
    """The subscribers a status change wakes while they wait are taken in one
    turn: each class is executed once, led from the turn, and every
    subscriber's frame leaves from it, no stream woken; each person's budget
    is charged each of their frames' actual cost (Ben's two streams, two)."""
    api = still_api
    _, content_id = await ready_note(api, ["ben", "cy", "dee"])
    names = ["ana", "ben", "ben-2", "cy", "dee"]
    sockets = {name: SocketSeen() for name in names}
    async with contextlib.AsyncExitStack() as stack:
        pending = await status_streams(api, stack, content_id, sockets)
        points = {user: await available(api, user) for user in ("ana", "ben", "cy", "dee")}
        before = SHARED.executions
        viewed = await api.post(VIEW, {"id": content_id}, as_="cy")
        assert viewed["data"]["markContentViewed"]["status"] == "DELIVERED"
        points["cy"] -= viewed["extensions"]["cost"]["actualQueryCost"]  # the mutation's own
        await until(lambda: all(s.frames for s in sockets.values()), lambda: "a frame each", interval=0)
        # Ana (ADMIN, the author) is a class of her own; Ben, Cy and Dee are one.
        assert SHARED.executions - before == 2
        assert not [name for name, task in pending.items() if task.done()]
        for user in points:
            frames = sum(1 for name in names if name.split("-")[0] == user)
            # A frame of one object costs one point.
            assert await available(api, user) == points[user] - frames, user
    for name, socket in sockets.items():
        [frame] = socket.frames
        assert frame["id"] == f"op-{name}" and frame["type"] == "next"
        assert frame["payload"] == {
            "data": {"contentStatusChanged": {"id": content_id, "status": "DELIVERED"}}
        }


async def test_a_status_frame_the_budget_refuses_goes_back_to_its_stream_which_ends(still_api: Api) -> None:
    """A person whose budget is spent is refused in the turn: their stream is
    given the change back, is refused the ordinary way (RATE_LIMITED) and
    ends; everyone else's frame leaves from the turn."""
    api = still_api
    _, content_id = await ready_note(api, ["ben", "cy"])
    sockets = {name: SocketSeen() for name in ("ana", "ben", "cy")}
    async with contextlib.AsyncExitStack() as stack:
        pending = await status_streams(api, stack, content_id, sockets)
        budget = api.services.rates.budget
        assert await budget.charge("user:ben", await available(api, "ben"), api.services.now()) is not None
        await api.ok(VIEW, {"id": content_id}, as_="cy")
        refused = await asyncio.wait_for(pending["ben"], 30)
        assert refused.errors[0].extensions["code"] == "RATE_LIMITED", refused
        await until(
            lambda: sockets["ana"].frames and sockets["cy"].frames, "ana's and cy's frames", interval=0
        )
        assert not pending["ana"].done() and not pending["cy"].done()
    assert sockets["ben"].frames == []


async def test_a_status_change_not_decided_in_its_turn_is_decided_by_each_stream(api: Api) -> None:
    """A subscriber who may no longer read the content (removed from the
    family) is not sent the change from the turn: its own stream decides,
    and sends nothing; the others' frames leave from the turn."""
    family_id, content_id = await ready_note(api, ["ben", "cy"])
    sockets = {name: SocketSeen() for name in ("ana", "ben", "cy")}
    async with contextlib.AsyncExitStack() as stack:
        pending = await status_streams(api, stack, content_id, sockets)
        remove = "mutation($f: ID!, $u: ID!) { removeMember(familyId: $f, userId: $u) }"
        await api.ok(remove, {"f": family_id, "u": "cy"}, as_="ana")
        await api.ok(VIEW, {"id": content_id}, as_="ben")
        await until(
            lambda: sockets["ana"].frames and sockets["ben"].frames, "ana's and ben's frames", interval=0
        )
        assert not pending["cy"].done()
        # A second change reaches everyone still a reader: Cy's stream decided the first and waits again.
        api.clock.advance(days=91)
        assert await api.services.pipeline.archive_due(90) == 1  # -> ARCHIVED
        await until(lambda: len(sockets["ben"].frames) == 2, "ben's second frame", interval=0)
        assert not pending["cy"].done()
    assert sockets["cy"].frames == []
