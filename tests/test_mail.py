"""Email for relatives without the app, against a real SMTP server
(aiosmtpd, started here on a free port) whose received messages are parsed
back: capsule openings, digests, unsubscribe links, sealed content, and each
email exactly once across two real server processes, on both engines."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pytest
from aiosmtpd.controller import Controller

from resolvers.core import leases
from resolvers.core.auth import mint_token
from resolvers.core.config import ConfigError, Settings, SmtpTarget, parse_smtp_url
from resolvers.domain import mail
from resolvers.processes import scheduler
from resolvers.processes.mailer import Mailer, MailPass
from store import keys
from store.port import StoreError, WriteOp, op_key
from tests.api.conftest import Api, running_api
from tests.factories import family_with_members, settle, upload
from tests.servers import SECRET, ServerProcess, engine_env, free_port, until

SEALED_TITLE = "SELLADO-título-9f3"
SEALED_BODY = b"SELLADO-cuerpo-7c1"


class Inbox:
    """What the SMTP server received, parsed: (envelope recipients, message)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[tuple[list[str], EmailMessage]] = []
        # A slow server holds each sender a while, so that two processes' passes overlap.
        self.delay = 0.0
        self.controller: Controller | None = None
        self.port = 0

    def start(self, port: int | None = None) -> None:
        """Serves on `port` (again on the last one: SMTP back up)."""
        self.port = port or self.port
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        """SMTP down: connections are refused until `start`."""
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await asyncio.sleep(self.delay)
        parsed = BytesParser(policy=policy.default).parsebytes(envelope.original_content or envelope.content)
        assert isinstance(parsed, EmailMessage)
        with self.lock:
            self.received.append((list(envelope.rcpt_tos), parsed))
        return "250 OK"

    def to(self, address: str) -> list[EmailMessage]:
        with self.lock:
            return [message for rcpts, message in self.received if address in rcpts]

    def everything(self) -> list[EmailMessage]:
        with self.lock:
            return [message for _, message in self.received]


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, str]]:
    inbox = Inbox()
    port = free_port()
    inbox.start(port)
    try:
        yield inbox, f"smtp://127.0.0.1:{port}"
    finally:
        inbox.stop()


def text_of(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(message["Subject"]) + "\n" + body.get_content()


def unsubscribe_url(message: EmailMessage) -> str:
    header = str(message["List-Unsubscribe"])
    assert header.startswith("<") and header.endswith(">"), header
    assert str(message["List-Unsubscribe-Post"]) == "List-Unsubscribe=One-Click"
    return header[1:-1]


def assert_nothing_sealed(inbox: Inbox) -> None:
    for message in inbox.everything():
        raw = message.as_string()
        assert SEALED_TITLE not in raw and SEALED_BODY.decode() not in raw, raw


# The configuration ------------------------------------------------------------------


def test_smtp_urls() -> None:
    assert parse_smtp_url("smtp://mail.example.org") == SmtpTarget("mail.example.org", 25, "opportunistic")
    assert parse_smtp_url("smtps://ana%40x.org:p%3Ass@mail.example.org") == SmtpTarget(
        "mail.example.org", 465, "tls", "ana@x.org", "p:ss"
    )
    assert parse_smtp_url("smtp+starttls://h:2525").tls == "starttls"
    assert parse_smtp_url("smtp://h:587?starttls=true").tls == "starttls"
    assert parse_smtp_url("smtp://h?starttls=false").tls == "none"
    for bad in ("http://h", "smtp://", "smtps://h?starttls=true", "smtp://h?starttls=maybe"):
        with pytest.raises(ValueError):
            parse_smtp_url(bad)


def test_mail_settings_are_checked_at_start_up() -> None:
    assert Settings.from_env({}).smtp is None  # off when unset
    with pytest.raises(ConfigError, match="MIFAMILIAS_MAIL_FROM"):
        Settings.from_env({"MIFAMILIAS_SMTP_URL": "smtp://h"})
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"MIFAMILIAS_SMTP_URL": "smtps://u:hunter2@h:x", "MIFAMILIAS_MAIL_FROM": "a@b.org"})
    assert "hunter2" not in str(refused.value)  # the message reaches the logs


def test_a_tampered_or_expired_link_is_refused() -> None:
    signer = mail.LinkSigner("s" * 40, days=60)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    token = signer.sign("ben", "CAPSULES", now)
    assert signer.read(token, now + timedelta(days=59)) == ("ben", "CAPSULES")
    with pytest.raises(mail.ExpiredLink):
        signer.read(token, now + timedelta(days=61))
    with pytest.raises(mail.BadLink):
        signer.read(token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1], now)
    with pytest.raises(mail.BadLink):
        mail.LinkSigner("t" * 40, days=60).read(token, now)


# In process, on both engines, with the test's clock -----------------------------------


@pytest.fixture(params=["sqlite", "dynamodb"])
async def mail_api(
    request: pytest.FixtureRequest, tmp_path: Path, smtp: tuple[Inbox, str]
) -> AsyncIterator[tuple[Api, Inbox]]:
    inbox, url = smtp
    changes: dict[str, Any] = {
        "smtp_url": url,
        "mail_from": "MiFamilias <hola@mifamilias.test>",
        "mail_poll_seconds": 3600,
    }
    async with running_api(request.param, "local", tmp_path, request, **changes) as api:
        yield api, inbox


PREFER = "mutation($p: EmailPreference!) { updateProfile(input: {emailPreference: $p}) { emailPreference } }"


async def prefer(api: Api, user: str, preference: str) -> None:
    data = await api.ok(PREFER, {"p": preference}, as_=user)
    assert data["updateProfile"]["emailPreference"] == preference


def mailer(api: Api) -> Mailer:
    found = api.services.mailer
    assert found is not None
    return found


async def capsule(
    api: Api, creator: str, family_id: str, recipients: list[str], title: str, body: bytes
) -> str:
    """A LOCKED capsule due in a day, around READY text titled `title`."""
    made = await api.ok(
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {
            "i": {
                "familyId": family_id,
                "title": f"Cápsula de {creator}",
                "unlockDate": (api.clock.moment + timedelta(days=1)).isoformat(),
                "recipientIds": recipients,
            }
        },
        as_=creator,
    )
    capsule_id = str(made["createCapsule"]["id"])
    await api.ok(
        "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { id } }", {"id": capsule_id}, as_=creator
    )
    await upload(api, creator, family_id, "TEXT", body, "text/plain", title=title, capsule_id=capsule_id)
    await settle(api)
    return capsule_id


async def test_the_preference_is_the_users_own(mail_api: tuple[Api, Inbox]) -> None:
    api, _ = mail_api
    await family_with_members(api, "ana", ["ben"])
    me = "{ me { emailPreference } }"
    assert (await api.ok(me, as_="ben"))["me"]["emailPreference"] == "NONE"  # the default
    await prefer(api, "ben", "WEEKLY")
    assert (await api.ok(me, as_="ben"))["me"]["emailPreference"] == "WEEKLY"
    seen = await api.ok('{ user(id: "ben") { id email emailPreference } }', as_="ana")
    assert seen["user"] == {"id": "ben", "email": None, "emailPreference": None}
    code, _ = await api.error(
        "mutation { updateProfile(input: {emailPreference: SOMETIMES}) { id } }", as_="ben"
    )
    assert code == "BAD_USER_INPUT"


async def test_a_capsule_opening_is_mailed_once_to_each_recipient_who_chose_it(
    mail_api: tuple[Api, Inbox],
) -> None:
    api, inbox = mail_api
    family_id = await family_with_members(api, "ana", ["ben", "cy", "dora", "eli"])
    for person, choice in (("ana", "CAPSULES"), ("ben", "CAPSULES"), ("dora", "CAPSULES"), ("eli", "DAILY")):
        await prefer(api, person, choice)
    # cy keeps the default (NONE); dora chose it but is not a recipient; ana is the creator.
    capsule_id = await capsule(api, "ana", family_id, ["ben", "cy", "eli"], SEALED_TITLE, SEALED_BODY)
    await mailer(api).run_once()
    assert inbox.everything() == []  # sealed: nothing yet

    api.clock.advance(days=1, seconds=1)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    # Two mailers (two processes) that both read the outbox before either claims.
    other = Mailer(table=api.table, settings=api.services.settings, clock=api.clock)
    outbox = (await api.table.query(keys.MAIL_OUTBOX_PK, index="GSI2")).items
    assert len(outbox) == 4  # ana, ben, cy, eli were told
    openings = [(item["PK"], item["SK"]) for item in outbox]
    await asyncio.gather(*(m.openings.run(key) for key in openings for m in (mailer(api), other)))
    await asyncio.gather(mailer(api).run_once(), other.run_once())
    assert [len(inbox.to(f"{p}@example.org")) for p in ("ana", "ben", "cy", "dora", "eli")] == [0, 1, 0, 0, 0]
    (message,) = inbox.to("ben@example.org")
    assert message["From"] == "MiFamilias <hola@mifamilias.test>"
    assert "Cápsula de ana" in str(message["Subject"])
    assert "Los García" in text_of(message)
    assert message["Message-ID"] == mail.Letterhead(
        "MiFamilias <hola@mifamilias.test>", "", mail.LinkSigner("x", 1)
    ).message_id("capsule", capsule_id, "ben")
    assert urlsplit(unsubscribe_url(message)).path == mail.UNSUBSCRIBE_PATH
    # Settled: out of the outbox.
    assert (await api.table.query(keys.MAIL_OUTBOX_PK, index="GSI2")).items == []
    assert (await other.run_once()).sent == 0
    assert len(inbox.everything()) == 1


async def test_an_opening_claimed_before_its_capsule_opens_is_mailed_once_it_has(
    mail_api: tuple[Api, Inbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, inbox = mail_api
    family_id = await family_with_members(api, "ana", ["ben"])
    await prefer(api, "ben", "CAPSULES")
    capsule_id = await capsule(api, "ana", family_id, ["ben"], SEALED_TITLE, SEALED_BODY)
    api.clock.advance(days=1, seconds=1)
    # A capsule for a few people opens in one transaction, notes and all; one
    # too large for it writes its notes first, in steps: this one, as if it were.
    monkeypatch.setattr(scheduler, "may_open_at_once", lambda capsule: False)
    # The opening stops after its notes are written, before the capsule opens:
    # the mailer can claim a note in that window.
    table, transact = api.table, api.table.transact

    async def stops_before_opening(ops: Sequence[WriteOp]) -> None:
        if any(op_key(op) == keys.capsule(capsule_id) for op in ops):
            raise StoreError("the process is slow here")
        await transact(ops)

    table.transact = stops_before_opening  # type: ignore[method-assign]
    try:
        assert (await api.services.scheduler.run_once()).unlocked == 0
    finally:
        del table.transact
    done = await mailer(api).run_once()
    # ana, its creator, chose no email: skipped. ben's is handed back, its claim
    # not counted, and not due again at once.
    assert (done.sent, done.skipped, done.failed) == (0, 1, 0) and inbox.everything() == []
    (waiting,) = (await table.query(keys.MAIL_OUTBOX_PK, index="GSI2")).items
    assert waiting["userId"] == "ben"
    assert leases.attempts(waiting) == 0 and not leases.is_live(waiting, api.clock())
    assert (await mailer(api).openings.run_due()) == 0

    assert (await api.services.scheduler.run_once()).unlocked == 1
    api.clock.advance(seconds=mail.OPENING_WAIT.total_seconds())
    assert (await mailer(api).run_once()).sent == 1
    (message,) = inbox.to("ben@example.org")
    assert "Cápsula de ana" in str(message["Subject"])
    assert (await table.query(keys.MAIL_OUTBOX_PK, index="GSI2")).items == []


INVITE = """mutation($i: CreateInviteInput!) { createInvite(input: $i) { id code } }"""


async def test_an_invite_with_an_email_is_mailed_once_with_its_code_and_link(
    mail_api: tuple[Api, Inbox],
) -> None:
    api, inbox = mail_api
    family_id = await family_with_members(api, "ana", ["ben"])
    until = (api.clock.moment + timedelta(days=7)).isoformat()
    invite = (
        await api.ok(
            INVITE,
            {"i": {"familyId": family_id, "maxUses": 1, "expiresAt": until, "email": "tia@example.org"}},
            as_="ana",
        )
    )["createInvite"]
    # Written with the invite: the outbox holds it before any pass.
    assert len((await api.table.query(keys.INVITE_MAIL_OUTBOX_PK, index="GSI2")).items) == 1
    other = Mailer(table=api.table, settings=api.services.settings, clock=api.clock)
    await asyncio.gather(mailer(api).run_once(), other.run_once())
    (message,) = inbox.to("tia@example.org")
    text = text_of(message)
    assert invite["code"] in text and "Los García" in text and "Ana" in text
    link = next(word for word in text.split() if word.startswith("http"))
    assert urlsplit(link).path == mail.JOIN_PATH and invite["code"] in unquote(link)
    assert message["List-Unsubscribe"] is None  # nothing else goes to that address
    # Settled: never again, and out of the outbox.
    assert (await api.table.query(keys.INVITE_MAIL_OUTBOX_PK, index="GSI2")).items == []
    assert (await mailer(api).run_once()).sent == 0
    assert len(inbox.to("tia@example.org")) == 1
    # The invitation works: the code from the email gets its reader in.
    code = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Your invite code"))
    data = await api.ok(
        "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }", {"c": code}, as_="tia"
    )
    assert data["joinFamily"]["role"] == "MEMBER"

    # An invite revoked before the pass is not mailed.
    revoked = (await api.ok(INVITE, {"i": {"familyId": family_id, "email": "tio@example.org"}}, as_="ana"))[
        "createInvite"
    ]
    await api.ok("mutation($id: ID!) { revokeInvite(id: $id) }", {"id": revoked["id"]}, as_="ana")
    assert (await mailer(api).run_once()).skipped == 1
    assert inbox.to("tio@example.org") == []
    assert (await api.table.query(keys.INVITE_MAIL_OUTBOX_PK, index="GSI2")).items == []


async def test_an_invitation_carries_the_inviters_words_in_its_body_quoted_not_in_its_subject(
    mail_api: tuple[Api, Inbox],
) -> None:
    api, inbox = mail_api
    lure = "URGENT verify your bank account at bank-example.org " + "now " * 30
    await api.ok(
        "mutation($n: String!) { updateProfile(input: {givenName: $n}) { id } }", {"n": lure[:100]}, as_="ana"
    )
    family_id = await family_with_members(api, "ana", [])
    await api.ok(INVITE, {"i": {"familyId": family_id, "email": "tia@example.org"}}, as_="ana")
    await mailer(api).run_once()
    (message,) = inbox.to("tia@example.org")
    assert message["Subject"] == mail.INVITATION_SUBJECT
    text = text_of(message)
    # Quoted, and cut to a bound: the name shows as a name, not as the mail's message.
    assert "“URGENT verify your bank account" in text and "…”" in text
    assert max(len(line) for line in text.splitlines()) < 300


async def test_an_email_that_failed_while_smtp_was_down_goes_within_seconds_of_its_return(
    mail_api: tuple[Api, Inbox],
) -> None:
    api, inbox = mail_api
    family_id = await family_with_members(api, "ana", [])
    inbox.stop()
    await api.ok(INVITE, {"i": {"familyId": family_id, "email": "tia@example.org"}}, as_="ana")
    waits = []
    for _ in range(3):  # three passes while it is down: each backs off twice as long
        assert (await mailer(api).run_once()).failed == 1
        waits.append(mailer(api).next_pass_in(3600))
        (item,) = (await api.table.query(keys.INVITE_MAIL_OUTBOX_PK, index="GSI2")).items
        assert item.get(leases.UNTIL) is None  # handed back, not held until its lease runs out
        assert (await mailer(api).run_once()).failed == 0  # not due yet
        api.clock.advance(seconds=waits[-1])
    assert [round(wait) for wait in waits] == [1, 2, 4]
    inbox.start()
    assert (await mailer(api).run_once()).sent == 1
    assert len(inbox.to("tia@example.org")) == 1
    assert (await api.table.query(keys.INVITE_MAIL_OUTBOX_PK, index="GSI2")).items == []
    assert mailer(api).next_pass_in(3600) == 3600  # nothing waits: back to the poll


async def test_invites_that_mail_someone_are_limited_per_person_a_day(mail_api: tuple[Api, Inbox]) -> None:
    api, _ = mail_api
    family_id = await family_with_members(api, "ana", [])
    other_family = await family_with_members(api, "ana", [], name="Los Ruiz")
    for n in range(20):  # across the person's families: the limit is theirs
        given = {"familyId": family_id if n % 2 else other_family, "email": f"p{n}@example.org"}
        assert "errors" not in await api.post(INVITE, {"i": given}, as_="ana")
    before = await api.snapshot()
    code, message = await api.error(
        INVITE, {"i": {"familyId": family_id, "email": "p20@example.org"}}, as_="ana"
    )
    refused = await api.post(INVITE, {"i": {"familyId": family_id, "email": "p21@example.org"}}, as_="ana")
    error = refused["errors"][0]
    assert code == "RATE_LIMITED" and error["extensions"]["code"] == "RATE_LIMITED"
    assert 0 < error["extensions"]["retryAfter"] <= 24 * 3600 and "20 per day" in message
    assert await api.snapshot() == before  # refused: nothing written, nothing mailed
    assert len((await api.table.query(keys.INVITE_MAIL_OUTBOX_PK, index="GSI2")).items) == 20
    # An invite without an address mails nobody: not counted, not refused.
    assert "errors" not in await api.post(INVITE, {"i": {"familyId": family_id}}, as_="ana")
    api.clock.advance(seconds=error["extensions"]["retryAfter"])
    assert "errors" not in await api.post(
        INVITE, {"i": {"familyId": family_id, "email": "p22@example.org"}}, as_="ana"
    )


async def test_one_persons_many_emails_delay_another_familys_by_one_at_most(
    mail_api: tuple[Api, Inbox],
) -> None:
    """Emails go in fair order between those they are from: a family's capsule
    opening for eight, or a person's twenty invitations, come one at a time
    between another family's email, which goes first or second."""
    api, inbox = mail_api
    many = [f"m{n}" for n in range(8)]
    busy = await family_with_members(api, "ana", many)
    other = await family_with_members(api, "bea", ["cy"], name="Los Ruiz")
    for person in [*many, "cy"]:
        await prefer(api, person, "CAPSULES")
    # The busy family's capsule opens first: its emails are ahead in the outbox.
    for creator, family_id, recipients in (("ana", busy, many), ("bea", other, ["cy"])):
        await capsule(api, creator, family_id, recipients, SEALED_TITLE, SEALED_BODY)
        api.clock.advance(days=1, seconds=1)
        assert (await api.services.scheduler.run_once()).unlocked == 1
    await mailer(api).outbox(MailPass())
    order = [rcpts[0] for rcpts, _ in inbox.received]
    assert sorted(order) == sorted(f"{p}@example.org" for p in [*many, "cy"])
    assert order.index("cy@example.org") <= 1, order

    for n in range(20):
        await api.ok(INVITE, {"i": {"familyId": busy, "email": f"guest{n}@example.org"}}, as_="ana")
    api.clock.advance(seconds=1)
    await api.ok(INVITE, {"i": {"familyId": other, "email": "tia@example.org"}}, as_="bea")
    inbox.received.clear()
    await mailer(api).invitations(MailPass())
    order = [rcpts[0] for rcpts, _ in inbox.received]
    assert len(order) == 21 and order.index("tia@example.org") <= 1, order


async def test_digests_go_out_once_per_period_and_never_show_sealed_content(
    mail_api: tuple[Api, Inbox],
) -> None:
    api, inbox = mail_api
    # From a Tuesday: the two days walked through below end inside the week, so
    # cy's weekly digest waits for the week's end whatever day the suite runs on
    # (from a Saturday, they would reach Monday).
    api.clock.advance(days=(1 - api.clock.moment.weekday()) % 7)
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    await prefer(api, "ana", "DAILY")
    await prefer(api, "ben", "DAILY")
    await prefer(api, "cy", "WEEKLY")
    await capsule(api, "ana", family_id, ["ben"], SEALED_TITLE, SEALED_BODY)
    shared = await upload(api, "ana", family_id, "TEXT", b"hola a todos", "text/plain", title="La fiesta")
    await settle(api)
    await api.ok(
        "mutation($id: ID!) { addComment(contentId: $id, body: $b) { id } }".replace("$b", '"¡Qué bien!"'),
        {"id": shared},
        as_="ben",
    )
    await mailer(api).run_once()
    assert inbox.everything() == []  # the day is not over

    # Past midnight (UTC): the day's digest, once, however many mailers run.
    now = api.clock.moment
    api.clock.advance(
        seconds=(mail.period_end("DAILY", now) + timedelta(days=1, minutes=1) - now).total_seconds()
    )
    other = Mailer(table=api.table, settings=api.services.settings, clock=api.clock)
    until_ = mail.period_end("DAILY", api.clock.moment)
    # Two mailers on the same person and period at once: one digest.
    await asyncio.gather(*(m.digest("ben", "DAILY", until_, MailPass()) for m in (mailer(api), other)))
    await asyncio.gather(mailer(api).run_once(), other.run_once())
    await mailer(api).run_once()
    (ben_digest,) = inbox.to("ben@example.org")
    (ana_digest,) = inbox.to("ana@example.org")
    assert inbox.to("cy@example.org") == []  # her week is not over
    assert "La fiesta" in text_of(ben_digest) and "daily" in str(ben_digest["Subject"])
    assert "1 new comment on “La fiesta”" in text_of(ana_digest)
    unsubscribe_url(ben_digest)

    # The next day brings nothing new: no digest. The week's end brings cy hers.
    # The capsule opens that day: ben's next digest has it, sealed content nowhere.
    api.clock.advance(days=1)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    await mailer(api).run_once()
    assert len(inbox.everything()) == 2
    now = api.clock.moment
    api.clock.advance(
        seconds=(mail.period_end("WEEKLY", now) + timedelta(days=7, minutes=1) - now).total_seconds()
    )
    await asyncio.gather(mailer(api).run_once(), other.run_once())
    (cy_digest,) = inbox.to("cy@example.org")
    assert "La fiesta" in text_of(cy_digest) and "weekly" in str(cy_digest["Subject"])
    ben_digests = inbox.to("ben@example.org")
    assert len(ben_digests) == 2 and "Time capsules opened" in text_of(ben_digests[1])
    await mailer(api).run_once()
    # ana (its creator) hears of the opening in her digest too; nobody twice per period.
    assert [len(inbox.to(f"{p}@example.org")) for p in ("ana", "ben", "cy")] == [2, 2, 1]
    assert_nothing_sealed(inbox)


async def test_the_unsubscribe_link_turns_that_email_off_without_signing_in(
    mail_api: tuple[Api, Inbox],
) -> None:
    api, inbox = mail_api
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    await prefer(api, "ben", "CAPSULES")
    await prefer(api, "cy", "CAPSULES")
    await capsule(api, "ana", family_id, ["ben", "cy"], "Un recuerdo", b"hola")
    api.clock.advance(days=1, seconds=1)
    await api.services.scheduler.run_once()
    await mailer(api).run_once()
    ben_link, cy_link = (urlsplit(unsubscribe_url(inbox.to(f"{p}@example.org")[0])) for p in ("ben", "cy"))

    async def click(link: Any, query: str | None = None, method: str = "POST") -> httpx.Response:
        return await api.client.request(
            method,
            f"{link.path}?{query if query is not None else link.query}",
            content=b"List-Unsubscribe=One-Click",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )

    me = "{ me { emailPreference } }"
    # A tampered link, or none: a clear 400, nothing changed.
    tampered = ben_link.query[:-3] + ("xyz" if not ben_link.query.endswith("xyz") else "abc")
    for query in (tampered, "", "token=nonsense"):
        response = await click(ben_link, query)
        assert response.status_code == 400, response.text
    # A GET only asks (link checkers fetch links).
    assert (await click(ben_link, method="GET")).status_code == 200
    assert (await api.ok(me, as_="ben"))["me"]["emailPreference"] == "CAPSULES"

    assert (await click(ben_link)).status_code == 200
    assert (await api.ok(me, as_="ben"))["me"]["emailPreference"] == "NONE"
    assert (await click(ben_link)).status_code == 200  # again: already off

    # cy chose a weekly digest since: her old capsule link leaves that alone.
    await prefer(api, "cy", "WEEKLY")
    assert (await click(cy_link)).status_code == 200
    assert (await api.ok(me, as_="cy"))["me"]["emailPreference"] == "WEEKLY"

    # Expired: a clear 410.
    await prefer(api, "cy", "CAPSULES")
    api.clock.advance(days=api.services.settings.mail_link_days + 1)
    response = await click(cy_link)
    assert response.status_code == 410 and "expired" in response.text
    assert (await api.ok(me, as_="cy"))["me"]["emailPreference"] == "CAPSULES"


# Two real server processes sharing one store ----------------------------------------------


@pytest.fixture(params=["sqlite", "dynamodb"])
async def two_servers(
    request: pytest.FixtureRequest, tmp_path: Path, smtp: tuple[Inbox, str]
) -> AsyncIterator[tuple[list[ServerProcess], Inbox]]:
    inbox, url = smtp
    inbox.delay = 0.3
    env = {
        "MIFAMILIAS_AUTH_SECRET": SECRET,
        "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.3",
        "MIFAMILIAS_MAIL_POLL_SECONDS": "0.2",
        "MIFAMILIAS_SMTP_URL": url,
        "MIFAMILIAS_MAIL_FROM": "MiFamilias <hola@mifamilias.test>",
    }
    async with engine_env(request.param, request) as engine:
        # The same data directory: on SQLite, the same store file.
        processes = [ServerProcess(tmp_path / "data", env | engine, name=name) for name in ("a", "b")]
        try:
            for process in processes:
                process.start()
            yield processes, inbox
        finally:
            for process in processes:
                process.stop()


async def answer(
    server: ServerProcess, user: str, query: str, variables: dict[str, Any] | None = None
) -> dict[str, Any]:
    token = mint_token(SECRET, user, email=f"{user}@example.org", given_name=user.capitalize())
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            f"{server.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def gql(server: ServerProcess, user: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    body = await answer(server, user, query, variables)
    assert "errors" not in body, body
    return body["data"]


async def due_capsule(
    server: ServerProcess, family_id: str, recipients: list[str], title: str, seconds: float
) -> str:
    """A capsule with a note, due `seconds` from now. One whose date passes before
    it is sealed (a slow machine) stays closed for good and opens for no one: another
    is made, with twice the time."""
    while (capsule_id := await _sealed_capsule(server, family_id, recipients, title, seconds)) is None:
        seconds *= 2
    return capsule_id


async def _sealed_capsule(
    server: ServerProcess, family_id: str, recipients: list[str], title: str, seconds: float
) -> str | None:
    unlock = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
    made = await gql(
        server,
        "ana",
        "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }",
        {"i": {"familyId": family_id, "title": title, "unlockDate": unlock, "recipientIds": recipients}},
    )
    capsule_id = str(made["createCapsule"]["id"])
    if not await _before_the_date(server, "scheduleCapsule(capsuleId: $id)", capsule_id):
        return None
    created = await answer(
        server,
        "ana",
        "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
        {
            "i": {
                "familyId": family_id,
                "type": "TEXT",
                "mimeType": "text/plain",
                "sizeBytes": len(SEALED_BODY),
                "title": SEALED_TITLE,
                "capsuleId": capsule_id,
            }
        },
    )
    if _the_date_passed(created):
        return None
    async with httpx.AsyncClient() as client:
        put = await client.put(
            created["data"]["createUpload"]["uploadUrl"],
            content=SEALED_BODY,
            headers={"Content-Type": "text/plain"},
        )
    assert put.status_code == 200
    content_id = created["data"]["createUpload"]["content"]["id"]
    if not await _before_the_date(server, "completeUpload(contentId: $id)", content_id):
        return None
    return capsule_id


async def _before_the_date(server: ServerProcess, step: str, id_: str) -> bool:
    """Runs the step; False when the capsule's date had passed."""
    body = await answer(server, "ana", f"mutation($id: ID!) {{ {step} {{ id }} }}", {"id": id_})
    return not _the_date_passed(body)


def _the_date_passed(body: dict[str, Any]) -> bool:
    """Whether a step was refused because the capsule's date had passed; any
    other error fails the test."""
    if "errors" in body and "date has passed" in body["errors"][0]["message"]:
        return True
    assert "errors" not in body, body
    return False


async def test_two_server_processes_mail_each_recipient_exactly_once(
    two_servers: tuple[list[ServerProcess], Inbox],
) -> None:
    (a, b), inbox = two_servers
    people = ["ben", "cy", "dan", "eva"]
    made = await gql(
        a, "ana", 'mutation { createFamily(input: {name: "Los Ruiz", trustLevel: OPEN}) { id inviteCode } }'
    )
    family_id = made["createFamily"]["id"]
    for n, person in enumerate(people):
        server = (a, b)[n % 2]
        await gql(
            server,
            person,
            "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }",
            {"c": made["createFamily"]["inviteCode"]},
        )
        choice = "NONE" if person == "dan" else "CAPSULES"
        await gql(server, person, PREFER, {"p": choice})
    first = await due_capsule(a, family_id, people, "Primera cápsula", seconds=3)

    def opened(title: str, person: str) -> int:
        return sum(title in str(m["Subject"]) for m in inbox.to(f"{person}@example.org"))

    wanted = [p for p in people if p != "dan"]
    await until(lambda: all(opened("Primera", p) >= 1 for p in wanted), "the first capsule's emails")
    # A sentinel capsule, due once the first is mailed: a duplicate of the first
    # (both processes racing for it) would be in before the sentinel's emails.
    await due_capsule(b, family_id, people, "Centinela", seconds=1)
    await until(lambda: all(opened("Centinela", p) >= 1 for p in wanted), "the sentinel's emails")
    assert {p: opened("Primera", p) for p in people} == {"ben": 1, "cy": 1, "dan": 0, "eva": 1}
    assert {p: opened("Centinela", p) for p in people} == {"ben": 1, "cy": 1, "dan": 0, "eva": 1}
    assert_nothing_sealed(inbox)
    ids = [str(m["Message-ID"]) for m in inbox.everything()]
    assert len(ids) == len(set(ids)) == 6
    logs = a.log() + b.log()
    assert "Traceback" not in logs, logs
    assert first
