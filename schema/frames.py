"""One frame per distinct payload: a shared subscription event leaves as text
encoded once for its class, written to every socket of the class.

`schema.multiplex` already executes an event once for the subscribers it finds
alike. Each of them still took that result through the whole per-subscriber
pipeline: graphql-core's per-event execution, Strawberry's result hooks and
processing, the protocol's message and its JSON encoding. On a WebSocket, a
subscription whose document is shared (`multiplex.plan_for`) skips all of it
for every subscriber of a class but the one that leads it:

- the first subscriber of a class to reach an event leads it: its event goes
  the ordinary way and its execution is the class's (`SHARED.lead`);
- its fellows wait for that result; if it has errors, or the lead ran nothing,
  they go the ordinary way too, each with its own execution;
- otherwise each fellow's frame is the class's encoded `data` with its own
  operation id and event id joined in (`Encoded`), charged to its budget as
  any event is, and written by its own task (or queued behind what its
  connection is sending).

An opening's turn (`resolvers.processes.live`) sends its subscribers' frames
itself; there, a class nobody leads yet is led in place: the first
subscriber's event is executed by its own stream's executor (what graphql-core
does for each event the stream yields: `execute_subscription_event`), and its
frame is the class's like the others', instead of the event going back to its
stream to run the ordinary way. Each process that holds streams for an
opening leads its classes once, so the ordinary way's cost per event (the
stream's resume, its result's processing and message) would be paid by every
process an opening reaches.

The socket's operation is found through `target` (a context variable the
connection's handler sets for the task it starts for the operation), so a
transport that does not set it (SSE, multipart, in-process calls) keeps the
ordinary path.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from graphql import ExecutionResult, execute_subscription_event

from resolvers.processes.live import Lead
from schema.cost import event_actual_cost
from schema.multiplex import (
    SHARED,
    MultiplexingExecutionContext,
    Plan,
    class_key,
    plan_for,
    subscribing,
    variables_key,
)
from schema.strawberry_internals import raw_info

# Stands for each subscriber's event id in a class's encoded data.
_EVENT_ID = "\x00mifamilias-event-id\x00"
_EVENT_ID_ENCODED = orjson.dumps(_EVENT_ID).decode()

# Charges one event to the subscriber's budget: its actual cost, when known.
Charge = Callable[[int | None], Awaitable[None]]
# The field's event object (its executions' root value), made from what its
# stream would yield (`live.Lead.yielded`).
EventFor = Callable[..., object]


class Socket(Protocol):
    """The connection side of a subscription operation."""

    def live(self, operation_id: str) -> bool:
        """Whether the operation is still running on the connection."""
        ...

    async def send_frame(self, frame: str) -> None:
        """Sends an encoded text frame, never holding anything shared while
        the client takes it (`schema.backpressure`)."""
        ...

    async def send_frame_at_once(self, frame: str) -> None:
        """Sends an encoded text frame if the client takes it at once, or
        queues it: a caller sending to many sockets in turn waits for none."""
        ...

    def backed_up(self) -> bool:
        """Whether the client is not taking what it was sent."""
        ...

    async def room(self) -> bool:
        """Waits until the client takes what it was sent; False when it
        was let go meanwhile (nothing more goes to it)."""
        ...


@dataclass(frozen=True)
class Target:
    socket: Socket
    operation_id: str
    message_type: str  # "next" (graphql-transport-ws) or "data" (graphql-ws)


target: contextvars.ContextVar[Target | None] = contextvars.ContextVar("frames_target", default=None)


class Encoded:
    """A class's result as JSON, split where each subscriber's event id goes."""

    __slots__ = ("actual", "parts", "result", "usable")

    def __init__(self, result: ExecutionResult, plan: Plan) -> None:
        self.result = result
        self.actual: int | None = None  # what the result cost, counted once for its class
        data = result.data
        if plan.event_ids and data is not None:
            event = dict(data[plan.root])
            for key in plan.event_ids:
                event[key] = _EVENT_ID
            data = {**data, plan.root: event}
        # Text, as the frames go out: graphql-ws clients expect text frames.
        self.parts = orjson.dumps({"data": data}).decode().split(_EVENT_ID_ENCODED)
        # The stand-in found anywhere else (a text that spells it) would take an
        # id too: such a result goes the ordinary way.
        self.usable = data is None or len(self.parts) == 1 + (len(plan.event_ids) if plan.event_ids else 0)

    def payload(self, event_id: str | None) -> str:
        if len(self.parts) == 1:
            return self.parts[0]
        return orjson.dumps(event_id).decode().join(self.parts)


# The encoded result of each class, by its key; an entry lives as long as
# `SHARED` keeps the result it was encoded from.
_encoded: dict[Hashable, Encoded] = {}


def _encoded_for(key: Hashable, result: ExecutionResult, plan: Plan) -> Encoded:
    found = _encoded.get(key)
    if found is not None and found.result is result:
        return found
    if len(_encoded) > 1000:
        _encoded.clear()
    found = _encoded[key] = Encoded(result, plan)
    return found


class FrameSink:
    """One subscription operation on a WebSocket whose events may leave as
    their class's shared frame."""

    __slots__ = (
        "_cost_of",
        "_counted",
        "_event_for",
        "_executed",
        "_executor",
        "_leading",
        "_prefix",
        "_target",
        "plan",
        "variables",
    )

    def __init__(
        self,
        found: Target,
        plan: Plan,
        variables: dict[str, Any],
        counted: Callable[[], None],
        cost_of: Callable[[Any], int],
        *,
        executed: Callable[[], None],
        executor: MultiplexingExecutionContext | None = None,
        event_for: EventFor | None = None,
    ) -> None:
        self._target = found
        self._cost_of = cost_of  # what an event's data cost
        self.plan = plan
        self.variables = variables_key(variables)
        self._counted = counted  # one frame sent as its class's
        self._executed = executed  # one event executed for this subscriber
        # The stream's own executor, and how its events are made: with both,
        # an opening's turn may lead this subscriber's class in place.
        self._executor = executor
        self._event_for = event_for
        operation_id = orjson.dumps(found.operation_id).decode()
        self._prefix = f'{{"id":{operation_id},"type":"{found.message_type}","payload":'
        self._leading: Hashable | None = None

    async def sent(self, share: Hashable, event_id: str | None, charge: Charge) -> bool:
        """Whether the event went out as its class's frame. False: the caller
        delivers it the ordinary way, then calls `done` (it may lead the class)."""
        # Nothing is encoded, led or charged for a client that is not reading,
        # nor for one let go (its operation is being stopped).
        if not await self._target.socket.room():
            return True
        key = class_key(self.plan, self.variables, share)
        shared = SHARED.lead(key)
        if shared is None:
            self._leading = key
            return False
        encoded = await self._encoded(key, shared)
        if encoded is None:
            return False
        await self._charge(encoded, charge)
        found = self._target
        await self._send(encoded, event_id, found.socket.send_frame, self._counted)
        return True

    async def send_shared(
        self, share: Hashable, event_id: str | None, lead: Lead | None = None, charge: Charge | None = None
    ) -> bool | None:
        """`sent` for a caller sending many subscribers' frames in turn (an
        event's turn, `resolvers.processes.live`): it waits for the class's
        result, never for the client, and charges the result's cost with
        `charge` when given one (an opening's turn charges nothing). A class
        with no lead yet is led here, from `lead`, when this sink can execute
        its stream's events; None when it cannot (nobody is made the lead);
        False when the class's result is not one to share, or the client is
        not taking what it was sent (its own task waits for it: `sent`)."""
        if self._target.socket.backed_up():
            return False
        key = class_key(self.plan, self.variables, share)
        shared = SHARED.peek(key)
        executed = False
        if shared is None:
            if lead is None or (shared := self._lead(key, lead)) is None:
                return None
            executed = True
        encoded = await self._encoded(key, shared)
        if encoded is None:
            return False
        if charge is not None:
            await self._charge(encoded, charge)
        counted = self._executed if executed else self._counted
        await self._send(encoded, event_id, self._target.socket.send_frame_at_once, counted)
        return True

    async def _charge(self, encoded: Encoded, charge: Charge) -> None:
        """Charges the class's result at what it cost, counted once for the class."""
        if encoded.actual is None:
            encoded.actual = self._cost_of(encoded.result.data)
        await charge(encoded.actual)

    def _lead(self, key: Hashable, lead: Lead) -> asyncio.Future[ExecutionResult | None] | None:
        """Executes the event as this subscriber's stream would, which
        starts its class's shared execution (`SHARED.result`); that result,
        or None when this sink cannot execute here."""
        if self._executor is None or self._event_for is None:
            return None
        lead.prime()
        event = self._event_for(*lead.yielded)
        answer = execute_subscription_event(self._executor.build_per_event_executor(event))
        # Its own copy of the result (`MultiplexingExecutionContext._answer`)
        # is not needed: its frame is the class's, encoded once, like its fellows'.
        if inspect.iscoroutine(answer):
            answer.close()
        return SHARED.peek(key)

    async def _send(
        self,
        encoded: Encoded,
        event_id: str | None,
        send: Callable[[str], Awaitable[None]],
        counted: Callable[[], None],
    ) -> None:
        """The class's frame with this operation's ids, unless it stopped
        meanwhile (nobody to send it to); counted either way."""
        found = self._target
        if found.socket.live(found.operation_id):
            await send(self._prefix + encoded.payload(event_id) + "}")
        counted()

    async def _encoded(self, key: Hashable, shared: asyncio.Future[ExecutionResult | None]) -> Encoded | None:
        """The class's result encoded, or None when each must run its own."""
        try:
            # Shielded: a fellow stopped while it waits leaves the result to the others.
            result = await asyncio.shield(shared)
        except Exception:
            return None  # the lead's execution failed
        if result is None or result.errors or result.data is None:
            return None  # errors name paths and may be one's own
        encoded = _encoded_for(key, result, self.plan)
        return encoded if encoded.usable else None

    def done(self) -> None:
        """After an event delivered the ordinary way: a lead that started no
        execution is let go, so its fellows do not wait for it."""
        if self._leading is not None:
            SHARED.release(self._leading)
            self._leading = None


def sink_for(info: Any, event_for: EventFor | None = None) -> FrameSink | None:
    """The frame sink of the subscription `info` resolves, or None when its
    events must take the ordinary path (not on a WebSocket, or a document
    `schema.multiplex` does not share). With `event_for`, how the field makes
    its event for an opening, the sink may lead its class in an opening's turn."""
    found = target.get()
    if found is None:
        return None
    raw = raw_info(info)
    plan = plan_for(raw.schema, raw.operation)
    if plan is None:
        return None
    # A dict of coerced values where the source stream is created; graphql-core's
    # `VariableValues` (the same values, `.coerced`) where an event executes.
    variables: Any = raw.variable_values
    metrics = info.context.services.metrics
    executor = subscribing.get()
    if executor is None or executor.operation is not raw.operation:
        executor = None  # not the executor of this operation: its events run the ordinary way
    return FrameSink(
        found,
        plan,
        getattr(variables, "coerced", variables),
        functools.partial(metrics.shared_frame, info.field_name),
        event_actual_cost(info),
        executed=functools.partial(metrics.executed, info.field_name),
        executor=executor,
        event_for=event_for,
    )
