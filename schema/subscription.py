from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Hashable
from contextlib import aclosing
from typing import Annotated

import strawberry

from resolvers.processes import live
from schema import frames
from schema.capsule import Capsule, CapsuleUnlockedEvent
from schema.common import Info, when
from schema.content import Content
from schema.cost import event_cost
from schema.notification import Notification
from store.items import Capsule as CapsuleRecord
from store.items import Content as ContentRecord

# Each resolver holds one of the viewer's subscription slots before anything is
# subscribed (a refusal is the operation's first answer: an `error` message on
# graphql-transport-ws), and charges every event it delivers at its cost. An
# event shared by a class of subscribers on WebSockets leaves as the class's
# frame when it can (`schema.frames`); the one that leads the class, and every
# other, take the ordinary way. A stream closed closes what it reads from at
# once (its channel, its replay's turn), not when it is collected.


# Resuming, the ids a client already holds (why: `live.Seen.holding`).
Received = Annotated[
    list[strawberry.ID] | None,
    strawberry.argument(
        description="ids of events this client already holds (at most 100, the most recent): "
        "not sent again, by the replay or live"
    ),
]


async def sent(
    sink: frames.FrameSink | None, share: Hashable, event_id: str | None, charge: live.Charge
) -> bool:
    """Whether the event went out as its class's shared frame."""
    return sink is not None and await sink.sent(share, event_id, charge)


def opened_event(
    capsule: CapsuleRecord, unlocked_at: str, event_id: str, share: live.Share | None
) -> CapsuleUnlockedEvent:
    """The event `capsuleUnlocked` yields for an opening: its executions' root
    value, where its stream yields it or where an opening's turn leads its class."""
    return CapsuleUnlockedEvent(
        id=strawberry.ID(event_id), capsule=Capsule(item=capsule), unlocked_at=when(unlocked_at), share=share
    )


def status_event(content: ContentRecord, share: live.Share | None) -> Content:
    """The event `contentStatusChanged` yields for a change: its executions'
    root value, where its stream yields it or where a change's turn leads its class."""
    return Content(item=content, share=share)


@strawberry.type
class Subscription:
    @strawberry.subscription(
        description="every capsule the viewer created or receives, as it becomes AVAILABLE; "
        "with `after` (an event id), first those that opened since that event, oldest first; "
        "none of the events in `received`"
    )
    async def capsule_unlocked(
        self, info: Info, after: strawberry.ID | None = None, received: Received = None
    ) -> AsyncGenerator[CapsuleUnlockedEvent, None]:
        cost = event_cost(info)
        most = live.replay_bound(cost, info.context.services.settings.max_query_cost)

        sink = frames.sink_for(info, opened_event)

        async def events(charge: live.Charge) -> AsyncIterator[CapsuleUnlockedEvent]:
            stream = live.capsules_unlocked(
                info.context,
                str(after) if after is not None else None,
                most,
                frames=sink,
                received=received or (),
            )
            async with aclosing(stream):
                async for capsule, unlocked_at, event_id, share, prime in stream:
                    if share is not None and await sent(sink, share, event_id, charge):
                        continue
                    prime()
                    try:
                        yield opened_event(capsule, unlocked_at, event_id, share)
                    finally:
                        if sink is not None:
                            sink.done()

        return await live.held(info.context, events, cost, info.field_name)  # type: ignore[return-value]

    @strawberry.subscription(
        description="every notification addressed to the viewer, as it is created; with `after` "
        "(a notification id), first those created since that one, oldest first; none of those in `received`"
    )
    async def notification_added(
        self, info: Info, after: strawberry.ID | None = None, received: Received = None
    ) -> AsyncGenerator[Notification, None]:
        cost = event_cost(info)
        most = live.replay_bound(cost, info.context.services.settings.max_query_cost)

        async def events(charge: live.Charge) -> AsyncIterator[Notification]:
            stream = live.notifications_added(
                info.context, str(after) if after is not None else None, most, received=received or ()
            )
            async with aclosing(stream):
                async for note in stream:
                    yield Notification(item=note)

        return await live.held(info.context, events, cost, info.field_name)  # type: ignore[return-value]

    @strawberry.subscription(
        description="status changes of one content the viewer may read; the first event is its status now"
    )
    async def content_status_changed(
        self, info: Info, content_id: strawberry.ID
    ) -> AsyncGenerator[Content, None]:
        sink = frames.sink_for(info, status_event)

        async def events(charge: live.Charge) -> AsyncIterator[Content]:
            stream = live.content_status(info.context, str(content_id), frames=sink, charge=charge)
            async with aclosing(stream):
                async for content, share in stream:
                    if share is not None and await sent(sink, share, None, charge):
                        continue
                    try:
                        yield status_event(content, share)
                    finally:
                        if sink is not None:
                            sink.done()

        return await live.held(info.context, events, event_cost(info), info.field_name)  # type: ignore[return-value]
