"""Sending one email over SMTP (aiosmtplib), a connection per message.

A connection per message keeps a failure confined to its message and needs no
keep-alive against servers that drop idle connections; a family app sends a few
mails per person per day at most."""

from __future__ import annotations

from email.message import EmailMessage

import aiosmtplib

from resolvers.core.config import SmtpTarget

SEND_TIMEOUT_SECONDS = 30.0


class Undeliverable(Exception):
    """The server refused the message for good (a 5xx): retrying will not help."""


class SmtpSender:
    def __init__(self, target: SmtpTarget, sender: str) -> None:
        self.target = target
        self.sender = sender

    async def send(self, message: EmailMessage) -> None:
        """Returns once the server accepted the message. Raises Undeliverable on a
        permanent refusal, anything else on a failure worth retrying."""
        target = self.target
        try:
            await aiosmtplib.send(
                message,
                sender=self.sender,
                hostname=target.host,
                port=target.port,
                username=target.username,
                password=target.password,
                use_tls=target.tls == "tls",
                # None: STARTTLS when offered; True: required; False: never.
                start_tls={"starttls": True, "opportunistic": None}.get(target.tls, False),
                timeout=SEND_TIMEOUT_SECONDS,
            )
        except aiosmtplib.SMTPRecipientsRefused as error:
            raise Undeliverable(str(error)) from error
        except aiosmtplib.SMTPResponseException as error:
            if 500 <= error.code < 600:
                raise Undeliverable(f"{error.code} {error.message}") from error
            raise
