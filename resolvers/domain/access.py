"""The one read rule, in one place.

Reading anything of a family (its content, capsules, comments, reactions, tags,
media URLs, members and their profiles, and what notifications point to)
requires the viewer to be a current MEMBER or ADMIN of that family at the time
of the read. A family's invites and its admins' record are its current ADMINs'
alone. Being a capsule's creator or recipient never bypasses it. A
PENDING member sees the family itself and their own membership, nothing more.
From the moment a person begins deleting their account, their content,
comments and tags are nobody's to read (the family item names them,
`Family.departing`), not only once the deletion reaches them.

Every resolver that fetches records asks `may_read` (or `readable` for a list),
and `schema.guard.GuardedExecutionContext` asks it again where a record becomes
a GraphQL object (once per object), so a new field or a new path cannot forget
the rule. Verdicts are cached per operation beside the loaders, and the
memberships they need are point reads that join the loaders' batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

from resolvers.core.context import Context
from resolvers.core.errors import Forbidden, NotFound, not_found
from resolvers.core.pagination import ItemPage
from store import keys
from store.enums import CapsuleStatus, Role
from store.items import (
    Capsule,
    Comment,
    Content,
    DataExport,
    Family,
    FamilyEvent,
    FamilyInvite,
    Membership,
    Notification,
    Recipient,
    Tag,
)

READERS = frozenset({Role.ADMIN, Role.MEMBER})
# Recipients may know of a capsule once it is scheduled, and never while it is
# a DRAFT or after it was CANCELLED.
VISIBLE_TO_RECIPIENTS = frozenset(
    {
        CapsuleStatus.SCHEDULED,
        CapsuleStatus.LOCKED,
        CapsuleStatus.UNLOCKING,
        CapsuleStatus.AVAILABLE,
        CapsuleStatus.VIEWED,
        CapsuleStatus.ARCHIVED,
    }
)
OPEN = frozenset({CapsuleStatus.AVAILABLE, CapsuleStatus.VIEWED, CapsuleStatus.ARCHIVED})

# Every record the one read rule decides on (not `store.codec.Record`, the base of all records).
GuardedRecord = (
    Family
    | Membership
    | Content
    | Capsule
    | Comment
    | Recipient
    | Tag
    | Notification
    | DataExport
    | FamilyInvite
    | FamilyEvent
)
R = TypeVar("R", bound=GuardedRecord)

# The record types the read guard checks, and the word a refusal uses.
GUARDED: dict[type, str] = {
    Family: "family",
    Membership: "member",
    Content: "content",
    Capsule: "capsule",
    Comment: "comment",
    Recipient: "capsule",
    Tag: "tag",
    Notification: "notification",
    DataExport: "export",
    FamilyInvite: "invite",
    FamilyEvent: "family event",
}


# Memberships -----------------------------------------------------------------


async def membership(ctx: Context, family_id: str, *, with_family: bool = False) -> Membership | None:
    """The viewer's membership of the family now, any role. `with_family` asks
    for the family item in the same batch: it names who is leaving
    (`departing`), so deciding on the family's content costs no round trip."""
    viewer = await ctx.viewer_id()
    if not keys.usable_id(family_id):
        return None
    also = (keys.family(family_id),) if with_family else ()
    item = await ctx.loaders.load_with(keys.member(family_id, viewer), *also)
    return ctx.loaders.decoded(Membership, item) if item else None


async def reader(ctx: Context, family_id: str) -> Membership | None:
    """The viewer's membership when they may read the family's things now."""
    found = await membership(ctx, family_id, with_family=True)
    return found if found is not None and found.role in READERS else None


async def require_member(ctx: Context, family_id: str) -> Membership:
    """Any role, PENDING included; NOT_FOUND to everyone else."""
    found = await membership(ctx, family_id)
    if found is None:
        raise not_found("family")
    return found


async def require_reader(ctx: Context, family_id: str) -> Membership:
    """MEMBER or ADMIN; NOT_FOUND to everyone else."""
    found = await reader(ctx, family_id)
    if found is None:
        raise not_found("family")
    return found


def waiting_for_approval() -> Forbidden:
    # A PENDING member is not a stranger: they know the family exists, so they
    # are told why they cannot read it yet rather than "not found".
    return Forbidden("your membership is waiting for approval")


# Records -----------------------------------------------------------------------


def is_sealed(content: Content) -> bool:
    """Capsule content stays out of the feed (no GSI1 keys) until its capsule
    opens; until then only its author may see it."""
    return content.capsule_id is not None and not content.in_feed


def capsule_role_allows(capsule: Capsule, viewer: str) -> bool:
    """The capsule's own part of the rule; the family part comes on top."""
    if capsule.creator_id == viewer:
        return True
    return capsule.receives(viewer) and capsule.status in VISIBLE_TO_RECIPIENTS


def capsule_readable(capsule: Capsule, viewer: str, membership: Membership | None) -> bool:
    """The whole rule for a capsule, given the viewer's membership of its
    family now (what `may_read` decides, for a caller without a request, such
    as an export's build)."""
    return (
        capsule_role_allows(capsule, viewer)
        and membership is not None
        and membership.family_id == capsule.family_id
        and membership.user_id == viewer
        and membership.role in READERS
    )


def content_readable(
    content: Content, viewer: str, membership: Membership | None, family: Family | None
) -> bool:
    """The whole rule for a content, given the viewer's membership of its
    family now and the family item, which names who is leaving (what
    `may_read` decides, for a caller that read both for many viewers at once:
    a status change's turn)."""
    if is_sealed(content) and content.author_id != viewer:
        return False
    return (
        membership is not None
        and membership.family_id == content.family_id
        and membership.user_id == viewer
        and membership.role in READERS
        and not (family is not None and content.author_id in family.departing)
    )


async def load_content(ctx: Context, content_id: str) -> Content | None:
    if not keys.usable_id(content_id):
        return None
    item = await ctx.loaders.item.load(keys.content(content_id))
    return ctx.loaders.decoded(Content, item) if item else None


async def load_capsule(ctx: Context, capsule_id: str) -> Capsule | None:
    if not keys.usable_id(capsule_id):
        return None
    item = await ctx.loaders.item.load(keys.capsule(capsule_id))
    return ctx.loaders.decoded(Capsule, item) if item else None


async def load_family(ctx: Context, family_id: str) -> Family | None:
    if not keys.usable_id(family_id):
        return None
    item = await ctx.loaders.item.load(keys.family(family_id))
    return ctx.loaders.decoded(Family, item) if item else None


async def departing(ctx: Context, family_id: str, author_id: str) -> bool:
    """Whether the author is deleting their account (their things in the family
    go, and nobody reads them meanwhile). The family item is loaded beside the
    viewer's membership when content is decided, so asking costs no round trip."""
    family = await load_family(ctx, family_id)
    return family is not None and author_id in family.departing


async def _decide(ctx: Context, record: GuardedRecord) -> bool:
    viewer = await ctx.viewer_id()
    if isinstance(record, Notification | DataExport):
        return record.user_id == viewer
    if isinstance(record, Family):
        return await membership(ctx, record.id) is not None
    if isinstance(record, FamilyInvite | FamilyEvent):
        found = await membership(ctx, record.family_id)
        return found is not None and found.role == Role.ADMIN
    if isinstance(record, Membership):
        return record.user_id == viewer or await reader(ctx, record.family_id) is not None
    if isinstance(record, Content):
        if is_sealed(record) and record.author_id != viewer:
            return False
        # The family item (which names who is leaving) joins the membership's batch.
        ctx.loaders.ask(keys.family(record.family_id))
        found = await membership(ctx, record.family_id, with_family=True)
        return content_readable(record, viewer, found, await load_family(ctx, record.family_id))
    if isinstance(record, Capsule):
        return capsule_readable(record, viewer, await membership(ctx, record.family_id, with_family=True))
    if isinstance(record, Recipient):
        capsule = await load_capsule(ctx, record.capsule_id)
        return capsule is not None and await may_read(ctx, capsule)
    if isinstance(record, Comment):
        content = await load_content(ctx, record.content_id)
        if content is None or not await may_read(ctx, content):
            return False
        return not await departing(ctx, content.family_id, record.author_id)
    if isinstance(record, Tag):
        if record.private and record.author_id != viewer:
            return False
        content = await load_content(ctx, record.content_id)
        if content is None or not await may_read(ctx, content):
            return False
        return not await departing(ctx, content.family_id, record.author_id)
    raise TypeError(f"no read rule for {type(record).__name__}")


def _verdict_key(record: GuardedRecord) -> tuple[object, ...]:
    # The item's key and the state the rule reads: a record that changes within
    # one operation (a capsule opening, content leaving its capsule) is decided anew.
    if isinstance(record, Content):
        return (Content, record.key, record.in_feed)
    if isinstance(record, Capsule):
        return (Capsule, record.key, record.status)
    if isinstance(record, Membership):
        return (Membership, record.key, record.role)
    return (type(record), record.key)


def cached_verdict(ctx: Context, record: GuardedRecord) -> bool | None:
    """The verdict this operation already reached for the record, if any."""
    return ctx.loaders.verdicts.get(_verdict_key(record))


async def may_read(ctx: Context, record: GuardedRecord) -> bool:
    """The rule: may the viewer read this record now?"""
    key = _verdict_key(record)
    verdicts = ctx.loaders.verdicts
    found = verdicts.get(key)
    if found is None:
        found = await _decide(ctx, record)
        verdicts[key] = found
    return found


def _first_read(record: GuardedRecord) -> tuple[type, str]:
    """What deciding on the record reads first: records that share it are
    decided from the same loaded items."""
    if isinstance(record, Family):
        return (Family, record.id)
    if isinstance(record, Content | Capsule | Membership | FamilyInvite | FamilyEvent):
        return (Family, record.family_id)
    if isinstance(record, Recipient):
        return (Capsule, record.capsule_id)
    if isinstance(record, Comment | Tag):
        return (Content, record.content_id)
    return (type(record), "")


async def verdicts(ctx: Context, records: Sequence[GuardedRecord]) -> list[bool]:
    """`may_read` for each record, in order. One record for each distinct first
    read is decided concurrently, so their reads share one batch; the others
    are then decided from the loaders' cache, one after another, without a
    task each (a page of a hundred in one family costs one task, not a
    hundred: thousands of ready tasks would hold the loop for all of them)."""
    first: dict[tuple[type, str], GuardedRecord] = {}
    for record in records:
        if cached_verdict(ctx, record) is None:
            first.setdefault(_first_read(record), record)
    if len(first) > 1:
        await asyncio.gather(*(may_read(ctx, record) for record in first.values()))
    return [await may_read(ctx, record) for record in records]


async def readable(ctx: Context, records: Sequence[R]) -> list[R]:
    """The records the viewer may read, in order; their reads share a batch."""
    allowed = await verdicts(ctx, records)
    return [record for record, ok in zip(records, allowed, strict=True) if ok]


async def readable_page(ctx: Context, page: ItemPage, record: type[R]) -> ItemPage:
    """The page without the items the viewer may not read (a departing
    author's, in a page whose every item the family's readers otherwise see).
    It may come out short; its end cursor stays where the read stopped."""
    records = [record.from_item(item) for item in page.items]
    allowed = await verdicts(ctx, records)
    if all(allowed):
        return page
    kept = [(item, cursor) for item, cursor, ok in zip(page.items, page.cursors, allowed, strict=True) if ok]
    return ItemPage(
        [item for item, _ in kept], [cursor for _, cursor in kept], page.has_next, page.end_cursor
    )


def refusal(record: GuardedRecord) -> NotFound:
    # One answer for "missing" and "not yours", so a refusal leaks nothing.
    return not_found(GUARDED.get(type(record), "item"))


async def require(ctx: Context, record: R | None, what: str) -> R:
    """The record when the viewer may read it; NOT_FOUND otherwise."""
    if record is None or not await may_read(ctx, record):
        raise not_found(what)
    return record


async def content_reader(ctx: Context, content: Content) -> Membership | None:
    """The viewer's membership when they may read this content, else None."""
    if not await may_read(ctx, content):
        return None
    return await reader(ctx, content.family_id)


async def readable_content(ctx: Context, content_id: str) -> tuple[Content, Membership]:
    """The content and the viewer's membership; NOT_FOUND unless the rule allows it."""
    content = await load_content(ctx, content_id)
    reading = await content_reader(ctx, content) if content else None
    if content is None or reading is None:
        if content is not None and not is_sealed(content):
            found = await membership(ctx, content.family_id)
            if found is not None and found.role == Role.PENDING:
                raise waiting_for_approval()
        raise not_found("content")
    return content, reading
