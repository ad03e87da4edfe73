"""Mutations that can be retried safely: an Idempotency-Key (the HTTP header,
or `extensions.idempotencyKey` on any transport) names a request of one person
for 24 hours.

- The first attempt claims the key (a conditional put) and runs; its answer is
  stored with the key, and every retry with the same operation and variables
  gets that answer, waiting while the first is still running.
- The same key with another request is BAD_USER_INPUT.
- An attempt that ended without an answer (stopped by the deadline, its
  process gone) is taken over by a retry once the deadline has passed for it:
  the takeover changes the key's `attempt`, and the mutation's first write
  that commits (`KeyedTable`: a transaction, or a single write made one)
  carries the key,
  conditional on its own attempt. So a late write of the first attempt cannot
  land after a takeover, and a retry finding the first attempt's write landed
  (COMMITTED, with no answer stored) says so instead of applying it again.
  Every mutation's first write is where it decides (the commit of those that
  commit in one write; the marker of an account deletion, which the
  background finishes; a join before its notifications).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from resolvers.core.errors import ApiError, BadInput, Conflict
from store.items import IdempotentRequest
from store.port import (
    MAX_TRANSACTION_ITEMS,
    Condition,
    ConditionFailed,
    Delete,
    Item,
    Key,
    NotExists,
    Put,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
    all_of,
    eq,
    op_key,
)

TTL_SECONDS = 24 * 3600
POLL_SECONDS = 0.1
MAX_KEY_LENGTH = 255
RUNNING, COMMITTED, DONE = "RUNNING", "COMMITTED", "DONE"
# When an attempt started, as the takeover compares it (a module attribute, so
# that tests move it rather than wait).
clock = time.time

Result = dict[str, Any]  # {"data": ..., "errors": [...]}, as answered


# The key the request in hand was sent with (set by the transport before the
# operation runs: a WebSocket operation's task copies it when it is created),
# and the attempt running it (read by the mutations that commit in one
# transaction, to put the key in it).
requested_key: contextvars.ContextVar[object] = contextvars.ContextVar("idempotency_key", default=None)
_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("idempotency_attempt", default=None)


def current() -> Attempt | None:
    return _attempt.get()


def request_hash(query: str | None, operation_name: str | None, variables: object) -> str:
    text = json.dumps([query or "", operation_name, variables], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise BadInput(
            "Idempotency-Key (or extensions.idempotencyKey) must be a non-empty string "
            f"of at most {MAX_KEY_LENGTH} characters"
        )
    return key


@dataclass
class Attempt:
    """This request's claim on its key."""

    record: IdempotentRequest
    # Whether a write of the mutation committed with the key already.
    carried: bool = field(default=False, compare=False)

    def pending(self) -> list[WriteOp]:
        """The key's part of the next write, until one has committed with it."""
        return [] if self.carried else self.commit_ops()

    def commit_ops(self) -> list[WriteOp]:
        """For the mutation's own transaction: the key is COMMITTED with the
        write, and neither lands if another attempt took the key over."""
        return [
            Update(
                self.record.key,
                set={"state": COMMITTED},
                condition=all_of(eq("attempt", self.record.attempt), eq("state", RUNNING)),
            )
        ]

    def lost(self, error: TransactionCancelled) -> bool:
        """Whether a cancelled transaction failed on this key: taken over."""
        return error.failed_on(self.record.key)


class Superseded(ApiError):
    """This attempt's key was taken over: its write did not land."""

    code = "UNAVAILABLE"


def _superseded(error: TransactionCancelled) -> Superseded:
    return Superseded("another attempt with the same Idempotency-Key took this one over")


class KeyedTable:
    """The table as a mutation sent with an Idempotency-Key writes to it: its
    first write that commits carries the key (`Attempt.pending`), so the write and the key's
    COMMITTED land together or not at all. A single conditional write becomes
    a transaction of two, its refusal still answered as ConditionFailed. Reads
    and batch writes (never a commit) go to the table as they are."""

    def __init__(self, table: Table, attempt: Attempt) -> None:
        self._table = table
        self._attempt = attempt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    async def transact(self, ops: Sequence[WriteOp]) -> None:
        extra = self._attempt.pending() if len(ops) < MAX_TRANSACTION_ITEMS else []
        try:
            await self._table.transact([*ops, *extra])
        except TransactionCancelled as error:
            if extra and self._attempt.lost(error):
                raise _superseded(error) from error
            raise  # nothing landed: the next write (a retry of this one) carries the key
        self._attempt.carried = self._attempt.carried or bool(extra)

    async def _single(self, op: WriteOp) -> None:
        try:
            await self._table.transact([op, *self._attempt.pending()])
        except TransactionCancelled as error:
            if self._attempt.lost(error):
                raise _superseded(error) from error
            raise ConditionFailed(op_key(op)) from error
        self._attempt.carried = True

    async def put(self, item: Item, condition: Condition | None = None) -> None:
        if self._attempt.carried:
            return await self._table.put(item, condition)
        await self._single(Put(item, condition))

    async def update(self, update: Update) -> Item:
        if self._attempt.carried:
            return await self._table.update(update)
        # The answer of an update is the item after it: read back, as a
        # transaction does not return it.
        await self._single(update)
        return await self._table.get(update.key) or {}

    async def delete(self, key: Key, condition: Condition | None = None) -> Item | None:
        if self._attempt.carried:
            return await self._table.delete(key, condition)
        # The answer of a delete is the item before it: read first, likewise.
        before = await self._table.get(key)
        await self._single(Delete(key, condition))
        return before


@contextlib.contextmanager
def aside() -> Iterator[None]:
    """Writes that are not the mutation's own (a first request's profile, a
    deletion it finishes first) carry no key, whatever request they ride on."""
    token = _attempt.set(None)
    try:
        yield
    finally:
        _attempt.reset(token)


def keyed(table: Table) -> Table:
    """`table`, or while a mutation with an Idempotency-Key runs, its KeyedTable."""
    attempt = _attempt.get()
    return table if attempt is None else KeyedTable(table, attempt)


def _applied_without_answer() -> Conflict:
    return Conflict(
        "this request was applied by an earlier attempt with the same Idempotency-Key, whose answer "
        "was lost; read the current state instead of sending it again",
        outcome="APPLIED",
    )


async def run_once(
    table: Table,
    user_id: str,
    key: str,
    request: str,
    *,
    deadline_seconds: float,
    run: Callable[[Attempt], Awaitable[Result]],
) -> Result:
    """The request's answer: the stored one, or `run`'s (stored for retries)."""
    now = clock()
    record = IdempotentRequest(
        user_id=user_id,
        idempotency_key=key,
        request=request,
        attempt=uuid.uuid4().hex,
        state=RUNNING,
        started_at=now,
        expires_at=int(now + TTL_SECONDS),
    )
    while True:
        try:
            await table.put(record.to_item(), NotExists())
            break  # claimed
        except ConditionFailed:
            pass
        found = await table.get(record.key)
        if found is None:
            continue  # expired meanwhile: claim again
        existing = IdempotentRequest.from_item(found)
        if existing.request != request:
            raise BadInput(
                "this Idempotency-Key was used for another request; use a new key for a new request"
            )
        if existing.state == DONE and existing.result is not None:
            stored: Result = json.loads(existing.result)
            return stored
        over = clock() > existing.started_at + deadline_seconds + 1
        if not over:
            await asyncio.sleep(POLL_SECONDS)  # the first attempt is still running
            continue
        if existing.state == COMMITTED:
            raise _applied_without_answer()
        # Ended without an answer and without its write: take it over.
        record = replace(existing, attempt=uuid.uuid4().hex, started_at=clock())
        try:
            await table.update(
                Update(
                    record.key,
                    set={"attempt": record.attempt, "startedAt": record.started_at},
                    condition=all_of(eq("attempt", existing.attempt), eq("state", RUNNING)),
                )
            )
            break
        except ConditionFailed:
            continue  # someone else moved it: look again
    attempt = Attempt(record)
    token = _attempt.set(attempt)
    try:
        result = await run(attempt)
    finally:
        _attempt.reset(token)
    if _retryable(result):
        return result  # nothing known to keep: a retry runs it again (or finds it COMMITTED)
    done = Update(
        record.key,
        set={"state": DONE, "result": json.dumps(result, default=str)},
        condition=eq("attempt", record.attempt),
    )
    with contextlib.suppress(ConditionFailed):  # taken over meanwhile: that attempt answers
        await table.update(done)
    return result


def _retryable(result: Result) -> bool:
    """An answer that says "try again" is not kept as the request's answer."""
    return any(
        (error.get("extensions") or {}).get("code")
        in ("UNAVAILABLE", "INTERNAL_SERVER_ERROR", "RATE_LIMITED")
        for error in result.get("errors") or ()
    )
