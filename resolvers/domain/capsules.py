"""Time capsules: what people do with them, and who may see what.

The moves the unlock scheduler makes (LOCKED -> UNLOCKING -> AVAILABLE) live
in `resolvers.processes.scheduler`; the upload moves (SCHEDULED -> LOCKED) in
`resolvers.domain.content`, inside the content's own transaction.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from resolvers.core.context import Context
from resolvers.core.cursors import Cursor
from resolvers.core.errors import BadInput, Conflict, Forbidden
from resolvers.core.pagination import MAX_PAGE, ItemPage, query_page
from resolvers.core.slices import built, each
from resolvers.core.validation import clean_text
from resolvers.domain import access, families
from store import keys
from store.enums import CapsuleStatus, ContentStatus
from store.items import Capsule, Content, Recipient, iso
from store.port import (
    ConditionFailed,
    NotExists,
    Put,
    SortKey,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
    eq,
    op_key,
)

MAX_TITLE = 200
TRANSACTION_ITEMS = 100  # DynamoDB's limit
W = TypeVar("W", bound=WriteOp)
# A capsule may go to the whole family: its writes that touch every recipient are
# batched (`_in_transactions`), so no single transaction bounds it any more.
MAX_RECIPIENTS = families.MAX_MEMBERS
RECIPIENT_PAGE = MAX_PAGE
MAX_YEARS_AHEAD = 100
OPEN = access.OPEN


def shards(ctx: Context) -> int:
    return ctx.services.settings.unlock_shards


load_capsule = access.load_capsule


async def visible_capsule(ctx: Context, capsule_id: str) -> Capsule:
    await ctx.viewer_id()
    return await access.require(ctx, await load_capsule(ctx, capsule_id), "capsule")


async def own_capsule(ctx: Context, capsule_id: str) -> Capsule:
    capsule = await visible_capsule(ctx, capsule_id)
    if capsule.creator_id != await ctx.viewer_id():
        raise Forbidden("only the capsule's creator can do that")
    return capsule


async def capsule_content(ctx: Context, capsule: Capsule) -> Content | None:
    """The creator sees it at once; recipients once the capsule is open."""
    if capsule.content_id is None:
        return None
    viewer = await ctx.viewer_id()
    if capsule.creator_id != viewer and capsule.status not in OPEN:
        return None
    item = await ctx.loaders.item.load(keys.content(capsule.content_id))
    return Content.from_item(item) if item else None


async def recipients(
    ctx: Context, capsule: Capsule, first: int = RECIPIENT_PAGE, after: str | None = None
) -> list[Recipient]:
    """A page of the recipients, in the creator's order, after the user `after`."""
    if not 0 <= first <= MAX_PAGE:
        raise BadInput(f"first must be between 0 and {MAX_PAGE}")
    people = list(capsule.recipient_ids)
    if after is not None:
        if after not in people:
            raise BadInput("after must be the user id of one of the capsule's recipients")
        people = people[people.index(after) + 1 :]
    people = people[:first]
    # Their profiles are asked for in the same batch: a recipient is shown by name.
    ctx.loaders.ask(*(keys.user(user) for user in people))
    found = await ctx.loaders.many([keys.recipient(capsule.id, user) for user in people])
    return [Recipient.from_item(item) for item in found if item is not None]


def _unlock_date(ctx: Context, unlock: datetime) -> str:
    if unlock.tzinfo is None:
        raise BadInput("unlockDate needs a timezone, e.g. 2030-01-01T00:00:00Z")
    now = ctx.services.now()
    if unlock <= now:
        raise BadInput("unlockDate must be in the future")
    if unlock > now + timedelta(days=365 * MAX_YEARS_AHEAD):
        raise BadInput(f"unlockDate must be within {MAX_YEARS_AHEAD} years")
    return iso(unlock.astimezone(UTC))


async def create_capsule(
    ctx: Context, family_id: str, title: str, unlock_date: datetime, recipient_ids: list[str]
) -> Capsule:
    viewer = await ctx.viewer_id()
    title = clean_text(title, "title", MAX_TITLE)
    unlock = _unlock_date(ctx, unlock_date)
    wanted = list(dict.fromkeys(recipient_ids))
    if not wanted:
        raise BadInput("a capsule needs at least one recipient")
    if len(wanted) > MAX_RECIPIENTS:
        raise BadInput(f"a capsule can have at most {MAX_RECIPIENTS} recipients")
    usable = [user for user in wanted if keys.usable_id(user)]
    if keys.usable_id(family_id):
        # The recipients' memberships, and their profiles the answer shows, in
        # the batch that reads the family and the viewer's membership.
        ctx.loaders.ask(*(keys.member(family_id, user) for user in usable), *map(keys.user, usable))
    await asyncio.gather(ctx.check_rate("capsule"), families.readable_family(ctx, family_id))
    memberships = await ctx.loaders.many([keys.member(family_id, user) for user in usable])
    members = {item["userId"] for item in memberships if item and item["role"] in access.READERS}
    outsiders = [user for user in wanted if user not in members]
    if outsiders:
        raise BadInput("every recipient must be a MEMBER or ADMIN of the family")
    capsule = Capsule(
        id=uuid.uuid4().hex,
        family_id=family_id,
        creator_id=viewer,
        title=title,
        unlock_date=unlock,
        status=CapsuleStatus.DRAFT,
        created_at=ctx.services.now_iso(),
        recipient_ids=tuple(wanted),
    )
    people = await built(
        wanted, lambda user: Put(Recipient(capsule.id, user, unlock, family_id).to_item(), NotExists())
    )
    # Beside the capsule's put, its transaction holds the rate count and,
    # with an Idempotency-Key, the key.
    head, rest = _split(people, beside=3)
    # Recipients past the first transaction's room go first: without their
    # capsule they are invisible, and the capsule's own put is the commit.
    await _in_transactions(ctx.table, rest)
    puts = [Put(capsule.to_item(shards(ctx)), NotExists()), *head]
    await ctx.counted("capsule", puts)
    # The answer shows what was written without reading it again.
    await each((*puts, *rest), lambda put: ctx.loaders.remember(put.item))
    return capsule


def _split(ops: list[W], beside: int = 1) -> tuple[list[W], list[W]]:
    """What fits beside `beside` other writes (the capsule's own, say) in one
    transaction, and the rest."""
    return ops[: TRANSACTION_ITEMS - beside], ops[TRANSACTION_ITEMS - beside :]


async def _in_transactions(table: Table, ops: Sequence[WriteOp]) -> None:
    """Replayable writes to many recipients, in transactions of at most 100."""
    await asyncio.gather(
        *(table.transact(ops[n : n + TRANSACTION_ITEMS]) for n in range(0, len(ops), TRANSACTION_ITEMS))
    )


async def schedule_capsule(ctx: Context, capsule_id: str) -> Capsule:
    capsule = await own_capsule(ctx, capsule_id)
    if capsule.status != CapsuleStatus.DRAFT:
        raise Conflict(f"only a DRAFT capsule can be scheduled (status {capsule.status})")
    if capsule.unlock_date <= ctx.services.now_iso():
        raise BadInput("the unlock date has passed; create a new capsule")
    scheduled = replace(capsule, status=CapsuleStatus.SCHEDULED)
    item = scheduled.to_item(shards(ctx))

    def listing(user: str) -> WriteOp:
        gsi1pk, gsi1sk = keys.recipient_gsi1(user, capsule.unlock_date, capsule.id)
        return Update(keys.recipient(capsule.id, user), set={"GSI1PK": gsi1pk, "GSI1SK": gsi1sk})

    listed = await built(capsule.recipient_ids, listing)
    head, rest = _split(listed)
    # Listed before the capsule is SCHEDULED: the read rule hides a DRAFT from
    # its recipients, so a crash in between shows nobody anything.
    await _in_transactions(ctx.table, rest)
    ops: list[WriteOp] = [
        Update(
            capsule.key,
            set={"status": CapsuleStatus.SCHEDULED, "GSI2PK": item["GSI2PK"], "GSI2SK": item["GSI2SK"]},
            condition=eq("status", CapsuleStatus.DRAFT),
        ),
        *head,
    ]
    try:
        await ctx.table.transact(ops)
    except TransactionCancelled as error:
        raise Conflict("the capsule changed meanwhile") from error
    ctx.loaders.forget(capsule.key)
    return scheduled


async def cancel_capsule(ctx: Context, capsule_id: str) -> Capsule:
    capsule = await own_capsule(ctx, capsule_id)
    if capsule.status not in (CapsuleStatus.DRAFT, CapsuleStatus.SCHEDULED):
        raise Conflict(f"a {capsule.status} capsule cannot be cancelled")
    ops: list[WriteOp] = [
        Update(
            capsule.key,
            set={"status": CapsuleStatus.CANCELLED},
            remove=["GSI2PK", "GSI2SK"],
            condition=eq("status", capsule.status),
        ),
    ]
    unlisted: list[WriteOp] = await built(
        capsule.recipient_ids,
        lambda user: Update(keys.recipient(capsule.id, user), remove=["GSI1PK", "GSI1SK"]),
    )
    head, rest = _split(unlisted, beside=2)  # the capsule's write, and its upload's
    for _ in range(3):
        # An upload under way is listed for the sweep in the same step: nobody
        # else could ever finish or remove it once its capsule is gone.
        listed = await _abandoned_upload(ctx, capsule)
        try:
            await ctx.table.transact([*ops, *listed, *head])
            break
        except TransactionCancelled as error:
            if not (listed and error.failed_on(op_key(listed[0]))):
                raise Conflict("the capsule changed meanwhile; it may be LOCKED now") from error
            ctx.loaders.forget(op_key(listed[0]))  # the upload moved on meanwhile: read it again
    else:
        raise Conflict("the capsule's upload kept changing; try again")
    # Unlisted after the capsule is CANCELLED: the read rule already hides it.
    await _in_transactions(ctx.table, rest)
    ctx.loaders.forget(capsule.key)
    return replace(capsule, status=CapsuleStatus.CANCELLED)


async def _abandoned_upload(ctx: Context, capsule: Capsule) -> list[WriteOp]:
    """The write that lists the capsule's content for the abandoned-upload sweep,
    if its upload is still under way."""
    if capsule.content_id is None:
        return []
    item = await ctx.loaders.item.load(keys.content(capsule.content_id))
    if item is None or item["status"] != ContentStatus.UPLOADING:
        return []
    gsi2pk, gsi2sk = keys.abandoned_upload_gsi2(ctx.services.now_iso(), capsule.content_id)
    return [
        Update(
            keys.content(capsule.content_id),
            set={"GSI2PK": gsi2pk, "GSI2SK": gsi2sk},
            condition=eq("status", ContentStatus.UPLOADING),
        )
    ]


async def open_capsule(ctx: Context, capsule_id: str) -> Capsule:
    viewer = await ctx.viewer_id()
    found = await load_capsule(ctx, capsule_id)
    if found is not None and found.content_id is not None:
        # What the opened capsule shows, asked for beside the viewer's membership.
        ctx.loaders.ask(keys.content(found.content_id))
    capsule = await visible_capsule(ctx, capsule_id)
    if viewer not in capsule.recipient_ids:
        raise Forbidden("only a recipient can open this capsule")
    if capsule.status not in (CapsuleStatus.AVAILABLE, CapsuleStatus.VIEWED):
        raise Conflict(f"the capsule is not open yet (status {capsule.status})")
    written: Update | None = None
    for _ in range(3):
        written = None
        now = ctx.services.now_iso()
        ops: list[WriteOp] = [
            Update(keys.recipient(capsule.id, viewer), set={"viewedAt": now}, condition=eq("viewedAt", None)),
        ]
        if capsule.status == CapsuleStatus.AVAILABLE:
            gsi2pk, gsi2sk = keys.retention_gsi2(now, capsule.id)
            written = Update(
                capsule.key,
                set={"status": CapsuleStatus.VIEWED, "viewedAt": now, "GSI2PK": gsi2pk, "GSI2SK": gsi2sk},
                condition=eq("status", CapsuleStatus.AVAILABLE),
            )
            ops.append(written)
        before = await ctx.loaders.item.load(capsule.key)  # as read for the rule: no round trip
        try:
            await ctx.table.transact(ops)
        except TransactionCancelled as error:
            if error.failed_on(keys.recipient(capsule.id, viewer)):
                written = None
                break  # this recipient opened it before
            # Another recipient opened it first: record this one's first view too.
            ctx.loaders.forget(capsule.key)
            capsule = await visible_capsule(ctx, capsule.id)
            continue
        break
    ctx.loaders.forget(keys.recipient(capsule.id, viewer))
    if written is not None:
        # This call opened it: the answer is what it wrote, not read again.
        (item,) = ctx.loaders.written([before], [written])
        return Capsule.from_item(item)
    if capsule.status == CapsuleStatus.VIEWED:
        return capsule  # opened before and nothing of the capsule written now
    ctx.loaders.forget(capsule.key)
    reread = await load_capsule(ctx, capsule.id)
    return reread or capsule


@dataclass(frozen=True)
class CapsulePage:
    """A page of capsules the viewer may read now; a capsule the rule hides
    leaves a gap in the page rather than a hint that it exists."""

    capsules: list[Capsule]
    cursors: list[Cursor]
    has_next: bool
    end_cursor: Cursor | str | None


async def _readable_page(ctx: Context, page: ItemPage, capsules: list[Capsule | None]) -> CapsulePage:
    found = [(c, cursor) for c, cursor in zip(capsules, page.cursors, strict=True) if c is not None]
    verdicts = await access.verdicts(ctx, [c for c, _ in found])
    chosen = [pair for pair, allowed in zip(found, verdicts, strict=True) if allowed]
    return CapsulePage(
        [c for c, _ in chosen], [cursor for _, cursor in chosen], page.has_next, page.end_cursor
    )


async def my_capsules(ctx: Context, first: int, after: str | None) -> CapsulePage:
    viewer = await ctx.viewer_id()
    page = await query_page(
        ctx,
        scope=f"my-capsules:{viewer}",
        pk=keys.user_pk(viewer),
        sk=SortKey.begins_with(keys.CAPSULE_PREFIX),
        index="GSI1",
        descending=True,
        first=first,
        after=after,
    )
    return await _readable_page(ctx, page, [Capsule.from_item(item) for item in page.items])


async def received_capsules(ctx: Context, first: int, after: str | None) -> CapsulePage:
    """Recipient items, soonest unlock last; a recipient item is in GSI1 only
    while the recipient may know of the capsule (SCHEDULED or later)."""
    viewer = await ctx.viewer_id()
    page = await query_page(
        ctx,
        scope=f"received:{viewer}",
        pk=keys.user_pk(viewer),
        sk=SortKey.begins_with(keys.RECEIVED_PREFIX),
        index="GSI1",
        descending=True,
        first=first,
        after=after,
    )
    found = await ctx.loaders.many([keys.capsule(item["capsuleId"]) for item in page.items])
    return await _readable_page(ctx, page, [Capsule.from_item(item) if item else None for item in found])


async def archive_viewed(table: Table, now: datetime, retention_days: int) -> int:
    """VIEWED -> ARCHIVED once the retention period after the first view has passed."""
    cutoff = iso(now - timedelta(days=retention_days))
    archived = 0
    for shard in range(keys.ARCHIVE_SHARDS):
        page = await table.query(keys.retention_pk(shard), SortKey("<", cutoff), index="GSI2", limit=100)
        for item in page.items:
            try:
                await table.update(
                    Update(
                        (item["PK"], item["SK"]),
                        set={"status": CapsuleStatus.ARCHIVED},
                        remove=["GSI2PK", "GSI2SK"],
                        condition=eq("status", CapsuleStatus.VIEWED),
                    )
                )
            except ConditionFailed:
                continue
            archived += 1
    return archived
