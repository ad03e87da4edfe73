"""Multiplexed subscription events: an event executes each distinct payload once.

One capsule opening wakes every recipient's `capsuleUnlocked`, and one status
change every `contentStatusChanged` of that content; executing the same
selection on the same record a thousand times is most of a fan-out's cost. So,
the way Hasura multiplexes live queries, subscribers that share

- the operation document and its variables,
- the event (the record and what happened to it), and
- what the viewer's rights on that record depend on (their role in the family,
  whether they created it, receive it or wrote its content: `share`, set by
  `resolvers.processes.live`),

share one execution: the first to get there runs it, with its own context and
the read guard, and the others take its result.

Sharing is safe only where the answer cannot depend on who asks beyond that
class. So a document is shared only when every field it selects is in
`SHAREABLE`, a list of fields that read the record alone; a field that is not
listed (a new one, or a viewer's own such as `viewerReactions`) makes the
document run per subscriber, as before. The one per-viewer field allowed is
`CapsuleUnlockedEvent.id`, written into each subscriber's copy.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from graphql import (
    ExecutionResult,
    FieldNode,
    GraphQLObjectType,
    GraphQLSchema,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    get_named_type,
    print_ast,
)

from schema.guard import GuardedExecutionContext

# "Type.field": fields whose value depends on the record (and, through the read
# guard, on the viewer's class of rights) alone.
SHAREABLE = frozenset(
    {
        "Subscription.capsuleUnlocked",
        "Subscription.contentStatusChanged",
        "CapsuleUnlockedEvent.id",  # per viewer: written into each copy
        "CapsuleUnlockedEvent.capsule",
        "CapsuleUnlockedEvent.unlockedAt",
        "Capsule.id",
        "Capsule.title",
        "Capsule.unlockDate",
        "Capsule.status",
        "Capsule.notificationSent",
        "Capsule.content",
        "Content.id",
        "Content.type",
        "Content.status",
        "Content.title",
        "Content.mediaUrl",
        "Content.thumbnailUrl",
        "Content.transcription",
        "Content.failureReason",
        "Content.createdAt",
        "Content.capturedAt",
        "Content.reactions",
        "Content.commentCount",
        "ReactionCount.emoji",
        "ReactionCount.count",
    }
)
PER_VIEWER = "CapsuleUnlockedEvent.id"


@dataclass(frozen=True)
class Plan:
    """How one document's events are shared: the root field's response key and
    the response keys of the per-viewer event id under it."""

    text: str  # the operation, printed: the same for every parse of the same document
    root: str
    event_ids: tuple[str, ...]


_plans: dict[int, tuple[OperationDefinitionNode, Plan | None]] = {}


def plan_for(schema: GraphQLSchema, operation: OperationDefinitionNode) -> Plan | None:
    """The document's plan, or None when it must run per subscriber."""
    found = _plans.get(id(operation))
    if found is not None and found[0] is operation:
        return found[1]
    plan = _plan(schema, operation)
    if len(_plans) > 1000:
        _plans.clear()
    _plans[id(operation)] = (operation, plan)  # the node kept alive: its id stays its own
    return plan


def _plan(schema: GraphQLSchema, operation: OperationDefinitionNode) -> Plan | None:
    root_type = schema.subscription_type
    if operation.operation != OperationType.SUBSCRIPTION or root_type is None:
        return None
    selections = operation.selection_set.selections
    if len(selections) != 1 or not isinstance(selections[0], FieldNode):
        return None
    root = selections[0]
    if not _only_shareable(schema, root_type, operation.selection_set):
        return None
    event_ids: tuple[str, ...] = ()
    if root.name.value == "capsuleUnlocked" and root.selection_set is not None:
        event_ids = tuple(
            (node.alias or node.name).value
            for node in root.selection_set.selections
            if isinstance(node, FieldNode) and node.name.value == "id"
        )
    return Plan(text=print_ast(operation), root=(root.alias or root.name).value, event_ids=event_ids)


def _only_shareable(
    schema: GraphQLSchema, parent: GraphQLObjectType, selection_set: SelectionSetNode
) -> bool:
    for node in selection_set.selections:
        # Fragments and directives are allowed nowhere: a plain selection is
        # what the check can read whole.
        if not isinstance(node, FieldNode) or node.directives:
            return False
        name = node.name.value
        if name == "__typename":
            continue
        if f"{parent.name}.{name}" not in SHAREABLE or name not in parent.fields:
            return False
        inner = get_named_type(parent.fields[name].type)
        if node.selection_set is not None:
            if not isinstance(inner, GraphQLObjectType):
                return False
            if not _only_shareable(schema, inner, node.selection_set):
                return False
    return True


_Entry = tuple[float, "asyncio.Future[ExecutionResult | None]", bool]


class SharedResults:
    """Results being (or just) executed, by what makes them the same. An entry
    lives for the event's delivery: a few seconds.

    A subscriber whose frames are encoded once per class (`schema.frames`)
    may *lead* a class before its execution starts: its fellows then wait for
    the result it will run, instead of each finding nothing yet and running
    the same execution. A lead that runs nothing (its stream ended first) is
    let go, and its fellows execute as they would have."""

    TTL_SECONDS = 5.0

    def __init__(self) -> None:
        # key -> (expires at, the result, whether an execution was started for it)
        self._results: dict[Hashable, _Entry] = {}
        self.executions = 0  # how many events were executed here (tests read it)

    def _found(self, key: Hashable, now: float) -> _Entry | None:
        """The entry for `key`: a result not yet expired, or a lead of any age
        (its fellows wait for it until it executes or lets go)."""
        if len(self._results) > 1000:
            kept: dict[Hashable, _Entry] = {}
            for k, entry in self._results.items():
                if entry[0] > now or not entry[2]:
                    kept[k] = entry
            self._results = kept
        found = self._results.get(key)
        if found is None or (found[2] and found[0] <= now):
            return None
        return found

    def result(
        self, key: Hashable, run: Callable[[], Awaitable[ExecutionResult] | ExecutionResult]
    ) -> asyncio.Future[ExecutionResult | None]:
        """The shared result for `key`, running `run` only if nobody has."""
        now = time.monotonic()
        found = self._found(key, now)
        if found is not None and found[2]:
            return found[1]
        self.executions += 1
        outcome = run()
        future: asyncio.Future[ExecutionResult | None]
        if found is not None:  # led: the fellows wait on this future
            future = found[1]
            if isinstance(outcome, ExecutionResult):
                if not future.done():
                    future.set_result(outcome)
            else:
                task = asyncio.ensure_future(outcome)
                _running.add(task)  # held until done: the loop keeps only a weak reference
                task.add_done_callback(_running.discard)
                task.add_done_callback(functools.partial(_settle, future))
        elif isinstance(outcome, ExecutionResult):
            future = asyncio.get_running_loop().create_future()
            future.set_result(outcome)
        else:
            future = asyncio.ensure_future(outcome)
        self._results[key] = (now + self.TTL_SECONDS, future, True)
        return future

    def lead(self, key: Hashable) -> asyncio.Future[ExecutionResult | None] | None:
        """None when the caller leads `key`'s class (it must execute, or
        `release`); otherwise the result to wait for, which is None when the
        lead let go."""
        now = time.monotonic()
        found = self._found(key, now)
        if found is not None:
            return found[1]
        future: asyncio.Future[ExecutionResult | None] = asyncio.get_running_loop().create_future()
        self._results[key] = (now + self.TTL_SECONDS, future, False)
        return None

    def peek(self, key: Hashable) -> asyncio.Future[ExecutionResult | None] | None:
        """The result `key`'s class has or waits for, if it is led; None
        otherwise (and, unlike `lead`, nobody is made its lead)."""
        found = self._found(key, time.monotonic())
        return None if found is None else found[1]

    def release(self, key: Hashable) -> None:
        """Lets go of a lead that started no execution: its fellows are told
        (None) and the next event of the class starts afresh."""
        found = self._results.get(key)
        if found is not None and not found[2]:
            del self._results[key]
            if not found[1].done():
                found[1].set_result(None)


_running: set[asyncio.Future[ExecutionResult]] = set()


def _settle(future: asyncio.Future[ExecutionResult | None], done: asyncio.Future[ExecutionResult]) -> None:
    if future.done():
        return
    if done.cancelled():
        future.set_result(None)  # its fellows execute their own
    elif done.exception() is not None:
        future.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        future.set_result(done.result())


SHARED = SharedResults()


def variables_key(values: dict[str, Any]) -> str:
    """An operation's coerced variables, as a part of `class_key`."""
    return json.dumps(values, sort_keys=True, default=str)


def class_key(plan: Plan, variables: str, share: Hashable) -> Hashable:
    """What makes subscribers' answers to an event the same: the document,
    its variables (`variables_key`) and what their rights depend on."""
    return (plan.text, variables, share)


def _copy_for(result: ExecutionResult, plan: Plan, event_id: str | None) -> ExecutionResult:
    data = result.data
    if not plan.event_ids or data is None or event_id is None:
        return ExecutionResult(data=data, errors=result.errors)
    event = dict(data[plan.root])
    for key in plan.event_ids:
        event[key] = event_id
    return ExecutionResult(data={**data, plan.root: event}, errors=result.errors)


# The executor of the subscription whose source stream is being created, in
# the task that creates it: the subscription field's resolver runs there and
# keeps it (`schema.frames.sink_for`), so that an event its stream would
# execute can be executed, exactly so, where the event is decided.
subscribing: ContextVar[MultiplexingExecutionContext | None] = ContextVar("subscribing", default=None)


class MultiplexingExecutionContext(GuardedExecutionContext):
    """The guarded execution context, which shares a subscription event's
    execution between the subscribers `SHARED` finds alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per-event executors are copies (`build_per_event_executor`), never built.
        if self.operation.operation == OperationType.SUBSCRIPTION:
            subscribing.set(self)

    def execute_operation(self, serially: bool | None = None) -> Any:
        share = getattr(self.root_value, "share", None)
        if share is None or self.operation.operation != OperationType.SUBSCRIPTION:
            return super().execute_operation(serially)
        plan = plan_for(self.schema, self.operation)
        if plan is None:
            return super().execute_operation(serially)
        key = class_key(plan, variables_key(self.variable_values.coerced), share)
        shared = SHARED.result(key, lambda: self._execute(serially))
        return self._answer(shared, plan, getattr(self.root_value, "id", None))

    def _execute(self, serially: bool | None) -> Awaitable[ExecutionResult] | ExecutionResult:
        # A subscription's event is one ExecutionResult (no incremental delivery).
        return cast("Awaitable[ExecutionResult] | ExecutionResult", super().execute_operation(serially))

    async def _answer(
        self, shared: asyncio.Future[ExecutionResult | None], plan: Plan, event_id: str | None
    ) -> ExecutionResult:
        result = await asyncio.shield(shared)
        if result is None or result.errors:
            # Errors name a path and may come from one subscriber's own state:
            # this subscriber runs its own.
            own = self._execute(False)
            return (await own) if isinstance(own, Awaitable) else own
        return _copy_for(result, plan, str(event_id) if event_id is not None else None)
