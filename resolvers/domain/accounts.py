"""Deleting one's account, in steps that can stop anywhere and resume.

`deleteMyAccount` first refuses (CONFLICT) while the person is the last ADMIN
of a family that has other members, unless it names a successor for that
family (a current MEMBER, who becomes ADMIN as the person leaves it, in the
same transaction). Then it writes the deletion marker
(`USER#<id>` / `DELETING`, with the families the person belongs to) and, in
the same transaction, names the person on each of those families' items
(`keys.departing_attribute`): from that moment the account counts as deleted,
nobody reads the person's content, comments or tags any more (the read rule,
`resolvers.domain.access`), and every later step reads what is
left and removes it with a conditional write or a transaction, so running the
steps again, after a crash or alongside another process, finds less to do and
never counts anything twice. Whoever sees the marker finishes the work: the
next `deleteMyAccount`, the person's next request (before their fresh profile
is made), or the sweep (`resolvers.processes.accounts`) once the marker's lease
has run out.

The steps, in order:

1. memberships: left as `leaveFamily` leaves them (vouches for the person go
   too), with the successor named for the family, if any. A family where the
   person is the last ADMIN and the only member is dissolved: its invite codes
   go first (nobody can join any more), then it is marked `dissolving`, and
   step 6 deletes everything in its feed.
2. vouches the person gave: deleted, and the vouchee's score lowered with them.
3. capsules the person created: those not yet LOCKED, and those already open,
   are deleted with their content; a LOCKED (or UNLOCKING) capsule stays and
   opens for its recipients on its date (a sealed capsule is a promise its
   creator could not break either), unless its content failed or its family is
   dissolved.
4. capsules the person receives: their recipient item goes and their id
   leaves the capsule's recipients.
5. tags: removed as `setTags` with no values removes them, markers adjusted.
6. each family's feed: the person's content is deleted with its comments,
   reactions, tags and blobs; their comments and reactions on other people's
   content are deleted with the counts adjusted in the same transaction.
7. their own partition: profile, notifications, exports (and export files).
8. the marker, with the families' marks, in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta

from resolvers.core.context import Context
from resolvers.core.errors import BadInput, Conflict, Unauthenticated
from resolvers.core.leases import Lease
from resolvers.domain import families, footprint, notifications, tags
from resolvers.domain.content import REACTOR_ATTR
from store import keys
from store.enums import CapsuleStatus, ContentStatus, Role
from store.items import (
    AccountDeletion,
    Capsule,
    Comment,
    Content,
    DataExport,
    Family,
    Invite,
    Membership,
    PushDevice,
    Recipient,
    Vouch,
    iso,
    reaction_attr,
)
from store.port import (
    MAX_TRANSACTION_ITEMS,
    ConditionFailed,
    Delete,
    Exists,
    Key,
    NotExists,
    Put,
    SortKey,
    TransactionCancelled,
    Update,
    WriteOp,
    all_items,
    eq,
)

log = logging.getLogger("mifamilias.accounts")

ATTEMPTS = 5
# The share of the operation deadline a request spends on a deletion before the
# background takes over: the answer must not be the deadline's error.
REQUEST_SHARE = 0.5
# Capsules kept for their recipients: sealed, with content that can still open.
KEPT_CAPSULES = frozenset({CapsuleStatus.LOCKED, CapsuleStatus.UNLOCKING})
DISSOLVING = "dissolving"
VOUCH_PREFIX = "VOUCH#"


class LastAdmin(Conflict):
    def __init__(self, family_name: str) -> None:
        super().__init__(
            f"you are the last ADMIN of the family {family_name!r}, which has other members: "
            "hand it over first: name a successor for it (successors: [{familyId, userId}], a current "
            "MEMBER), make another member ADMIN, or remove its other members"
        )


def subject(ctx: Context) -> str:
    """The signed-in person's id, without making a profile for them."""
    refusal = ctx.signed_in_error()
    if refusal is not None or ctx.claims is None:
        raise refusal or Unauthenticated("sign in: send a Bearer token")
    return ctx.claims.sub


def lease_of(ctx: Context) -> timedelta:
    return timedelta(seconds=ctx.services.settings.pipeline_lease_seconds)


def budget(ctx: Context) -> float | None:
    """How long a request may work on a deletion (None: no limit)."""
    deadline = ctx.services.settings.operation_deadline_seconds
    return deadline * REQUEST_SHARE if deadline else None


# Deciding -------------------------------------------------------------------------


async def delete_my_account(ctx: Context, successors: dict[str, str] | None = None) -> bool:
    user_id = subject(ctx)
    owner = uuid.uuid4().hex
    marker = await _begin(ctx, user_id, owner, successors or {})
    # From here on this process makes a fresh profile at the person's next request.
    ctx.services.known_users.discard(user_id)
    try:
        # Within the request while it fits; what does not is finished in the background.
        async with asyncio.timeout(budget(ctx)):
            await finish(ctx, marker, owner)
    except TimeoutError:
        log.info("account %s: the deletion goes on in the background", user_id)
        await release(ctx, user_id, owner)
        ctx.services.accounts.resume(ctx.services, user_id)
    return True


async def _begin(ctx: Context, user_id: str, owner: str, successors: dict[str, str]) -> AccountDeletion:
    found = await ctx.table.get(keys.account_deletion(user_id))
    if found is not None:
        return AccountDeletion.from_item(found)  # decided before: finish it
    family_ids = await footprint.family_ids(ctx.table, user_id)
    strangers = sorted(set(successors) - set(family_ids))
    if strangers:
        raise BadInput(f"successors name a family you are not in: {strangers[0]}")
    needed, present = await _refuse_last_admin(ctx, user_id, family_ids, successors)
    now = ctx.services.now()
    # Born held by this request, so the sweep leaves it alone.
    marker = AccountDeletion(
        user_id,
        iso(now),
        tuple(family_ids),
        iso(now + lease_of(ctx)),
        owner,
        successors={family_id: successors[family_id] for family_id in needed},
    )
    # The families are marked in the marker's own transaction: from the commit
    # on, the read rule refuses the person's things there (access.departing),
    # and no crash can leave a marker whose families do not say so.
    for _ in range(ATTEMPTS):
        marks = [
            Update(
                keys.family(family_id),
                set={keys.departing_attribute(user_id): marker.started_at},
                condition=Exists(),
            )
            for family_id in present
        ]
        try:
            first = marks[: MAX_TRANSACTION_ITEMS - 1]
            await ctx.table.transact([Put(marker.to_item(), NotExists()), *first])
        except TransactionCancelled as error:
            if error.failed_on(marker.key):
                found = await ctx.table.get(marker.key)  # a parallel call decided first
                return AccountDeletion.from_item(found) if found is not None else marker
            # A family went (or changed) meanwhile: read which are still there.
            there = await ctx.table.batch_get([keys.family(family_id) for family_id in present])
            present = [family_id for family_id in present if keys.family(family_id) in there]
            continue
        # More families than one transaction holds: the rest, before any step runs.
        for mark in marks[MAX_TRANSACTION_ITEMS - 1 :]:
            with contextlib.suppress(ConditionFailed):
                await ctx.table.update(mark)
        return marker
    raise Conflict("your families keep changing; try again")


async def _refuse_last_admin(
    ctx: Context, user_id: str, family_ids: list[str], successors: dict[str, str]
) -> tuple[list[str], list[str]]:
    """The families where the person is the last ADMIN with others there, each
    with its successor checked (LastAdmin for the first without one), and the
    families whose item exists."""
    wanted = [keys.member(f, user_id) for f in family_ids] + [keys.family(f) for f in family_ids]
    # A successor's membership joins the batch (never twice the same key: DynamoDB refuses that).
    wanted += [keys.member(f, u) for f, u in successors.items() if keys.usable_id(u) and u != user_id]
    found = await ctx.table.batch_get(wanted) if wanted else {}
    needed: list[str] = []
    for family_id in family_ids:
        membership, family = found.get(keys.member(family_id, user_id)), found.get(keys.family(family_id))
        if membership is None or family is None or membership.get("role") != Role.ADMIN:
            continue
        if int(family.get("adminCount", 1)) <= 1 and await _others(ctx, family_id, user_id):
            heir = successors.get(family_id)
            if heir is None:
                raise LastAdmin(str(family.get("name", "")))
            heir_membership = found.get(keys.member(family_id, heir)) if keys.usable_id(heir) else None
            if heir == user_id or heir_membership is None or heir_membership.get("role") != Role.MEMBER:
                raise BadInput(
                    f"the successor for {family.get('name', '')!r} must be a current MEMBER of that family"
                )
            needed.append(family_id)
    return needed, [family_id for family_id in family_ids if keys.family(family_id) in found]


async def _others(ctx: Context, family_id: str, user_id: str) -> bool:
    page = await ctx.table.query(keys.family_pk(family_id), SortKey.begins_with(keys.MEMBER_PREFIX), limit=2)
    return any(item.get("userId") != user_id for item in page.items)


# The lease: who is working on a deletion now ----------------------------------------


async def hold(ctx: Context, user_id: str, owner: str) -> bool:
    """Takes or renews the marker's lease, whoever held it: the request of the
    person who asked just now, or the background run that took it over (every
    step is conditional, so two runs at once do no harm). False when the marker
    is gone: another run finished."""
    return await Lease(owner, lease_of(ctx)).take(
        ctx.table, keys.account_deletion(user_id), ctx.services.now()
    )


async def release(ctx: Context, user_id: str, owner: str) -> None:
    """Hands the lease back, so the next sweep takes the deletion up at once."""
    await Lease(owner, lease_of(ctx)).release(ctx.table, keys.account_deletion(user_id))


# Finishing ---------------------------------------------------------------------------


async def finish_pending(ctx: Context, user_id: str, owner: str) -> bool:
    """Finishes a deletion decided earlier, if there is one; True if there was."""
    found = await ctx.table.get(keys.account_deletion(user_id))
    if found is None:
        return False
    await finish(ctx, AccountDeletion.from_item(found), owner)
    ctx.services.known_users.discard(user_id)
    return True


async def finish(ctx: Context, marker: AccountDeletion, owner: str) -> None:
    """Every step, from wherever an earlier run stopped. Between steps the
    lease is renewed; a marker gone meanwhile means another run finished, and
    this one stops (the person may have signed in afresh since)."""
    user_id = marker.user_id
    if not await hold(ctx, user_id, owner):
        return
    try:
        for family_id in marker.family_ids:
            await _leave(ctx, user_id, family_id, marker.successors.get(family_id))
    except LastAdmin:
        # Only when someone joined after the check: nothing of theirs is gone
        # but whole families left or dissolved; the person may try again later.
        await _end(ctx, marker, marker.family_ids)
        raise
    await _vouches_given(ctx, user_id, marker.family_ids)
    if not await hold(ctx, user_id, owner):
        return
    await _capsules_created(ctx, user_id)
    await _capsules_received(ctx, user_id)
    if not await hold(ctx, user_id, owner):
        return
    await _tags(ctx, user_id)
    remaining: list[str] = []
    for family_id in marker.family_ids:
        if not await hold(ctx, user_id, owner):
            return
        if await _family_feed(ctx, user_id, family_id):
            remaining.append(family_id)
    if not await hold(ctx, user_id, owner):
        return
    await _own_partition(ctx, marker)
    await _end(ctx, marker, remaining)
    log.info("account %s deleted", user_id)


async def _end(ctx: Context, marker: AccountDeletion, family_ids: Sequence[str]) -> None:
    """The marker goes with the families' marks, in one transaction: nothing of
    the person is left there to hide. The marks go first when they cannot go
    with it (a family gone meanwhile, more than one transaction holds), so a
    crash between leaves the marker, and the sweep ends it again."""
    unmarks = [
        Update(keys.family(family_id), remove=[keys.departing_attribute(marker.user_id)], condition=Exists())
        for family_id in family_ids
    ]
    alone, together = unmarks[MAX_TRANSACTION_ITEMS - 1 :], unmarks[: MAX_TRANSACTION_ITEMS - 1]
    for unmark in alone:
        with contextlib.suppress(ConditionFailed):
            await ctx.table.update(unmark)
    try:
        await ctx.table.transact([Delete(marker.key), *together])
        return
    except TransactionCancelled:
        pass  # a family went meanwhile: nothing to unmark there
    for unmark in together:
        with contextlib.suppress(ConditionFailed):
            await ctx.table.update(unmark)
    await ctx.table.delete(marker.key)


# 1. Memberships ----------------------------------------------------------------------


async def _leave(ctx: Context, user_id: str, family_id: str, successor_id: str | None = None) -> None:
    for _ in range(ATTEMPTS):
        found = await ctx.table.batch_get([keys.member(family_id, user_id), keys.family(family_id)])
        membership_item = found.get(keys.member(family_id, user_id))
        family_item = found.get(keys.family(family_id))
        if membership_item is None:
            # Left already; a mirror left behind by an older crash goes too.
            await ctx.table.delete(keys.user_family(user_id, family_id))
            return
        membership = Membership.from_item(membership_item)
        if family_item is None:
            await ctx.table.batch_write(deletes=[membership.key, keys.user_family(user_id, family_id)])
            return
        family = Family.from_item(family_item)
        last = membership.role == Role.ADMIN and int(family_item.get("adminCount", 1)) <= 1
        if last and successor_id is None:
            await _dissolve(ctx, family, membership)
            return
        try:
            await families.leave_as(ctx, family, membership, successor_id if last else None)
            return
        except BadInput as error:
            # The successor left (or was removed) since the deletion was decided.
            raise LastAdmin(family.name) from error
        except Conflict:
            continue  # the membership changed meanwhile: read it again
    raise Conflict("your memberships keep changing; try again")


async def _dissolve(ctx: Context, family: Family, membership: Membership) -> None:
    """The last ADMIN, alone in the family: nobody can join once the invite is
    gone, so reading the members afterwards sees everyone there will be."""
    codes = [Invite(family.invite_code, family.id)]
    codes += [Invite(i.code, family.id, i.id) for i in await families.family_invites(ctx, family.id)]
    for code in codes:
        with contextlib.suppress(ConditionFailed):
            await ctx.table.delete(code.key, eq("familyId", family.id))
    if await _others(ctx, family.id, membership.user_id):
        for code in codes:
            with contextlib.suppress(ConditionFailed):
                await ctx.table.put(code.to_item(), NotExists())
        raise LastAdmin(family.name)
    vouches = await all_items(
        ctx.table, keys.family_pk(family.id), SortKey.begins_with(keys.vouch_prefix(membership.user_id))
    )
    await ctx.table.transact(
        [
            Update(family.key, set={DISSOLVING: True}, condition=Exists()),
            Delete(membership.key),
            Delete(keys.user_family(membership.user_id, family.id)),
            *(Delete((v["PK"], v["SK"])) for v in vouches[:90]),
        ]
    )


# 2. Vouches given -------------------------------------------------------------------


async def _vouches_given(ctx: Context, user_id: str, family_ids: tuple[str, ...]) -> None:
    for family_id in family_ids:
        found = await all_items(ctx.table, keys.family_pk(family_id), SortKey.begins_with(VOUCH_PREFIX))
        for item in found:
            if item.get("voucherId") != user_id:
                continue
            vouch = Vouch.from_item(item)
            try:
                await ctx.table.transact(
                    [
                        Delete(vouch.key, Exists()),
                        Update(
                            keys.member(family_id, vouch.user_id), add={"vouchScore": -1}, condition=Exists()
                        ),
                    ]
                )
            except TransactionCancelled as error:
                if error.failed_on(keys.member(family_id, vouch.user_id)):
                    await ctx.table.delete(vouch.key)  # the vouchee is gone: nothing to lower


# 3. Capsules created -----------------------------------------------------------------


async def _capsules_created(ctx: Context, user_id: str) -> None:
    for capsule in await footprint.capsules_created(ctx.table, user_id):
        for _ in range(ATTEMPTS):
            if await _capsule(ctx, user_id, capsule):
                break
            item = await ctx.table.get(capsule.key)
            if item is None:
                break
            capsule = Capsule.from_item(item)  # its status moved meanwhile


async def _capsule(ctx: Context, user_id: str, capsule: Capsule) -> bool:
    """True when the capsule is dealt with, False when it changed meanwhile."""
    wanted: list[Key] = [keys.family(capsule.family_id)]
    if capsule.content_id:
        wanted.append(keys.content(capsule.content_id))
    found = await ctx.table.batch_get(wanted)
    family = found.get(keys.family(capsule.family_id))
    content_item = found.get(keys.content(capsule.content_id)) if capsule.content_id else None
    content = Content.from_item(content_item) if content_item else None
    family_stays = family is not None and not family.get(DISSOLVING)
    if (
        capsule.status in KEPT_CAPSULES
        and family_stays
        and content is not None
        and content.status != ContentStatus.FAILED
    ):
        return True  # it opens for its recipients on its date
    if content is not None and content.author_id == user_id:
        await purge_content(ctx, content)
    ops: list[WriteOp] = [Delete(capsule.key, eq("status", capsule.status))]
    ops += [Delete(keys.recipient(capsule.id, person)) for person in capsule.recipient_ids]
    try:
        await ctx.table.transact(ops)
    except TransactionCancelled:
        return False
    return True


# 4. Capsules received ----------------------------------------------------------------


async def _capsules_received(ctx: Context, user_id: str) -> None:
    for recipient in await footprint.received(ctx.table, user_id):
        await _stop_receiving(ctx, recipient)


async def _stop_receiving(ctx: Context, recipient: Recipient) -> None:
    for _ in range(ATTEMPTS):
        item = await ctx.table.get(keys.capsule(recipient.capsule_id))
        ops: list[WriteOp] = [Delete(recipient.key)]
        if item is not None and recipient.user_id in (item.get("recipientIds") or []):
            before = list(item["recipientIds"])
            ops.append(
                Update(
                    keys.capsule(recipient.capsule_id),
                    set={"recipientIds": [person for person in before if person != recipient.user_id]},
                    condition=eq("recipientIds", before),
                )
            )
        try:
            await ctx.table.transact(ops)
            return
        except TransactionCancelled:
            continue  # another recipient left the list meanwhile: read it again
    raise Conflict("a capsule's recipients keep changing; try again")


# 5. Tags ------------------------------------------------------------------------------


async def _tags(ctx: Context, user_id: str) -> None:
    by_content: dict[str, list[Key]] = defaultdict(list)
    for tag in await footprint.tags_by(ctx.table, user_id):
        by_content[tag.content_id].append(tag.key)
    if not by_content:
        return
    found = await ctx.table.batch_get([keys.content(content_id) for content_id in by_content])
    for content_id, tag_keys in by_content.items():
        item = found.get(keys.content(content_id))
        if item is None:
            # Their content is gone, and its summary and markers with it.
            await ctx.table.batch_write(deletes=tag_keys)
        else:
            await tags.remove_author(ctx, Content.from_item(item), user_id)


# 6. What the person left in each family's feed -----------------------------------------


async def _family_feed(ctx: Context, user_id: str, family_id: str) -> bool:
    """Whether the family stays (it is neither gone nor dissolved)."""
    family = await ctx.table.get(keys.family(family_id))
    dissolving = family is not None and bool(family.get(DISSOLVING))
    async for contents in footprint.feed(ctx.table, family_id):
        if dissolving:
            # Nobody can ever read this family again: its feed goes, whoever wrote it.
            for content in contents:
                await purge_content(ctx, content)
            continue
        traces = await footprint.traces_in(ctx.table, user_id, contents)
        for content in traces.own:
            await purge_content(ctx, content)
        for comment in traces.comments:
            await _delete_comment(ctx, comment)
        for content, emojis in traces.reactors:
            await _remove_reactions(ctx, content, emojis, user_id)
    if dissolving:
        rest = await all_items(ctx.table, keys.family_pk(family_id))
        await ctx.table.batch_write(deletes=[(i["PK"], i["SK"]) for i in rest if i["SK"] != "META"])
        await ctx.table.delete(keys.family(family_id))
    return family is not None and not dissolving


async def _delete_comment(ctx: Context, comment: Comment) -> None:
    try:
        await ctx.table.transact(
            [
                Delete(comment.key, Exists()),
                Update(keys.content(comment.content_id), add={"commentCount": -1}, condition=Exists()),
            ]
        )
    except TransactionCancelled as error:
        if error.failed_on(keys.content(comment.content_id)):
            await ctx.table.delete(comment.key)  # its content is gone: nothing to count


async def _remove_reactions(ctx: Context, content: Content, emojis: list[str], user_id: str) -> None:
    """Each emoji leaves with its count, as `removeReaction` removes it; then
    the person's reactor item itself."""
    reactor = keys.reactor(content.id, user_id)
    for emoji in emojis:
        reaction = keys.reaction(content.id, emoji, user_id)
        try:
            await ctx.table.transact(
                [
                    Delete(reaction, Exists()),
                    Update(content.key, add={reaction_attr(emoji): -1}, condition=Exists()),
                    Update(reactor, remove=[REACTOR_ATTR + emoji], condition=Exists()),
                ]
            )
        except TransactionCancelled as error:
            if not (error.failed_on(reaction) or error.failed_on(content.key)):
                raise
            await ctx.table.delete(reaction)  # counted out before, or its content is gone
    await ctx.table.delete(reactor)


async def purge_content(ctx: Context, content: Content) -> None:
    """Deletes one content whoever may read it: blobs, comments, reactions,
    tags (markers adjusted) and the item. The item goes last but one, so a run
    that stops before it finds the content again in the feed; what arrives
    between (a comment racing the delete) is swept right after."""
    await ctx.services.blobs.delete(content.blob_keys())
    await _delete_children(ctx, content)
    for _ in range(ATTEMPTS):
        tag_ops = await tags.cleanup_ops(ctx, content)
        try:
            await ctx.table.transact([Delete(content.key, Exists()), *tag_ops])
            break
        except TransactionCancelled as error:
            if error.failed_on(content.key):
                break  # deleted by an earlier run
    await _delete_children(ctx, content)
    ctx.loaders.forget(content.key)


async def _delete_children(ctx: Context, content: Content) -> None:
    children = await all_items(ctx.table, keys.content_pk(content.id))
    # The tag summary leaves with the tags, in cleanup_ops's transaction.
    gone = [(i["PK"], i["SK"]) for i in children if i["SK"] not in ("META", keys.content_tags(content.id)[1])]
    if gone:
        await ctx.table.batch_write(deletes=gone)


# 7. The person's own partition ---------------------------------------------------------


async def _own_partition(ctx: Context, marker: AccountDeletion) -> None:
    """Everything under `USER#<id>` but the marker, and the export files. A
    profile made after the deletion began belongs to the person's fresh start
    (another run finished first and they signed in again): it stays."""
    # Notifications and their unread counters go first, together, so the counters
    # never outlive a notification they count (nor miss one written meanwhile).
    await notifications.delete_all(ctx.table, marker.user_id)
    found = await all_items(ctx.table, keys.user_pk(marker.user_id))
    files = [
        DataExport.from_item(item).blob_key
        for item in found
        if item["SK"].startswith(keys.EXPORT_PREFIX) and item.get("blobKey")
    ]
    if files:
        await ctx.services.blobs.delete([f for f in files if f])
    # The SNS endpoint of each app device goes before the device's item: a run
    # cut off in between deletes it again (SNS takes that as done), while the
    # other order would leave an endpoint no item leads back to.
    native = ctx.services.native_push
    devices = [PushDevice.from_item(item) for item in found if item["SK"].startswith(keys.PUSH_DEVICE_PREFIX)]
    endpoints = [device.sns_endpoint_arn for device in devices if device.sns_endpoint_arn]
    if native is not None and endpoints:
        await asyncio.gather(*(native.forget(arn) for arn in endpoints))
    fresh = keys.user(marker.user_id)
    gone: list[Key] = [
        (i["PK"], i["SK"])
        for i in found
        if (i["PK"], i["SK"]) != marker.key
        and not ((i["PK"], i["SK"]) == fresh and i.get("createdAt", "") > marker.started_at)
    ]
    if gone:
        await ctx.table.batch_write(deletes=gone)
