"""The mailer: it runs in every server process when
MIFAMILIAS_SMTP_URL is set; conditional writes make each email go out once
however many run.

One pass:
1. The outbox (GSI2 `MAIL_OUTBOX`): each capsule opening's notification is
   claimed under a lease (`resolvers.processes.leased`), then sent or skipped,
   then marked and taken out of the outbox (a write conditioned on the lease).
   A note claimed while its capsule is still opening is handed back for a few
   seconds instead: it is written just before the capsule opens.
2. Invitations (GSI2 `INVITE_MAIL_OUTBOX`): each invite made with an email,
   leased, sent (or skipped) and settled the same way.
3. Each digest kind (DAILY, WEEKLY): the people due (GSI2 `EMAIL_DIGEST#<kind>`,
   sorted by the end of their last period) each get a marker for the period,
   put with a condition; only its writer sends, then marks it and moves the
   person on in the index.

A process that dies between the SMTP server's acceptance and its mark leaves a
lease that runs out; the next process sends again, with the same Message-ID
(docs/decisions.md says what that does and does not prevent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from email.utils import parseaddr
from typing import Protocol

from resolvers.adapters.smtp import SmtpSender, Undeliverable
from resolvers.core.config import Settings
from resolvers.domain import mail
from resolvers.processes.leased import Claim, LeasedQueue, LeaseSpec
from store import keys
from store.enums import DIGESTS, MailState
from store.items import FamilyInvite, Notification, User
from store.port import Table

log = logging.getLogger("mifamilias.mailer")

# Emails go in fair order between those they are from (`leased.fair_order`): a
# capsule's family for its openings' emails, an invite's maker for invitations.
OUTBOX = LeaseSpec(
    "mail",
    recover_from=keys.MAIL_OUTBOX_PK,
    claimable=mail.UNSENT,
    count_attempts=True,
    due=mail.not_waiting,
    group=lambda item: Notification.from_item(item).family_id,
    # The previous format's mailer counted its claims under its own name, and
    # takes a note only while it has no `mailState` (or its own lease on it ran
    # out): a claim marks the note SENDING, so during a rolling upgrade such a
    # process keeps off a note this one holds.
    previous_attempts=mail.PREVIOUS_ATTEMPTS,
    on_claim={"mailState": MailState.SENDING},
)
INVITATIONS = LeaseSpec(
    "invitation",
    recover_from=keys.INVITE_MAIL_OUTBOX_PK,
    claimable=mail.UNSENT,
    count_attempts=True,
    due=mail.not_waiting,
    group=lambda item: FamilyInvite.from_item(item).created_by,
)

# Longer than one send can take (SMTP_TIMEOUT 30 s, plus the reads around it),
# so a lease runs out only when its process has stopped.
LEASE = timedelta(seconds=120)


class Sender(Protocol):
    """What the mailer needs of an SMTP client (SmtpSender)."""

    async def send(self, message: EmailMessage) -> None: ...


@dataclass
class MailPass:
    sent: int = 0
    skipped: int = 0
    failed: int = 0


class Mailer:
    def __init__(
        self,
        *,
        table: Table,
        settings: Settings,
        clock: Callable[[], datetime],
        sender: Sender | None = None,
    ) -> None:
        target = settings.smtp
        if target is None or settings.mail_from is None:
            raise ValueError("the mailer needs MIFAMILIAS_SMTP_URL and MIFAMILIAS_MAIL_FROM")
        self.table = table
        self.clock = clock
        # Capsule openings' emails: each notification in the outbox, leased.
        self.openings = LeasedQueue(OUTBOX, table=table, clock=clock, lease=LEASE, handle=self.opening)
        self.owner = self.openings.owner
        # Invitations: each invite made with an email, leased by the same owner.
        self.invites = LeasedQueue(
            INVITATIONS, table=table, clock=clock, lease=LEASE, handle=self.invitation, owner=self.owner
        )
        self._done = MailPass()
        self._next_retry: datetime | None = None
        self.sender: Sender = sender or SmtpSender(target, parseaddr(settings.mail_from)[1])
        self.head = mail.Letterhead(
            sender=settings.mail_from,
            base_url=settings.base_url,
            signer=mail.LinkSigner(settings.resolved_auth_secret(), settings.mail_link_days),
        )

    async def run_once(self) -> MailPass:
        done = MailPass()
        self._next_retry = None
        await self.outbox(done)
        await self.invitations(done)
        for kind in DIGESTS:
            await self.digests(kind, done)
        if done.sent or done.failed:
            log.info("mail pass: %d sent, %d skipped, %d failed", done.sent, done.skipped, done.failed)
        return done

    # Capsule openings ------------------------------------------------------------------

    async def outbox(self, done: MailPass) -> None:
        self._done = done
        await self.openings.run_due()

    async def opening(self, claim: Claim) -> None:
        """One capsule opening's email, from its claimed outbox item."""
        done = self._done
        key, claimed = claim.key, claim.item
        note = Notification.from_item(claimed)
        if claim.attempts > mail.MAX_ATTEMPTS:
            await mail.settle_outbox(self.table, key, self.owner, MailState.FAILED, self.clock())
            done.failed += 1
            log.error("mail: gave up on the capsule email to %s", note.user_id)
            return
        try:
            found = await mail.capsule_mail(self.table, self.head, note, self.clock())
        except Exception:
            log.exception("mail: could not prepare the capsule email to %s; retried later", note.user_id)
            done.failed += 1
            return  # the lease runs out and a later pass tries again
        if found.wait:
            await mail.hand_back_until(self.table, key, self.owner, self.clock() + mail.OPENING_WAIT)
            return
        if found.message is None:
            await mail.settle_outbox(self.table, key, self.owner, MailState.SKIPPED, self.clock())
            done.skipped += 1
            return
        state = await self._send(found.message, f"capsule {note.capsule_id} to {note.user_id}", done)
        await self._settle(claim, state, done)

    # Invitations ------------------------------------------------------------------------

    async def invitations(self, done: MailPass) -> None:
        self._done = done
        await self.invites.run_due()

    async def invitation(self, claim: Claim) -> None:
        """One invitation, from its claimed invite: the invite as it stands now
        decides whether it still goes (revoked, expired or used up: skipped)."""
        done = self._done
        key = claim.key
        invite = FamilyInvite.from_item(claim.item)
        if claim.attempts > mail.MAX_ATTEMPTS:
            await mail.settle_outbox(self.table, key, self.owner, MailState.FAILED, self.clock())
            done.failed += 1
            log.error("mail: gave up on the invitation of invite %s", invite.id)
            return
        try:
            found = await mail.invitation_mail(self.table, self.head, invite, self.clock())
        except Exception:
            log.exception("mail: could not prepare the invitation of invite %s; retried later", invite.id)
            done.failed += 1
            return
        if found.message is None:
            await mail.settle_outbox(self.table, key, self.owner, MailState.SKIPPED, self.clock())
            done.skipped += 1
            return
        state = await self._send(found.message, f"invitation of invite {invite.id}", done)
        await self._settle(claim, state, done)

    async def _settle(self, claim: Claim, state: str | None, done: MailPass) -> None:
        """Marks a sent or failed email; one that failed for now is handed back
        for a retry within seconds, and the next pass is brought forward to it."""
        now = self.clock()
        if state is None and mail.out_of_retries(claim.item):
            log.error("mail: gave up on %s after %d sends that failed", claim.key[0], mail.MAX_SEND_RETRIES)
            state = MailState.FAILED
        if state is not None:
            await mail.settle_outbox(self.table, claim.key, self.owner, state, now)
            return
        until = await mail.retry_later(self.table, claim.key, self.owner, claim.item, now)
        if until is not None and (self._next_retry is None or until < self._next_retry):
            self._next_retry = until

    def next_pass_in(self, poll_seconds: float) -> float:
        """Seconds until the next pass: the poll, or sooner when an email that
        failed for now is due again (never under half a second)."""
        if self._next_retry is None:
            return poll_seconds
        return max(0.5, min(poll_seconds, (self._next_retry - self.clock()).total_seconds()))

    async def _send(self, message: EmailMessage, what: str, done: MailPass) -> str | None:
        """SENT or FAILED (for good); None when a later pass should try again."""
        try:
            await self.sender.send(message)
        except Undeliverable as error:
            log.warning("mail: %s refused for good: %s", what, error)
            done.failed += 1
            return MailState.FAILED
        except Exception as error:
            log.warning("mail: %s not sent (%s); retried in seconds", what, error)
            done.failed += 1
            return None
        done.sent += 1
        return MailState.SENT

    # Digests ---------------------------------------------------------------------------

    async def digests(self, kind: str, done: MailPass) -> None:
        now = self.clock()
        until = mail.period_end(kind, now)
        for user in await mail.due_for_digest(self.table, kind, until):
            try:
                await self.digest(user.id, kind, until, done)
            except Exception:
                done.failed += 1
                log.exception("mail: the %s digest of %s failed; retried later", kind, user.id)

    async def digest(self, user_id: str, kind: str, until: datetime, done: MailPass) -> None:
        """One person's digest for the period ending at `until`."""
        # The index is eventually consistent: the profile is read again, strongly.
        item = await self.table.get(keys.user(user_id))
        if item is None:
            return
        user = User.from_item(item)
        if user.email_preference != kind:
            return
        marker = await mail.claim_digest(self.table, user, kind, until, self.owner, self.clock(), LEASE)
        if marker is None:
            return
        if marker.attempts > mail.MAX_ATTEMPTS:
            await mail.settle_digest(self.table, marker, MailState.FAILED, user, self.clock())
            done.failed += 1
            return
        lines = await mail.digest_lines(self.table, user, marker.since, marker.period_end)
        if lines.empty() or not user.email:
            # No news is no email; the period counts as digested all the same.
            await mail.settle_digest(self.table, marker, MailState.SKIPPED, user, self.clock())
            done.skipped += 1
            return
        message = mail.digest_message(self.head, user, marker, lines, self.clock())
        state = await self._send(message, f"{kind} digest to {user.id}", done)
        if state is not None:
            await mail.settle_digest(self.table, marker, state, user, self.clock())
