"""Account deletions that did not finish where they started: a request that
ran out of time, a process that died halfway. The steps themselves live in
`resolvers.domain.accounts`; this runs them again, in the background, on a
leased queue (`resolvers.processes.leased`).

The recovery pass reads the markers (GSI2 `ACCOUNT_DELETIONS`) every recovery
interval and takes over those whose lease has run out, so two processes never
work the same deletion at once by choice (and if they do, every step is
conditional).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from resolvers.core.context import Context
from resolvers.core.errors import Conflict
from resolvers.domain import accounts
from resolvers.processes.leased import Claim, LeasedJob, LeaseSpec, cancelling
from store import keys
from store.items import AccountDeletion
from store.port import Table

if TYPE_CHECKING:
    from resolvers.core.ports import ContextServices

log = logging.getLogger("mifamilias.accounts")


class AccountDeletions(LeasedJob):
    SPEC = LeaseSpec("account-deletions", recover_from=keys.ACCOUNT_DELETIONS_PK)

    def __init__(self, *, table: Table, clock: Callable[[], datetime], lease: timedelta) -> None:
        super().__init__(table=table, clock=clock, lease=lease)
        # The services a background run works with, given when the workers start.
        self._services: ContextServices | None = None

    def serve(self, services: ContextServices) -> None:
        self._services = services

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
        self._services = self._services or services
        self.jobs.submit(keys.account_deletion(user_id))

    async def sweep(self, services: ContextServices) -> int:
        """Takes over every deletion nobody holds, here and now; how many it took."""
        self._services = self._services or services
        return await self.jobs.run_due()

    async def idle(self) -> None:
        """Waits for the deletions this process finishes in the background."""
        await self.jobs.queue.join()

    async def process(self, claim: Claim) -> None:
        assert self._services is not None, "the account deletions run once the services are built"
        ctx = Context(services=self._services)
        user_id = AccountDeletion.from_item(claim.item).user_id
        try:
            await accounts.finish_pending(ctx, user_id, self.owner)
        except Exception:
            if cancelling():
                raise
            log.exception("account %s: the deletion stopped; the next sweep tries again", user_id)
            await accounts.release(ctx, user_id, self.owner)
