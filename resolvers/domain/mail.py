"""Email for relatives without the app: what a person chose, what
each email says, the unsubscribe links, and the conditional writes that make
each email go out once.

Two kinds of email:
- a capsule opening, to each recipient who chose CAPSULES. Its outbox item is
  the CAPSULE_UNLOCKED notification the unlock writes anyway (it carries GSI2
  `MAIL_OUTBOX` keys until the mail is settled); the mailer claims it with a
  lease, sends it and marks it SENT (or SKIPPED) in conditional writes.
- a digest per period (DAILY or WEEKLY, UTC), from the person's own
  notifications of the period; a marker per person and period, put with a
  condition before sending, makes it go out once.

Every message has a Message-ID derived from what it is about, so a retry after
a crash between the server's acceptance and our mark carries the same id.
Nothing sealed reaches an email: every item is read again at sending time, and
content counts only while it is in the family feed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, parseaddr
from typing import Any
from urllib.parse import urlencode

from itsdangerous import BadSignature, URLSafeSerializer

from resolvers.core import leases
from resolvers.domain.access import READERS
from store import keys
from store.enums import DIGESTS, CapsuleStatus, ContentStatus, EmailPreference, MailState, NotificationType
from store.items import (
    Capsule,
    Content,
    DigestMarker,
    Family,
    FamilyInvite,
    Notification,
    User,
    digest_index,
    iso,
)
from store.port import (
    Condition,
    ConditionFailed,
    Item,
    Key,
    NotExists,
    SortKey,
    Table,
    Update,
    all_items,
    all_of,
    any_of,
    eq,
)

# A capsule opening older than this when the mailer first sees it is not
# mailed: mail turned on (or back on) later must not flood anyone with old news.
STALE_AFTER = timedelta(days=3)
MAX_ATTEMPTS = 5
# An opening's notes are written just before its capsule opens, so the mailer can
# claim one while the capsule is still UNLOCKING: its email is handed back for
# this long, its claim not counted, instead of being skipped for good.
OPENING_WAIT = timedelta(seconds=5)
RETRY_AT = "mailRetryAt"
# Sends that failed for now (SMTP down, a 4xx): each waits twice the last, from
# a second up to a minute, and after this many (about an hour) the email fails.
SEND_RETRIES = "mailSendRetries"
MAX_SEND_RETRIES = 64
MAX_RETRY_WAIT = timedelta(seconds=60)
# A digest reaches back at most this far, whatever was missed before.
MAX_LOOKBACK = timedelta(days=31)
# Digest markers are kept this long after their period (then the table's TTL).
MARKER_DAYS = 60
UNSUBSCRIBE_PATH = "/mail/unsubscribe"
OPENED = (CapsuleStatus.AVAILABLE, CapsuleStatus.VIEWED, CapsuleStatus.ARCHIVED)
# Content a digest may name: in the feed and past the pipeline. Sealed content
# is out of the feed until its capsule opens, so it never qualifies.
SHOWN = (ContentStatus.READY, ContentStatus.DELIVERED, ContentStatus.ARCHIVED)


# Preferences --------------------------------------------------------------------------


def period_end(kind: str, now: datetime) -> datetime:
    """The start of the period `now` is in (UTC midnight; Monday for WEEKLY),
    which is the end of the period its digest covers."""
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == EmailPreference.WEEKLY:
        return midnight - timedelta(days=midnight.weekday())
    return midnight


def period_length(kind: str) -> timedelta:
    return timedelta(days=7 if kind == EmailPreference.WEEKLY else 1)


def preference_changes(user: User, preference: str, now: datetime) -> tuple[dict[str, Any], list[str]]:
    """The profile update for a new choice (SET, REMOVE). A digest starts with
    the period under way, so the first one covers activity since its start."""
    if preference == user.email_preference:
        return {}, []  # the same choice again does not move the digest's period
    changes: dict[str, Any] = {"emailPreference": preference}
    if preference in DIGESTS:
        start = iso(period_end(preference, now))
        changes["digestUntil"] = start
        changes.update(digest_index(user.id, preference, start))
        return changes, []
    return changes, ["GSI2PK", "GSI2SK"]


# Unsubscribe links ----------------------------------------------------------------------


class BadLink(Exception):
    """The link was not made by us, or was changed."""


class ExpiredLink(Exception):
    """The link was ours, and its time is over."""


class LinkSigner:
    """Signed, expiring links that switch one choice off, without signing in."""

    def __init__(self, secret: str, days: int) -> None:
        self.serializer = URLSafeSerializer(secret, salt="mifamilias-unsubscribe")
        self.lifetime = timedelta(days=days)

    def sign(self, user_id: str, preference: str, now: datetime) -> str:
        expires = int((now + self.lifetime).timestamp())
        return self.serializer.dumps({"u": user_id, "p": preference, "e": expires})

    def read(self, token: str, now: datetime) -> tuple[str, str]:
        try:
            payload = self.serializer.loads(token)
        except BadSignature:
            raise BadLink("this link is not valid") from None
        if not isinstance(payload, dict) or not {"u", "p", "e"} <= payload.keys():
            raise BadLink("this link is not valid")
        if payload["p"] not in (EmailPreference.CAPSULES, *DIGESTS):
            raise BadLink("this link is not valid")
        if int(payload["e"]) < now.timestamp():
            raise ExpiredLink("this link has expired; change your emails in the app")
        return str(payload["u"]), str(payload["p"])


async def unsubscribe(table: Table, signer: LinkSigner, token: str, now: datetime) -> bool:
    """Turns off the choice the email was sent under (to NONE), and nothing else:
    True when it changed something, False when it was already changed."""
    user_id, preference = signer.read(token, now)
    if not keys.usable_id(user_id):
        raise BadLink("this link is not valid")
    try:
        await table.update(
            Update(
                keys.user(user_id),
                set={"emailPreference": EmailPreference.NONE},
                remove=["GSI2PK", "GSI2SK"],
                # A choice made since the email was sent is the person's newer word.
                condition=eq("emailPreference", preference),
            )
        )
    except ConditionFailed:
        return False
    return True


# Messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Letterhead:
    """What every message needs from the configuration."""

    sender: str  # MIFAMILIAS_MAIL_FROM, display name and all
    base_url: str
    signer: LinkSigner

    @property
    def domain(self) -> str:
        return parseaddr(self.sender)[1].rpartition("@")[2] or "mifamilias.invalid"

    def message_id(self, *parts: str) -> str:
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
        return f"<{digest}@{self.domain}>"

    def unsubscribe_url(self, user_id: str, preference: str, now: datetime) -> str:
        token = self.signer.sign(user_id, preference, now)
        return f"{self.base_url}{UNSUBSCRIBE_PATH}?{urlencode({'token': token})}"


def _one_line(text: str, limit: int = 120) -> str:
    # Titles are validated already; this keeps any header single-line regardless.
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _name(user: User) -> str:
    return _one_line(" ".join(p for p in (user.given_name, user.family_name) if p) or "someone")


def compose(
    head: Letterhead,
    to: User,
    preference: str,
    message_id: str,
    subject: str,
    body: str,
    now: datetime,
) -> EmailMessage:
    assert to.email is not None
    unsubscribe = head.unsubscribe_url(to.id, preference, now)
    message = EmailMessage()
    message["From"] = head.sender
    message["To"] = Address(display_name=_name(to) if to.given_name else "", addr_spec=to.email)
    message["Subject"] = _one_line(subject, 200)
    message["Date"] = format_datetime(now.astimezone(UTC))
    message["Message-ID"] = message_id
    # RFC 8058: a POST to this URL, with no sign-in, switches this email off.
    message["List-Unsubscribe"] = f"<{unsubscribe}>"
    message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message["Auto-Submitted"] = "auto-generated"  # RFC 3834: no auto-replies, please
    footer = (
        f"\n\n--\nYou get this email because you chose it in MiFamilias ({head.base_url}).\n"
        f"To stop these emails: {unsubscribe}\n"
    )
    message.set_content(body + footer)
    return message


def capsule_message(
    head: Letterhead, to: User, capsule: Capsule, family: Family | None, creator: User | None, now: datetime
) -> EmailMessage:
    where = f" in {_one_line(family.name)}" if family else ""
    who = _name(creator) if creator else "someone in your family"
    body = (
        f"A time capsule{where} has opened for you: “{_one_line(capsule.title)}”, from {who}.\n\n"
        f"Open MiFamilias to see what is inside: {head.base_url}"
    )
    return compose(
        head,
        to,
        EmailPreference.CAPSULES,
        head.message_id("capsule", capsule.id, to.id),
        f"A time capsule has opened for you: {capsule.title}",
        body,
        now,
    )


JOIN_PATH = "/join"


INVITATION_SUBJECT = "You are invited to a family on MiFamilias"


def invitation_message(
    head: Letterhead, invite: FamilyInvite, family: Family, inviter: User | None, now: datetime
) -> EmailMessage:
    """To someone who may have no account yet: no unsubscribe link, since
    nothing else is ever sent to the address because of the invite."""
    assert invite.email is not None
    # The inviter's own words (their name, the family's) go in the body, quoted
    # and bounded, never in the subject: a subject is what a stranger's mail
    # client shows first, and it must not read as the inviter's message.
    who = f"“{_one_line(_name(inviter), 60)}”" if inviter else "An admin"
    link = f"{head.base_url}{JOIN_PATH}?{urlencode({'code': invite.code})}"
    limits = []
    if invite.ends_at is not None:
        limits.append(f"It works until {invite.ends_at[:16].replace('T', ' ')} UTC.")
    if invite.max_uses == 1:
        limits.append("It admits one person: you.")
    body = (
        f"{who}, an admin of the family “{_one_line(family.name, 60)}”, invites you to join it on "
        "MiFamilias, a private space for the family. Those names are theirs, as they wrote them.\n\n"
        f"Your invite code: {invite.code}\n"
        f"Join here: {link}\n"
        + ("\n" + " ".join(limits) + "\n" if limits else "")
        + "\nIf you did not expect this, ignore this email: nothing happens unless you join.\n"
    )
    message = EmailMessage()
    message["From"] = head.sender
    message["To"] = invite.email
    message["Subject"] = INVITATION_SUBJECT
    message["Date"] = format_datetime(now.astimezone(UTC))
    message["Message-ID"] = head.message_id("invite", invite.family_id, invite.id)
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(body)
    return message


@dataclass(frozen=True)
class InvitationMail:
    message: EmailMessage | None
    reason: str = ""


async def invitation_mail(
    table: Table, head: Letterhead, invite: FamilyInvite, now: datetime
) -> InvitationMail:
    """The invitation as it stands at sending time: none for an invite that
    admits nobody any more (revoked, expired, used up) or a family gone."""
    reason = invite.refusal(iso(now))
    if reason is not None:
        return InvitationMail(None, reason)
    found = await table.batch_get([keys.family(invite.family_id), keys.user(invite.created_by)])
    family = found.get(keys.family(invite.family_id))
    if family is None:
        return InvitationMail(None, "the family is gone")
    inviter = found.get(keys.user(invite.created_by))
    return InvitationMail(
        invitation_message(
            head, invite, Family.from_item(family), User.from_item(inviter) if inviter else None, now
        )
    )


# The capsule openings' outbox -----------------------------------------------------------


# An email is still to send while its item has no settled state (SENDING: a
# capsule opening's note once claimed; null: an invite, whose record holds the
# attribute from the start).
UNSENT = any_of(NotExists("mailState"), eq("mailState", None), eq("mailState", MailState.SENDING))
# How many times the previous format's mailer claimed a note (`store.formats`).
PREVIOUS_ATTEMPTS = "mailAttempts"


async def settle_outbox(table: Table, key: Key, owner: str, state: str, now: datetime) -> bool:
    """Marks a claimed email SENT, SKIPPED or FAILED and takes it out of the
    outbox; False when the lease was lost meanwhile."""
    try:
        await table.update(
            Update(
                key,
                set={"mailState": state, "mailSettledAt": iso(now), **leases.CLEARED},
                remove=["GSI2PK", "GSI2SK", RETRY_AT],
                condition=leases.held_by(owner),
            )
        )
    except ConditionFailed:
        return False
    return True


async def hand_back_until(table: Table, key: Key, owner: str, until: datetime) -> bool:
    """Hands a claimed email back, not due before `until`; the claim is not
    counted as an attempt (nothing was tried). False when the lease was lost."""
    try:
        await table.update(
            Update(
                key,
                set={RETRY_AT: iso(until), **leases.CLEARED},
                add={leases.ATTEMPTS: -1},
                condition=leases.held_by(owner),
            )
        )
    except ConditionFailed:
        return False
    return True


async def retry_later(table: Table, key: Key, owner: str, item: Item, now: datetime) -> datetime | None:
    """Hands back an email whose send failed for now (SMTP down or busy), due
    again after a backoff that doubles from a second to a minute: the next pass
    tries it within seconds of SMTP coming back, not once a lease has run out.
    Such a failure is not an attempt that counts towards giving up (those are
    for work that kills its process); `MAX_SEND_RETRIES` bounds these instead.
    When it is due again; None when the lease was lost."""
    retries = int(item.get(SEND_RETRIES) or 0)
    until = now + min(timedelta(seconds=2**retries), MAX_RETRY_WAIT)
    try:
        await table.update(
            Update(
                key,
                set={RETRY_AT: iso(until), **leases.CLEARED},
                add={leases.ATTEMPTS: -1, SEND_RETRIES: 1},
                condition=leases.held_by(owner),
            )
        )
    except ConditionFailed:
        return None
    return until


def out_of_retries(item: Item) -> bool:
    """Whether a failing email has been tried for long enough (about an hour)."""
    return int(item.get(SEND_RETRIES) or 0) >= MAX_SEND_RETRIES


def not_waiting(item: Item, now: datetime) -> bool:
    """An email of the outbox is due unless it was handed back until later."""
    return str(item.get(RETRY_AT) or "") <= iso(now)


@dataclass(frozen=True)
class CapsuleMail:
    """What one capsule opening's email needs, read in one batch; `message`
    is None when there is nothing to send (and why, for the log)."""

    message: EmailMessage | None
    reason: str = ""
    # Nothing to send yet: the capsule is still opening.
    wait: bool = False


async def capsule_mail(table: Table, head: Letterhead, note: Notification, now: datetime) -> CapsuleMail:
    if parse_time(note.created_at) < now - STALE_AFTER:
        return CapsuleMail(None, "older than the outbox keeps")
    if not note.capsule_id or not note.family_id:
        return CapsuleMail(None, "no capsule")
    wanted = [
        keys.user(note.user_id),
        keys.capsule(note.capsule_id),
        keys.member(note.family_id, note.user_id),
    ]
    found = await table.batch_get(wanted)
    user_item, capsule_item, member = (found.get(key) for key in wanted)
    if user_item is None or capsule_item is None:
        return CapsuleMail(None, "gone")
    user, capsule = User.from_item(user_item), Capsule.from_item(capsule_item)
    if user.email_preference != EmailPreference.CAPSULES:
        return CapsuleMail(None, f"chose {user.email_preference}")
    if not user.email:
        return CapsuleMail(None, "no address")
    # Its recipients are mailed (its creator knows what is inside), while they
    # may read the family and once the capsule is open.
    if user.id not in capsule.recipient_ids:
        return CapsuleMail(None, "not a recipient")
    if capsule.status == CapsuleStatus.UNLOCKING:
        return CapsuleMail(None, "still opening", wait=True)
    if member is None or member.get("role") not in READERS or capsule.status not in OPENED:
        return CapsuleMail(None, "not readable")
    more = await table.batch_get([keys.family(capsule.family_id), keys.user(capsule.creator_id)])
    family = more.get(keys.family(capsule.family_id))
    creator = more.get(keys.user(capsule.creator_id))
    return CapsuleMail(
        capsule_message(
            head,
            user,
            capsule,
            Family.from_item(family) if family else None,
            User.from_item(creator) if creator else None,
            now,
        )
    )


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# Digests -----------------------------------------------------------------------------------


async def due_for_digest(table: Table, kind: str, until: datetime) -> list[User]:
    """People who chose `kind` and have not had the period ending at `until`."""
    found = await all_items(table, keys.digest_pk(kind), SortKey("<", iso(until)), index="GSI2")
    return [User.from_item(item) for item in found]


async def claim_digest(
    table: Table, user: User, kind: str, until: datetime, owner: str, now: datetime, lease: timedelta
) -> DigestMarker | None:
    """Puts the person's marker for the period (or takes over one whose lease ran
    out); None when the period's digest is settled or being sent elsewhere."""
    last = parse_time(user.digest_until) if user.digest_until else until - period_length(kind)
    since = max(last, until - MAX_LOOKBACK)
    key = keys.digest_marker(user.id, iso(until))
    existing = await table.get(key)
    attempts = int(existing.get("attempts", 0)) + 1 if existing else 1
    marker = DigestMarker(
        user_id=user.id,
        period_end=iso(until),
        kind=kind,
        since=existing["since"] if existing else iso(since),
        state=MailState.SENDING,
        expires_at=int((until + timedelta(days=MARKER_DAYS)).timestamp()),
        lease_until=iso(now + lease),
        lease_owner=owner,
        attempts=attempts,
    )
    if existing is None:
        condition: Condition = NotExists()
    elif existing.get("state") == MailState.SENDING and not leases.is_live(existing, now):
        # Taken over as it was read: another process taking it meanwhile wins.
        condition = all_of(
            leases.held_by(existing.get(leases.OWNER)), eq("attempts", existing.get("attempts"))
        )
    else:
        if existing.get("state") != MailState.SENDING:
            await advance_digest(table, user, kind, until)  # settled: only the index lagged
        return None
    try:
        await table.put(marker.to_item(), condition)
    except ConditionFailed:
        return None
    return marker


async def settle_digest(table: Table, marker: DigestMarker, state: str, user: User, now: datetime) -> None:
    try:
        await table.update(
            Update(
                marker.key,
                set={"state": state, "settledAt": iso(now)},
                remove=[leases.UNTIL],
                condition=leases.held_by(marker.lease_owner),
            )
        )
    except ConditionFailed:
        return  # another process took over after our lease ran out; it settles
    await advance_digest(table, user, marker.kind, parse_time(marker.period_end))


async def advance_digest(table: Table, user: User, kind: str, until: datetime) -> None:
    """Moves the person past the period in the digests' index."""
    changes: dict[str, Any] = {"digestUntil": iso(until)}
    changes.update(digest_index(user.id, kind, iso(until)))
    try:
        # Only while the choice is still this digest: a newer choice owns the index keys.
        await table.update(Update(user.key, set=changes, condition=eq("emailPreference", kind)))
    except ConditionFailed:
        return


@dataclass
class DigestLines:
    contents: list[str]
    comments: list[str]
    capsules: list[str]

    def empty(self) -> bool:
        return not (self.contents or self.comments or self.capsules)


DIGESTED = (NotificationType.NEW_CONTENT, NotificationType.NEW_COMMENT, NotificationType.CAPSULE_UNLOCKED)


def _describe(content: Content) -> str:
    kind = {"PHOTO": "a photo", "VIDEO": "a video", "AUDIO": "a recording", "TEXT": "a note"}
    return f"“{_one_line(content.title)}”" if content.title else kind.get(content.type, "something new")


async def digest_lines(table: Table, user: User, since: str, until: str) -> DigestLines:
    """The person's notifications of the period, each checked again now: they
    may still read the family, the content is in the feed (never sealed), the
    capsule is open."""
    period = SortKey.between(keys.NOTIFICATION_PREFIX + since, keys.NOTIFICATION_PREFIX + until)
    notes = [Notification.from_item(item) for item in await all_items(table, keys.user_pk(user.id), period)]
    notes = [note for note in notes if note.type in DIGESTED and note.family_id and note.created_at < until]
    wanted: set[Key] = set()
    for note in notes:
        assert note.family_id is not None
        wanted |= {keys.member(note.family_id, user.id), keys.family(note.family_id)}
        if note.content_id:
            wanted.add(keys.content(note.content_id))
        if note.capsule_id:
            wanted.add(keys.capsule(note.capsule_id))
    found = await table.batch_get(sorted(wanted)) if wanted else {}
    lines = DigestLines([], [], [])
    comments: dict[str, int] = {}
    for note in sorted(notes, key=lambda n: n.created_at):
        assert note.family_id is not None
        member = found.get(keys.member(note.family_id, user.id))
        family_item = found.get(keys.family(note.family_id))
        if member is None or member.get("role") not in READERS or family_item is None:
            continue
        family = _one_line(Family.from_item(family_item).name)
        content_item = found.get(keys.content(note.content_id)) if note.content_id else None
        content = Content.from_item(content_item) if content_item else None
        if note.type == NotificationType.CAPSULE_UNLOCKED:
            capsule_item = found.get(keys.capsule(note.capsule_id)) if note.capsule_id else None
            if capsule_item is None:
                continue
            capsule = Capsule.from_item(capsule_item)
            if capsule.status in OPENED and user.id in (*capsule.recipient_ids, capsule.creator_id):
                lines.capsules.append(f"“{_one_line(capsule.title)}” opened in {family}")
            continue
        if content is None or not content.in_feed or content.status not in SHOWN:
            continue  # gone, still sealed, or not viewable: not in an email
        if note.type == NotificationType.NEW_CONTENT:
            lines.contents.append(f"{_describe(content)} in {family}")
        elif note.type == NotificationType.NEW_COMMENT:
            label = f"{_describe(content)} in {family}"
            comments[label] = comments.get(label, 0) + 1
    lines.comments = [f"{n} new comment{'s' if n > 1 else ''} on {label}" for label, n in comments.items()]
    return lines


def digest_message(
    head: Letterhead, to: User, marker: DigestMarker, lines: DigestLines, now: datetime
) -> EmailMessage:
    kind = "day" if marker.kind == EmailPreference.DAILY else "week"
    sections: list[str] = [f"What happened in your families this {kind}:"]
    for title, entries in (
        ("New", lines.contents),
        ("Comments on what you shared", lines.comments),
        ("Time capsules opened", lines.capsules),
    ):
        if entries:
            sections.append(f"{title}:\n" + "\n".join(f"  - {entry}" for entry in entries))
    sections.append(f"See it all in MiFamilias: {head.base_url}")
    ending = marker.period_end[:10]
    return compose(
        head,
        to,
        marker.kind,
        head.message_id("digest", to.id, marker.period_end),
        f"Your MiFamilias {'daily' if kind == 'day' else 'weekly'} digest ({ending})",
        "\n\n".join(sections),
        now,
    )
