"""Every key string of the table is built here, and nowhere else."""

from __future__ import annotations

import hashlib

from store.port import Key


def user(user_id: str) -> Key:
    return (f"USER#{user_id}", "PROFILE")


def user_pk(user_id: str) -> str:
    return f"USER#{user_id}"


def user_family(user_id: str, family_id: str) -> Key:
    return (f"USER#{user_id}", f"FAMILY#{family_id}")


USER_FAMILY_PREFIX = "FAMILY#"


SEPARATOR = "#"


def usable_id(value: str) -> bool:
    """Whether an id from outside can be part of a key: the separator would
    let it reach into another item's key space."""
    return SEPARATOR not in value


def invite_guesses(user_id: str) -> Key:
    return (f"USER#{user_id}", "INVITE_GUESSES")


def rate(subject: str, action: str) -> Key:
    """One counter per subject (a person, a client address) and action."""
    return (f"RATE#{subject}", action)


def stream_slots_pk(subject: str) -> str:
    return f"STREAMS#{subject}"


def stream_slot(subject: str, slot: int) -> Key:
    """One of a person's places for a live subscription, held as a lease."""
    return (stream_slots_pk(subject), f"SLOT#{slot:03d}")


def family(family_id: str) -> Key:
    return (f"FAMILY#{family_id}", "META")


def family_pk(family_id: str) -> str:
    return f"FAMILY#{family_id}"


def member(family_id: str, user_id: str) -> Key:
    return (f"FAMILY#{family_id}", f"MEMBER#{user_id}")


MEMBER_PREFIX = "MEMBER#"


def member_sk(user_id: str) -> str:
    return f"MEMBER#{user_id}"


def vouch(family_id: str, user_id: str, voucher_id: str) -> Key:
    return (f"FAMILY#{family_id}", f"VOUCH#{user_id}#{voucher_id}")


def vouch_prefix(user_id: str) -> str:
    return f"VOUCH#{user_id}#"


def invite(code: str) -> Key:
    """What a code admits to: the family's own code, or one of its invites."""
    return (f"INVITE#{code}", "META")


def family_invite(family_id: str, invite_id: str) -> Key:
    """An invite an ADMIN made (limits and counts), in its family's partition."""
    return (f"FAMILY#{family_id}", f"INVITE#{invite_id}")


FAMILY_INVITE_PREFIX = "INVITE#"

INVITE_MAIL_OUTBOX_PK = "INVITE_MAIL_OUTBOX"


def invite_mail_outbox_gsi2(created_at: str, family_id: str, invite_id: str) -> tuple[str, str]:
    """An invite still to be emailed: the invite itself carries these keys
    until the mailer settles it, so the email is written with the invite."""
    return (INVITE_MAIL_OUTBOX_PK, f"{created_at}#{family_id}#{invite_id}")


def family_event(family_id: str, created_at: str, event_id: str) -> Key:
    """One entry of the admins' record, by time."""
    return (f"FAMILY#{family_id}", f"EVENT#{created_at}#{event_id}")


FAMILY_EVENT_PREFIX = "EVENT#"


def admin_attribute(user_id: str) -> str:
    """The family item's attribute that says `user_id` is an ADMIN, and since when
    (top-level, so that one update of the family item moves it with the count)."""
    return f"A#{user_id}"


ADMIN_ATTRIBUTE_PREFIX = "A#"


def departing_attribute(user_id: str) -> str:
    """The family item's attribute that says `user_id` is deleting their
    account: their content, comments and tags there are nobody's to read from
    the moment the deletion begins (on the family item, which the read rule
    loads beside the viewer's membership, so it costs no read of its own)."""
    return f"{DEPARTING_ATTRIBUTE_PREFIX}{user_id}"


DEPARTING_ATTRIBUTE_PREFIX = "D#"


# Content ----------------------------------------------------------------------


def content(content_id: str) -> Key:
    return (f"CONTENT#{content_id}", "META")


def content_pk(content_id: str) -> str:
    return f"CONTENT#{content_id}"


def feed_gsi1(family_id: str, created_at: str, content_id: str) -> tuple[str, str]:
    return (f"FAMILY#{family_id}", f"CONTENT#{created_at}#{content_id}")


FEED_PREFIX = "CONTENT#"


def comment(content_id: str, created_at: str, comment_id: str) -> Key:
    return (f"CONTENT#{content_id}", f"COMMENT#{created_at}#{comment_id}")


COMMENT_PREFIX = "COMMENT#"


def reaction(content_id: str, emoji: str, user_id: str) -> Key:
    return (f"CONTENT#{content_id}", f"REACTION#{emoji}#{user_id}")


REACTION_PREFIX = "REACTION#"


def reactor(content_id: str, user_id: str) -> Key:
    """One item per (content, user) listing that user's emojis, so a feed page
    answers `viewerReactions` with point reads instead of a query per content."""
    return (f"CONTENT#{content_id}", f"REACTOR#{user_id}")


PIPELINE_PK = "PIPELINE"


def pipeline_gsi2(since: str, content_id: str) -> tuple[str, str]:
    """Content mid-pipeline, so a restarted server finds what it left."""
    return (PIPELINE_PK, f"{since}#{content_id}")


ABANDONED_UPLOADS_PK = "ABANDONED_UPLOADS"


def abandoned_upload_gsi2(since: str, content_id: str) -> tuple[str, str]:
    """Content whose capsule was cancelled while its upload was under way, by
    when, for the sweep that removes it once the upload can no longer finish."""
    return (ABANDONED_UPLOADS_PK, f"{since}#{content_id}")


ARCHIVE_SHARDS = 8


def archive_pk(shard: int) -> str:
    return f"ARCHIVE#{shard}"


def archive_gsi2(ready_at: str, content_id: str) -> tuple[str, str]:
    """READY or DELIVERED content, by when it became READY, for the archive sweep."""
    return (archive_pk(unlock_shard_of(content_id, ARCHIVE_SHARDS)), f"{ready_at}#{content_id}")


def content_word(content_id: str, word: str) -> Key:
    """One word of a content's title or transcription, in the content's own partition
    (deleting the content deletes it with the other children)."""
    return (f"CONTENT#{content_id}", f"{CONTENT_WORD_PREFIX}{word}")


CONTENT_WORD_PREFIX = "WORD#"


def content_word_gsi1(family_id: str, word: str, content_id: str) -> tuple[str, str]:
    return (content_search_pk(family_id), f"{word}#{content_id}")


def content_search_pk(family_id: str) -> str:
    """The family's words, in word order: searchContent's prefix index."""
    return f"WORDS#{family_id}"


def content_tags(content_id: str) -> Key:
    """A summary of every tag on one content, kept by setTags in its transaction."""
    return (f"CONTENT#{content_id}", "TAGS")


# Capsules ---------------------------------------------------------------------


def capsule(capsule_id: str) -> Key:
    return (f"CAPSULE#{capsule_id}", "META")


def capsule_pk(capsule_id: str) -> str:
    return f"CAPSULE#{capsule_id}"


def capsule_gsi1(creator_id: str, created_at: str, capsule_id: str) -> tuple[str, str]:
    return (f"USER#{creator_id}", f"CAPSULE#{created_at}#{capsule_id}")


CAPSULE_PREFIX = "CAPSULE#"


def unlock_day_shard(day: str, shard: int) -> str:
    return f"UNLOCK#{day}#{shard}"


def unlock_shard_of(capsule_id: str, shards: int) -> int:
    # A stable hash (not Python's salted hash) so every process agrees.
    return int.from_bytes(hashlib.sha1(capsule_id.encode()).digest()[:4], "big") % shards


def capsule_gsi2(unlock_date: str, capsule_id: str, shards: int) -> tuple[str, str]:
    day = unlock_date[:10]
    return (unlock_day_shard(day, unlock_shard_of(capsule_id, shards)), f"{unlock_date}#{capsule_id}")


def recipient(capsule_id: str, user_id: str) -> Key:
    return (f"CAPSULE#{capsule_id}", f"RECIPIENT#{user_id}")


RECIPIENT_PREFIX = "RECIPIENT#"


def recipient_gsi1(user_id: str, unlock_date: str, capsule_id: str) -> tuple[str, str]:
    return (f"USER#{user_id}", f"RECEIVED#{unlock_date}#{capsule_id}")


RECEIVED_PREFIX = "RECEIVED#"


def retention_pk(shard: int) -> str:
    return f"CAPSULE_RETENTION#{shard}"


def retention_gsi2(viewed_at: str, capsule_id: str) -> tuple[str, str]:
    """VIEWED capsules, by first view, for the retention sweep (-> ARCHIVED)."""
    return (retention_pk(unlock_shard_of(capsule_id, ARCHIVE_SHARDS)), f"{viewed_at}#{capsule_id}")


SCHEDULER_PK = "SCHEDULER"


def unlock_checkpoint() -> Key:
    return (SCHEDULER_PK, "UNLOCK_CHECKPOINT")


UNLOCK_SHARD_LEASE_PREFIX = "UNLOCK_SHARD#"


def unlock_shard_lease(shard: int) -> Key:
    """Which process reads unlock shard `shard` (and its outbox): a lease, in
    the scheduler's partition beside its checkpoint, so one query lists them all."""
    return (SCHEDULER_PK, f"{UNLOCK_SHARD_LEASE_PREFIX}{shard}")


def unlock_outbox_pk(shard: int) -> str:
    return f"OUTBOX#UNLOCKED#{shard}"


def unlock_outbox(committed_at: str, capsule_id: str, shards: int) -> Key:
    """A capsule's unlock events still to publish, written by the unlock's own
    transaction and deleted once they are out: the outbox recovery reads."""
    return (unlock_outbox_pk(unlock_shard_of(capsule_id, shards)), f"{committed_at}#{capsule_id}")


def readiness_probe() -> Key:
    """Read by /readyz: an item that never exists, so the read is the cheapest there is."""
    return ("PROBE", "READINESS")


def readiness_write(process: str) -> Key:
    """Written by /readyz, one per process (with a TTL): the store can write."""
    return ("PROBE", f"WRITE#{process}")


# Notifications ----------------------------------------------------------------


def notification(user_id: str, created_at: str, notification_id: str) -> Key:
    return (f"USER#{user_id}", f"NOTIF#{created_at}#{notification_id}")


NOTIFICATION_PREFIX = "NOTIF#"


def notification_id_of(sk: str) -> str:
    return sk.rsplit("#", 1)[1]


# A person's unread count is split over this many items: marking 100 notifications
# takes 100 note writes and a count in one transaction of at most 100 items, so
# it takes two transactions, each with a count of its own (the same item in two
# concurrent transactions is a conflict on DynamoDB).
UNREAD_SLOTS = 2


def unread_counter(user_id: str, slot: int) -> Key:
    """One share of the person's unread count, with the epoch of their last
    "mark everything read" (not under NOTIF#, so listings never meet it)."""
    return (f"USER#{user_id}", f"UNREAD#{slot}")


# Tags -------------------------------------------------------------------------


def tag(author_id: str, content_id: str, normalized: str) -> Key:
    return (f"TAG#{author_id}#{content_id}", f"VALUE#{normalized}")


def tag_pk(author_id: str, content_id: str) -> str:
    return f"TAG#{author_id}#{content_id}"


def tag_gsi1(family_id: str, normalized: str, content_id: str, author_id: str) -> tuple[str, str]:
    return (f"TAGS#{family_id}", f"{normalized}#{content_id}#{author_id}")


def tag_search_pk(family_id: str) -> str:
    return f"TAGS#{family_id}"


def tag_gsi2(author_id: str, normalized: str, content_id: str) -> tuple[str, str]:
    return (f"TAGUSER#{author_id}", f"{normalized}#{content_id}")


def my_tags_pk(author_id: str) -> str:
    return f"TAGUSER#{author_id}"


def tagset_any(family_id: str, set_name: str) -> Key:
    return (f"TAGSET#{family_id}#{set_name}", "ANY")


def tagset_user(family_id: str, set_name: str, user_id: str) -> Key:
    return (f"TAGSET#{family_id}#{set_name}", f"USER#{user_id}")


# Leaving with your data -------------------------------------------------------


def account_deletion(user_id: str) -> Key:
    """The marker of an account deletion under way: present from the moment it is
    decided until its last step, so a later call, a sign-in or a sweep finishes it."""
    return (f"USER#{user_id}", "DELETING")


ACCOUNT_DELETIONS_PK = "ACCOUNT_DELETIONS"


def account_deletion_gsi2(started_at: str, user_id: str) -> tuple[str, str]:
    """Deletions under way, for the sweep that finishes abandoned ones."""
    return (ACCOUNT_DELETIONS_PK, f"{started_at}#{user_id}")


def data_export(user_id: str, export_id: str) -> Key:
    """Under its owner: another person's id never reaches it."""
    return (f"USER#{user_id}", f"EXPORT#{export_id}")


EXPORT_PREFIX = "EXPORT#"
EXPORTS_PENDING_PK = "EXPORTS_PENDING"
EXPORTS_EXPIRY_PK = "EXPORTS_EXPIRY"


def export_pending_gsi2(requested_at: str, export_id: str) -> tuple[str, str]:
    """Exports still to build, for the recovery pass."""
    return (EXPORTS_PENDING_PK, f"{requested_at}#{export_id}")


def export_expiry_gsi2(available_until: str, export_id: str) -> tuple[str, str]:
    """Built (or failed) exports by the end of their life, for the expiry sweep."""
    return (EXPORTS_EXPIRY_PK, f"{available_until}#{export_id}")


# Email ------------------------------------------------------------------------

MAIL_OUTBOX_PK = "MAIL_OUTBOX"


def mail_outbox_gsi2(created_at: str, user_id: str, notification_id: str) -> tuple[str, str]:
    """A capsule opening still to be emailed: the CAPSULE_UNLOCKED notification
    itself carries these keys until the mailer settles it, so the unlock writes
    no item more than before."""
    return (MAIL_OUTBOX_PK, f"{created_at}#{user_id}#{notification_id}")


PUSH_OUTBOX_PK = "PUSH_OUTBOX"


def push_outbox_gsi1(created_at: str, user_id: str, notification_id: str) -> tuple[str, str]:
    """A notification still to be pushed to its addressee's devices: the
    notification itself carries these keys until the push worker settles it."""
    return (PUSH_OUTBOX_PK, f"{created_at}#{user_id}#{notification_id}")


def push_device(user_id: str, device_id: str) -> Key:
    """A device a person receives pushes on, under their own partition: nobody
    else's request can name it."""
    return (f"USER#{user_id}", f"{PUSH_DEVICE_PREFIX}{device_id}")


PUSH_DEVICE_PREFIX = "PUSHDEV#"


def push_device_count(user_id: str) -> Key:
    return (f"USER#{user_id}", "PUSHDEVCOUNT")


def digest_pk(kind: str) -> str:
    """People who chose a digest of `kind` (DAILY or WEEKLY)."""
    return f"EMAIL_DIGEST#{kind}"


def digest_gsi2(kind: str, digested_until: str, user_id: str) -> tuple[str, str]:
    """By the end of the last period digested, so a pass reads only who is due."""
    return (digest_pk(kind), f"{digested_until}#{user_id}")


def digest_marker(user_id: str, period_end: str) -> Key:
    """One digest per person and period, written with a condition before it is
    sent. By the period's end only, so a person who switches DAILY -> WEEKLY on
    a Monday still gets one digest that day."""
    return (f"USER#{user_id}", f"DIGEST#{period_end}")


DIGEST_PREFIX = "DIGEST#"


# Persisted operations ---------------------------------------------------------


def persisted_document(sha256_hex: str) -> Key:
    """A GraphQL document registered through automatic persisted queries, by
    the SHA-256 of its text (64 lower-case hex digits, checked by the caller)."""
    return (f"PERSISTED#{sha256_hex}", "DOC")


def idempotency(user_id: str, key: str) -> Key:
    """A person's Idempotency-Key: hashed, so that any text the client chose
    stays out of the key space (and keys of any length fit)."""
    return (f"IDEMPOTENCY#{user_id}", hashlib.sha256(key.encode()).hexdigest())
