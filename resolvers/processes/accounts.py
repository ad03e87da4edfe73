"""Account deletions that did not finish where they started: a request that
ran out of time, a process that died halfway. The steps themselves live in
`resolvers.domain.accounts`; this runs them again, in the background.

The sweep reads the markers (GSI2 `ACCOUNT_DELETIONS`) every recovery interval
and takes over those whose lease has run out, so two processes never work the
same deletion at once by choice (and if they do, every step is conditional).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING

from resolvers.core.context import Context
from resolvers.core.errors import Conflict
from resolvers.domain import accounts
from store import keys
from store.items import AccountDeletion, iso

if TYPE_CHECKING:
    from resolvers.core.ports import ContextServices

log = logging.getLogger("mifamilias.accounts")


class AccountDeletions:
    def __init__(self) -> None:
        self.owner = uuid.uuid4().hex
        self._tasks: set[asyncio.Task[None]] = set()

    async def finish(self, ctx: Context, user_id: str) -> bool:
        """Finishes the person's deletion now, if one is under way (before
        their next request makes them a fresh profile). What does not fit in
        the request's share of time goes on in the background, and the request
        is told to come back (CONFLICT)."""
        try:
            async with asyncio.timeout(accounts.budget(ctx)):
                return await accounts.finish_pending(ctx, user_id, self.owner)
        except TimeoutError:
            await accounts.release(ctx, user_id, self.owner)
            self.resume(ctx.services, user_id)
            raise Conflict("your account is still being deleted; try again in a moment") from None

    def resume(self, services: ContextServices, user_id: str) -> None:
        """Finishes the deletion in the background, beside the requests."""
        task = asyncio.create_task(self._resume(services, user_id), name=f"account-deletion-{user_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume(self, services: ContextServices, user_id: str) -> None:
        ctx = Context(services=services)
        try:
            if await accounts.hold(ctx, user_id, self.owner, taking_over=True):
                await accounts.finish_pending(ctx, user_id, self.owner)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("account %s: the deletion stopped; the sweep tries again", user_id)
            await accounts.release(ctx, user_id, self.owner)

    async def sweep(self, services: ContextServices) -> int:
        """Takes over every deletion nobody holds; returns how many it finished."""
        ctx = Context(services=services)
        now = iso(services.now())
        finished = 0
        cursor: str | None = None
        while True:
            page = await services.table.query(
                keys.ACCOUNT_DELETIONS_PK, index="GSI2", limit=100, cursor=cursor
            )
            for item in page.items:
                marker = AccountDeletion.from_item(item)
                if marker.lease_until and marker.lease_until > now:
                    continue
                if not await accounts.hold(ctx, marker.user_id, self.owner, taking_over=True):
                    continue  # another process took it first
                try:
                    await accounts.finish_pending(ctx, marker.user_id, self.owner)
                    finished += 1
                except Exception:
                    log.exception(
                        "account %s: the deletion stopped; the next sweep tries again", marker.user_id
                    )
                    await accounts.release(ctx, marker.user_id, self.owner)
            if page.cursor is None:
                return finished
            cursor = page.cursor

    async def idle(self) -> None:
        """Waits for the deletions this process finishes in the background."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
