"""Families and memberships: who may see and manage what, and how people get in."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from dataclasses import replace
from datetime import datetime, timedelta

from resolvers.core.context import Context
from resolvers.core.errors import BadInput, Conflict, Forbidden, RateLimited, not_found
from resolvers.core.pagination import ItemPage, query_page
from resolvers.core.validation import clean_email, clean_text
from resolvers.domain import access, notifications
from resolvers.domain.access import READERS
from store import items, keys
from store.enums import FamilyEventType, MailState, PostingPolicy, Role, TrustLevel
from store.items import Family, FamilyEvent, FamilyInvite, Membership
from store.port import (
    Check,
    Compare,
    ConditionFailed,
    Delete,
    Exists,
    NotExists,
    Put,
    SortKey,
    TransactionCancelled,
    Update,
    WriteOp,
    all_items,
    all_of,
    any_of,
    eq,
)
from store.port import Condition as StoreCondition

TRUST_LEVELS = (TrustLevel.OPEN, TrustLevel.VOUCHED, TrustLevel.CLOSED)
MAX_FAMILY_NAME = 100
MAX_VOUCH_THRESHOLD = 100
# A family's size limit, kept by a count on the family item that each join
# raises under a condition: it also bounds a capsule's recipients.
MAX_MEMBERS = 1000

# People read codes aloud: no 0/O, 1/l/I. 31 symbols, 10 of them: 49 bits.
INVITE_ALPHABET = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"
INVITE_LENGTH = 10
WRONG_CODES_ALLOWED = 10
WRONG_CODE_WINDOW = timedelta(minutes=10)
WRONG_CODE_BLOCK = timedelta(minutes=15)
# An invite lasts at most this long; and `Family.invites` lists the newest this many.
MAX_INVITE_DAYS = 365
INVITES_LISTED = 100
MAX_EVENT_DETAIL = 200


def new_invite_code() -> str:
    code = "".join(secrets.choice(INVITE_ALPHABET) for _ in range(INVITE_LENGTH))
    return f"{code[:5]}-{code[5:]}"


def normalize_invite_code(text: str) -> str:
    raw = "".join(ch for ch in text.upper() if ch.isalnum())
    return f"{raw[:5]}-{raw[5:]}" if len(raw) == INVITE_LENGTH else raw


# Reading ----------------------------------------------------------------------


async def load_family(ctx: Context, family_id: str) -> Family | None:
    item = await ctx.loaders.item.load(keys.family(family_id))
    return Family.from_item(item) if item else None


async def load_membership(ctx: Context, family_id: str, user_id: str) -> Membership | None:
    item = await ctx.loaders.item.load(keys.member(family_id, user_id))
    return Membership.from_item(item) if item else None


async def viewer_membership(ctx: Context, family_id: str) -> Membership | None:
    return await load_membership(ctx, family_id, await ctx.viewer_id())


async def invite_code_for_viewer(ctx: Context, family: Family) -> str | None:
    """The invite code, for the family's ADMINs only."""
    membership = await viewer_membership(ctx, family.id)
    return family.invite_code if membership is not None and membership.role == Role.ADMIN else None


async def visible_family(ctx: Context, family_id: str) -> tuple[Family, Membership]:
    """The family and the viewer's membership, any role; NOT_FOUND to outsiders."""
    viewer = await ctx.viewer_id()
    if not keys.usable_id(family_id):
        raise not_found("family")
    # Both in one batch; the rule then reads the membership from the cache.
    family_item, _ = await ctx.loaders.many([keys.family(family_id), keys.member(family_id, viewer)])
    membership = await access.require_member(ctx, family_id)
    if family_item is None:
        raise not_found("family")
    return Family.from_item(family_item), membership


async def readable_family(ctx: Context, family_id: str) -> tuple[Family, Membership]:
    """Family content is for MEMBERs and ADMINs; a PENDING member is told they are waiting."""
    family, membership = await visible_family(ctx, family_id)
    if membership.role not in READERS:
        raise access.waiting_for_approval()
    return family, membership


async def admin_family(ctx: Context, family_id: str) -> tuple[Family, Membership]:
    family, membership = await visible_family(ctx, family_id)
    if membership.role != Role.ADMIN:
        raise Forbidden("only an ADMIN of this family can do that")
    return family, membership


async def my_memberships(ctx: Context) -> list[Membership]:
    mirrors = ctx.loaders.prefetched.pop(MY_FAMILIES, None)
    return await _memberships(ctx, mirrors if mirrors is not None else await _mirrors(ctx))


MY_FAMILIES = "my-families"


async def my_family_count(ctx: Context) -> int:
    """How many families the viewer is in: what `myFamilies` will list. The
    read is kept for `my_memberships`, so the operation makes it once."""
    # Before the operation runs: the token's subject, without making their profile (the resolver does).
    mirrors = await _mirrors(ctx, ctx.signed_in_id())
    ctx.loaders.prefetched[MY_FAMILIES] = mirrors
    return len(mirrors)


async def _mirrors(ctx: Context, viewer: str | None = None) -> list[items.UserFamily]:
    viewer = viewer or await ctx.viewer_id()
    page = await ctx.table.query(keys.user_pk(viewer), SortKey.begins_with(keys.USER_FAMILY_PREFIX))
    return [items.UserFamily.from_item(item) for item in page.items]


async def _memberships(ctx: Context, mirrors: list[items.UserFamily]) -> list[Membership]:
    viewer = await ctx.viewer_id()
    # The families come in the same batch: whoever asks for memberships next asks for them.
    wanted = [keys.member(m.family_id, viewer) for m in mirrors] + [keys.family(m.family_id) for m in mirrors]
    found = await ctx.loaders.many(wanted)
    return [Membership.from_item(item) for item in found[: len(mirrors)] if item is not None]


async def members_page(
    ctx: Context, family: Family, viewer: Membership, first: int, after: str | None
) -> ItemPage:
    if viewer.role not in READERS:
        # A PENDING member sees their own membership only.
        item = await ctx.loaders.item.load(viewer.key)
        if item is None:
            return ItemPage([], [], False)
        return ItemPage([item], [ctx.services.cursors.after(f"members:{family.id}", item, "table")], False)
    return await query_page(
        ctx,
        scope=f"members:{family.id}",
        pk=keys.family_pk(family.id),
        sk=SortKey.begins_with(keys.MEMBER_PREFIX),
        first=first,
        after=after,
    )


async def can_see_user(ctx: Context, user_id: str) -> bool:
    """Oneself, and anyone sharing a family in which the viewer is not PENDING."""
    viewer = await ctx.viewer_id()
    if user_id == viewer:
        return True
    mirrors = await _mirrors(ctx)
    # Their memberships of the viewer's families leave in the viewer's memberships' batch.
    ctx.loaders.ask(*(keys.member(m.family_id, user_id) for m in mirrors))
    mine = [m for m in await _memberships(ctx, mirrors) if m.role in READERS]
    theirs = await ctx.loaders.many([keys.member(m.family_id, user_id) for m in mine])
    return any(item is not None for item in theirs)


# The admins and their record ------------------------------------------------------


def is_admin_now(family: Family, user_id: str) -> StoreCondition:
    """On the family item, at write time: `user_id` is still one of its ADMINs."""
    if family.legacy_admins:
        # Written before co-admins: its creator is its one ADMIN until the first
        # change of its admins writes the ADMIN attributes.
        return all_of(eq("adminUserId", user_id), NotExists(keys.admin_attribute(user_id)))
    return Exists(keys.admin_attribute(user_id))


def _upgraded(family: Family, changes: dict[str, object]) -> dict[str, object]:
    """A family from before co-admins gets its creator's ADMIN attribute with
    the first change of its admins, so the attributes list every ADMIN after it."""
    if family.legacy_admins:
        return {keys.admin_attribute(family.admin_user_id): family.created_at, **changes}
    return changes


def event_put(
    ctx: Context,
    family_id: str,
    type_: str,
    actor_id: str,
    subject_id: str | None = None,
    detail: str | None = None,
) -> Put:
    """One entry of the admins' record, to be written in the change's own transaction."""
    event = FamilyEvent(
        family_id=family_id,
        id=uuid.uuid4().hex,
        type=type_,
        actor_id=actor_id,
        created_at=ctx.services.now_iso(),
        subject_id=subject_id,
        detail=detail[:MAX_EVENT_DETAIL] if detail else None,
    )
    return Put(event.to_item(), NotExists())


def admins_of(family: Family) -> list[str]:
    """The family's ADMINs, longest-standing first."""
    since = family.admin_since()
    return sorted(since, key=lambda user_id: (since[user_id], user_id))


async def is_viewer_admin(ctx: Context, family: Family) -> bool:
    membership = await viewer_membership(ctx, family.id)
    return membership is not None and membership.role == Role.ADMIN


async def activity_page(ctx: Context, family: Family, first: int, after: str | None) -> ItemPage:
    """The admins' record, newest first; an empty page for everyone but its ADMINs."""
    if not await is_viewer_admin(ctx, family):
        return ItemPage([], [], False)
    return await query_page(
        ctx,
        scope=f"activity:{family.id}",
        pk=keys.family_pk(family.id),
        sk=SortKey.begins_with(keys.FAMILY_EVENT_PREFIX),
        descending=True,
        first=first,
        after=after,
    )


# Creating and managing ----------------------------------------------------------


def _check_trust(trust_level: str, vouch_threshold: int) -> None:
    if trust_level not in TRUST_LEVELS:
        raise BadInput(f"trustLevel must be one of {', '.join(TRUST_LEVELS)}")
    if not 1 <= vouch_threshold <= MAX_VOUCH_THRESHOLD:
        raise BadInput(f"vouchThreshold must be between 1 and {MAX_VOUCH_THRESHOLD}")


def _join_ops(membership: Membership) -> list[WriteOp]:
    mirror = items.UserFamily(membership.user_id, membership.family_id, membership.joined_at)
    return [
        Put(membership.to_item(), NotExists()),
        Put(mirror.to_item(), NotExists()),
    ]


async def create_family(ctx: Context, name: str, trust_level: str, vouch_threshold: int) -> Family:
    viewer = await ctx.viewer_id()
    name = clean_text(name, "name", MAX_FAMILY_NAME)
    _check_trust(trust_level, vouch_threshold)
    now = ctx.services.now_iso()
    for _ in range(5):
        family = Family(
            id=uuid.uuid4().hex,
            name=name,
            admin_user_id=viewer,
            trust_level=trust_level,
            vouch_threshold=vouch_threshold,
            invite_code=new_invite_code(),
            created_at=now,
            admins={viewer: now},
        )
        family_item = family.to_item() | {"adminCount": 1, "memberCount": 1}
        ops: list[WriteOp] = [
            Put(family_item, NotExists()),
            Put(items.Invite(family.invite_code, family.id).to_item(), NotExists()),
            *_join_ops(Membership(family.id, viewer, Role.ADMIN, now)),
        ]
        try:
            await ctx.table.transact(ops)
        except TransactionCancelled as error:
            if error.failed_on(keys.invite(family.invite_code)):
                continue  # two families drew the same code: draw again
            raise
        ctx.loaders.remember(family_item)
        return family
    raise Conflict("could not allocate an invite code; try again")


async def rotate_invite_code(ctx: Context, family_id: str) -> Family:
    family, me = await admin_family(ctx, family_id)
    for _ in range(5):
        code = new_invite_code()
        try:
            await ctx.table.transact(
                [
                    Delete(keys.invite(family.invite_code), Exists()),
                    Put(items.Invite(code, family.id).to_item(), NotExists()),
                    Update(
                        family.key,
                        set={"inviteCode": code},
                        condition=all_of(
                            eq("inviteCode", family.invite_code), is_admin_now(family, me.user_id)
                        ),
                    ),
                    event_put(ctx, family.id, FamilyEventType.INVITE_CODE_ROTATED, me.user_id),
                ]
            )
        except TransactionCancelled as error:
            if error.failed_on(keys.invite(code)):
                continue
            raise Conflict("the invite code changed meanwhile; try again") from error
        ctx.loaders.forget(family.key)
        return replace(family, invite_code=code)
    raise Conflict("could not allocate an invite code; try again")


async def _own_guesses(ctx: Context, user_id: str) -> items.InviteGuesses | None:
    """The person's wrong codes of late; RATE_LIMITED while they are blocked."""
    item = await ctx.table.get(keys.invite_guesses(user_id))
    if item is None:
        return None
    guesses = items.InviteGuesses.from_item(item)
    if guesses.blocked_until and guesses.blocked_until > ctx.services.now_iso():
        raise RateLimited("too many wrong invite codes; wait a few minutes and try again")
    return guesses


def _guessed_lately(ctx: Context, guesses: items.InviteGuesses | None) -> bool:
    return (
        guesses is not None
        and guesses.count > 0
        and items.parse_iso(guesses.window_start) + WRONG_CODE_WINDOW >= ctx.services.now()
    )


async def _address_refusal(ctx: Context, address: str) -> RateLimited | None:
    """The refusal the client address's window of wrong codes calls for, if it is full."""
    try:
        await ctx.services.rates.check(f"address:{address}", "join-address", ctx.services.now())
    except RateLimited as refusal:
        return refusal
    return None


async def _record_wrong_code(ctx: Context, user_id: str) -> None:
    now = ctx.services.now()
    key = keys.invite_guesses(user_id)
    for _ in range(3):
        item = await ctx.table.get(key)
        current = items.InviteGuesses.from_item(item) if item else None
        fresh_window = current is None or items.parse_iso(current.window_start) + WRONG_CODE_WINDOW < now
        count = 1 if fresh_window or current is None else current.count + 1
        guesses = items.InviteGuesses(
            user_id=user_id,
            window_start=items.iso(now) if fresh_window or current is None else current.window_start,
            count=count,
            blocked_until=items.iso(now + WRONG_CODE_BLOCK) if count >= WRONG_CODES_ALLOWED else None,
        )
        condition = NotExists() if current is None else eq("count", current.count)
        try:
            await ctx.table.put(guesses.to_item(), condition)
            return
        except ConditionFailed:
            continue


async def join_family(ctx: Context, invite_code: str) -> Membership:
    viewer = await ctx.viewer_id()
    # Guessing is bounded per person first. Across accounts, a client address
    # has a much higher backstop, which never refuses a valid code to someone
    # with no wrong code of their own: a whole NAT shares an address. Past it,
    # a wrong code is refused, and so is anything from a person who has just
    # guessed wrong (a valid code must not tell them it is one).
    address = ctx.client_address()
    code = normalize_invite_code(invite_code)
    # The code is read beside the checks; it counts for nothing if they refuse.
    guesses, address_refusal, invite_item = await asyncio.gather(
        _own_guesses(ctx, viewer),
        _address_refusal(ctx, address),
        ctx.loaders.item.load(keys.invite(code)) if code else _nothing(),
    )
    if address_refusal is not None and (invite_item is None or _guessed_lately(ctx, guesses)):
        if invite_item is None:
            await _record_wrong_code(ctx, viewer)
        raise address_refusal
    if invite_item is None:
        await asyncio.gather(
            _record_wrong_code(ctx, viewer),
            ctx.services.rates.count(f"address:{address}", "join-address", ctx.services.now()),
        )
        raise BadInput("that invite code is not valid; check it with the family's admin")
    invite = items.Invite.from_item(invite_item)
    # An ADMIN's invite (its limits and count) joins the family's batch.
    if invite.invite_id is not None:
        ctx.loaders.ask(keys.family_invite(invite.family_id, invite.invite_id))
    # Whom to tell of the join is read with the family (a member who leaves
    # meanwhile is told of it all the same, as a late notification would be).
    family, members = await asyncio.gather(
        load_family(ctx, invite.family_id), notifications.family_members(ctx.table, invite.family_id)
    )
    if family is None:
        raise BadInput("that invite code is not valid; check it with the family's admin")
    now = ctx.services.now_iso()
    limited: FamilyInvite | None = None
    if invite.invite_id is not None:
        limited_item = await ctx.loaders.item.load(keys.family_invite(family.id, invite.invite_id))
        if limited_item is None:
            raise BadInput("that invite code is not valid; check it with the family's admin")
        limited = FamilyInvite.from_item(limited_item)
        reason = limited.refusal(now)
        if reason is not None:
            raise BadInput(reason)
    elif not family.invite_code_enabled:
        raise BadInput("this family's own invite code is turned off; ask its admin for an invite")
    role = Role.MEMBER if family.trust_level == TrustLevel.OPEN else Role.PENDING
    membership = Membership(family.id, viewer, role, now)
    notes = notifications.joined_notes(ctx, family, membership, members)
    family_condition: StoreCondition = any_of(
        NotExists("memberCount"), Compare("memberCount", "<", MAX_MEMBERS)
    )
    ops: list[WriteOp] = [Check(invite.key, eq("familyId", family.id)), *_join_ops(membership)]
    if limited is not None:
        ops.append(_use(limited, now))
    else:
        # The family code admits only while it is on, at the join's own moment.
        family_condition = all_of(
            family_condition, any_of(NotExists("inviteCodeEnabled"), eq("inviteCodeEnabled", True))
        )
    ops += [
        # Families from before the count start counting at their next join.
        Update(family.key, add={"memberCount": 1}, condition=family_condition),
        event_put(
            ctx,
            family.id,
            FamilyEventType.MEMBER_JOINED,
            viewer,
            viewer,
            f"with invite {invite_public_id(family.id, limited.id)}" if limited else "with the family's code",
        ),
    ]
    join = ctx.table.transact(ops)
    try:
        # The addressees' unread epochs are read beside the join's write; the
        # notes are written once it has committed.
        _, prepared = await asyncio.gather(join, notifications.prepare(ctx.table, notes))
    except TransactionCancelled as error:
        if error.failed_on(membership.key) or error.failed_on(keys.user_family(viewer, family.id)):
            raise Conflict("you are already in this family") from error
        if limited is not None and error.failed_on(limited.key):
            ctx.loaders.forget(limited.key)
            raise BadInput(await _why_refused(ctx, limited.key, now)) from error
        if error.failed_on(family.key):
            ctx.loaders.forget(family.key)
            again = await load_family(ctx, family.id)
            if limited is None and again is not None and not again.invite_code_enabled:
                raise BadInput(
                    "this family's own invite code is turned off; ask its admin for an invite"
                ) from error
            raise Conflict(f"this family is full: a family has at most {MAX_MEMBERS} members") from error
        raise BadInput("that invite code is not valid; check it with the family's admin") from error
    ctx.loaders.remember(membership.to_item())
    await notifications.write(ctx.table, notifications.broker_of(ctx), notes, prepared=prepared)
    return membership


def _use(invite: FamilyInvite, now: str) -> Update:
    """One use of an invite, counted only while it is still good: two people
    racing for its last use, one of them gets it."""
    conditions: list[StoreCondition] = [Exists(), eq("revokedAt", None)]
    if invite.max_uses is not None:
        conditions.append(Compare("uses", "<", invite.max_uses))
    if invite.ends_at is not None:
        conditions.append(Compare("endsAt", ">", now))
    return Update(invite.key, add={"uses": 1}, condition=all_of(*conditions))


async def _why_refused(ctx: Context, key: tuple[str, str], now: str) -> str:
    item = await ctx.table.get(key)
    reason = FamilyInvite.from_item(item).refusal(now) if item else None
    return reason or "that invite code is not valid; check it with the family's admin"


async def _nothing() -> None:
    return None


def _ask_target(ctx: Context, family_id: str, user_id: str) -> None:
    """The member acted on, asked for in the batch that reads the family and the
    viewer's membership for the rule."""
    if keys.usable_id(family_id) and keys.usable_id(user_id):
        ctx.loaders.ask(keys.member(family_id, user_id))


async def vouch(ctx: Context, family_id: str, user_id: str) -> Membership:
    _ask_target(ctx, family_id, user_id)
    family, me = await visible_family(ctx, family_id)
    if me.role not in READERS:
        raise Forbidden("only a MEMBER or ADMIN can vouch")
    if family.trust_level != TrustLevel.VOUCHED:
        raise Conflict("this family does not admit members by vouching")
    for _ in range(5):
        target = await load_membership(ctx, family_id, user_id)
        if target is None:
            raise not_found("member")
        if target.role != Role.PENDING:
            raise Conflict("that member is not pending")
        score = target.vouch_score + 1
        promote = score >= family.vouch_threshold
        vouch_item = items.Vouch(family_id, user_id, me.user_id, ctx.services.now_iso())
        ops: list[WriteOp] = [
            Put(vouch_item.to_item(), NotExists()),
            Update(
                target.key,
                set={"role": Role.MEMBER} if promote else {},
                add={"vouchScore": 1},
                condition=all_of(eq("role", Role.PENDING), eq("vouchScore", target.vouch_score)),
            ),
        ]
        if promote:
            ops.append(
                event_put(
                    ctx,
                    family_id,
                    FamilyEventType.MEMBER_APPROVED,
                    me.user_id,
                    user_id,
                    "by the vouch that reached the threshold",
                )
            )
        try:
            await ctx.table.transact(ops)
        except TransactionCancelled as error:
            if error.failed_on(vouch_item.key):
                raise Conflict("you have already vouched for this member") from error
            ctx.loaders.forget(target.key)
            continue  # another vouch landed first: read again
        ctx.loaders.forget(target.key)
        updated = replace(target, vouch_score=score, role=Role.MEMBER if promote else Role.PENDING)
        if promote:
            await notifications.member_admitted(ctx, family, updated)
        return updated
    raise Conflict("too many vouches at once; try again")


async def approve_member(ctx: Context, family_id: str, user_id: str) -> Membership:
    _ask_target(ctx, family_id, user_id)
    # Whom to tell is read beside the rule's reads (nothing of it is answered
    # unless the viewer may approve); the admitted member, PENDING or MEMBER,
    # is never among them.
    members_read = asyncio.ensure_future(
        notifications.family_members(ctx.table, family_id) if keys.usable_id(family_id) else _no_members()
    )
    try:
        family, me = await admin_family(ctx, family_id)
        target = await load_membership(ctx, family_id, user_id)
        if target is None:
            raise not_found("member")
        if target.role != Role.PENDING:
            raise Conflict("that member is not pending")
        members = await members_read
    finally:
        members_read.cancel()
    admit: list[WriteOp] = [
        Update(target.key, set={"role": Role.MEMBER}, condition=eq("role", Role.PENDING)),
        event_put(ctx, family_id, FamilyEventType.MEMBER_APPROVED, me.user_id, user_id),
    ]
    updated = replace(target, role=Role.MEMBER)
    notes = notifications.admitted_notes(ctx, family, updated, members)
    try:
        # The addressees' unread epochs are read beside the write; they are told
        # once it has committed.
        _, prepared = await asyncio.gather(ctx.table.transact(admit), notifications.prepare(ctx.table, notes))
    except TransactionCancelled as error:
        raise Conflict("that member is not pending") from error
    ctx.loaders.forget(target.key)
    await notifications.write(ctx.table, notifications.broker_of(ctx), notes, prepared=prepared)
    return updated


async def _no_members() -> list[Membership]:
    return []


class LastAdminLeaving(Conflict):
    """The one ADMIN of a family would leave it with nobody to run it."""


async def _leave(
    ctx: Context,
    family: Family,
    target: Membership,
    *,
    actor: str | None = None,
    successor: Membership | None = None,
    detail: str | None = None,
) -> None:
    """`target` leaves (or, with another `actor`, is removed): one transaction
    with the family's counts and the admins' record. An ADMIN leaves only while
    another remains, or with a `successor` (a MEMBER) who becomes ADMIN in the
    same transaction."""
    actor = actor or target.user_id
    ops: list[WriteOp] = [
        Delete(target.key, eq("role", target.role)),
        Delete(keys.user_family(target.user_id, family.id)),
    ]
    acting: StoreCondition = Exists() if actor == target.user_id else is_admin_now(family, actor)
    now = ctx.services.now_iso()
    if target.role == Role.ADMIN and successor is not None:
        ops += [
            Update(successor.key, set={"role": Role.ADMIN}, condition=eq("role", Role.MEMBER)),
            Update(
                family.key,
                set=_upgraded(family, {keys.admin_attribute(successor.user_id): now}),
                remove=[keys.admin_attribute(target.user_id)],
                add={"memberCount": -1},
                condition=all_of(Exists(), acting),
            ),
            event_put(
                ctx,
                family.id,
                FamilyEventType.ROLE_CHANGED,
                target.user_id,
                successor.user_id,
                "ADMIN, as successor",
            ),
        ]
    elif target.role == Role.ADMIN:
        # The admin count on the family item makes "never the last ADMIN" race-free.
        ops.append(
            Update(
                family.key,
                set=_upgraded(family, {}) if family.admin_user_id != target.user_id else {},
                remove=[keys.admin_attribute(target.user_id)],
                add={"adminCount": -1, "memberCount": -1},
                condition=all_of(Compare("adminCount", ">", 1), acting),
            )
        )
    else:
        ops.append(Update(family.key, add={"memberCount": -1}, condition=all_of(Exists(), acting)))
    if actor == target.user_id:
        ops.append(event_put(ctx, family.id, FamilyEventType.MEMBER_LEFT, actor, actor, detail))
    else:
        ops.append(event_put(ctx, family.id, FamilyEventType.MEMBER_REMOVED, actor, target.user_id, detail))
    vouches = await ctx.table.query(
        keys.family_pk(family.id), SortKey.begins_with(keys.vouch_prefix(target.user_id))
    )
    ops += [Delete((v["PK"], v["SK"])) for v in vouches.items[:90]]
    try:
        await ctx.table.transact(ops)
    except TransactionCancelled as error:
        ctx.loaders.forget(target.key, family.key)
        if successor is not None and error.failed_on(successor.key):
            raise BadInput("the successor must be a current MEMBER of this family") from error
        if error.failed_on(family.key) and target.role == Role.ADMIN and successor is None:
            raise LastAdminLeaving(
                "the last ADMIN cannot leave or be removed: name a successor (successorId, a current "
                "MEMBER) or make another member ADMIN first"
            ) from error
        raise Conflict("the membership changed meanwhile; try again") from error
    ctx.loaders.forget(target.key, family.key)
    if successor is not None:
        ctx.loaders.forget(successor.key)


async def leave_as(ctx: Context, family: Family, target: Membership, successor_id: str | None = None) -> None:
    """Deleting an account leaves each family this very way."""
    successor = await _successor(ctx, family, target, successor_id) if successor_id else None
    await _leave(ctx, family, target, successor=successor, detail="account deleted")


async def _successor(ctx: Context, family: Family, me: Membership, successor_id: str) -> Membership | None:
    """The MEMBER who becomes ADMIN as `me` leaves; None when none is needed
    (`me` is no ADMIN, or the successor is an ADMIN already)."""
    if not keys.usable_id(successor_id) or successor_id == me.user_id:
        raise BadInput("the successor must be another current MEMBER of this family")
    successor = await load_membership(ctx, family.id, successor_id)
    if successor is None or successor.role == Role.PENDING:
        raise BadInput("the successor must be a current MEMBER of this family")
    if me.role != Role.ADMIN or successor.role == Role.ADMIN:
        return None
    return successor


async def remove_member(ctx: Context, family_id: str, user_id: str) -> bool:
    _ask_target(ctx, family_id, user_id)
    family, me = await admin_family(ctx, family_id)
    target = await load_membership(ctx, family_id, user_id)
    if target is None:
        raise not_found("member")
    await _leave(ctx, family, target, actor=me.user_id)
    return True


async def leave_family(ctx: Context, family_id: str, successor_id: str | None = None) -> bool:
    if successor_id is not None:
        _ask_target(ctx, family_id, successor_id)
    family, me = await visible_family(ctx, family_id)
    successor = await _successor(ctx, family, me, successor_id) if successor_id is not None else None
    await _leave(ctx, family, me, successor=successor)
    return True


# Co-admins --------------------------------------------------------------------------


async def set_member_role(ctx: Context, family_id: str, user_id: str, role: str) -> Membership:
    """Any ADMIN makes a MEMBER an ADMIN or an ADMIN a MEMBER (themselves too).
    The family keeps an ADMIN: the demotion's write is conditioned on the count
    and on the actor still being one, so two ADMINs demoting each other at once
    leave one."""
    if role not in (Role.ADMIN, Role.MEMBER):
        raise BadInput("role must be ADMIN or MEMBER; PENDING is where joiners wait, not a role to give")
    _ask_target(ctx, family_id, user_id)
    family, me = await admin_family(ctx, family_id)
    target = await load_membership(ctx, family_id, user_id)
    if target is None:
        raise not_found("member")
    if target.role == Role.PENDING:
        raise Conflict("that member is still PENDING: approve them first")
    if target.role == role:
        return target
    attribute = keys.admin_attribute(user_id)
    acting = is_admin_now(family, me.user_id)
    if role == Role.ADMIN:
        change = Update(
            family.key,
            set=_upgraded(family, {attribute: ctx.services.now_iso()}),
            add={"adminCount": 1},
            condition=acting,
        )
    else:
        change = Update(
            family.key,
            set=_upgraded(family, {}) if family.admin_user_id != user_id else {},
            remove=[attribute],
            add={"adminCount": -1},
            condition=all_of(acting, Compare("adminCount", ">", 1)),
        )
    try:
        await ctx.table.transact(
            [
                Update(target.key, set={"role": role}, condition=eq("role", target.role)),
                change,
                event_put(ctx, family_id, FamilyEventType.ROLE_CHANGED, me.user_id, user_id, role),
            ]
        )
    except TransactionCancelled as error:
        ctx.loaders.forget(target.key, family.key)
        if error.failed_on(family.key):
            raise Conflict(
                "the family must keep at least one ADMIN, and only an ADMIN changes roles: "
                "the admins changed meanwhile"
            ) from error
        raise Conflict("that member's role changed meanwhile; try again") from error
    ctx.loaders.forget(target.key, family.key)
    return replace(target, role=role)


# Settings ----------------------------------------------------------------------------


async def update_settings(
    ctx: Context, family_id: str, *, posting_policy: str | None, invite_code_enabled: bool | None
) -> Family:
    family, me = await admin_family(ctx, family_id)
    changes: dict[str, object] = {}
    said: list[str] = []
    if posting_policy is not None and posting_policy != family.posting_policy:
        if posting_policy not in (PostingPolicy.EVERYONE, PostingPolicy.ADMINS):
            raise BadInput("postingPolicy must be EVERYONE or ADMINS")
        changes["postingPolicy"] = posting_policy
        said.append(f"postingPolicy {posting_policy}")
    if invite_code_enabled is not None and invite_code_enabled != family.invite_code_enabled:
        changes["inviteCodeEnabled"] = invite_code_enabled
        said.append(f"inviteCodeEnabled {str(invite_code_enabled).lower()}")
    if not changes:
        return family
    try:
        await ctx.table.transact(
            [
                Update(family.key, set=changes, condition=is_admin_now(family, me.user_id)),
                event_put(
                    ctx, family_id, FamilyEventType.SETTINGS_CHANGED, me.user_id, None, ", ".join(said)
                ),
            ]
        )
    except TransactionCancelled as error:
        ctx.loaders.forget(family.key)
        raise Conflict("you are no longer an ADMIN of this family") from error
    ctx.loaders.forget(family.key)
    return replace(
        family,
        posting_policy=posting_policy or family.posting_policy,
        invite_code_enabled=family.invite_code_enabled
        if invite_code_enabled is None
        else invite_code_enabled,
    )


def may_post_condition(family: Family, user_id: str) -> StoreCondition:
    """On the family item, at the upload's write: the setting lets this person post."""
    return any_of(
        NotExists("postingPolicy"), eq("postingPolicy", PostingPolicy.EVERYONE), is_admin_now(family, user_id)
    )


ADMINS_ONLY = "only ADMINs may post in this family: its admins chose so"


def check_may_post(family: Family, membership: Membership) -> None:
    if family.posting_policy == PostingPolicy.ADMINS and membership.role != Role.ADMIN:
        raise Forbidden(ADMINS_ONLY)


# Invites -------------------------------------------------------------------------------


def invite_public_id(family_id: str, invite_id: str) -> str:
    """What the API calls an invite: its family and itself, so that revoking
    it by id alone finds the family whose ADMINs may."""
    return f"{family_id}:{invite_id}"


def _parse_invite_id(public_id: str) -> tuple[str, str]:
    family_id, _, invite_id = public_id.partition(":")
    if not family_id or not invite_id or not keys.usable_id(public_id):
        raise not_found("invite")
    return family_id, invite_id


def _new_invite_id(now: datetime) -> str:
    # Time first, so that the family's invites list newest first by key.
    return f"{int(now.timestamp() * 1000):012x}{secrets.token_hex(6)}"


async def create_invite(
    ctx: Context,
    family_id: str,
    *,
    max_uses: int | None,
    expires_at: datetime | None,
    email: str | None,
) -> FamilyInvite:
    now = ctx.services.now()
    if max_uses is not None and not 1 <= max_uses <= MAX_MEMBERS:
        raise BadInput(f"maxUses must be between 1 and {MAX_MEMBERS}")
    ends_at: str | None = None
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise BadInput("expiresAt needs a time zone, e.g. 2027-01-31T20:00:00Z")
        if expires_at <= now:
            raise BadInput("expiresAt must be in the future")
        if expires_at > now + timedelta(days=MAX_INVITE_DAYS):
            raise BadInput(f"expiresAt must be within {MAX_INVITE_DAYS} days")
        ends_at = items.iso(expires_at)
    address = clean_email(email, "email") if email is not None else None
    if address is not None:
        # An invite with an address sends mail to someone outside the family:
        # bounded per person, so an account cannot mail strangers at will.
        _, (family, me) = await asyncio.gather(ctx.check_rate("invite-email"), admin_family(ctx, family_id))
    else:
        family, me = await admin_family(ctx, family_id)
    for _ in range(5):
        invite = FamilyInvite(
            family_id=family.id,
            id=_new_invite_id(now),
            code=new_invite_code(),
            created_by=me.user_id,
            created_at=items.iso(now),
            max_uses=max_uses,
            ends_at=ends_at,
            email=address,
            # Without SMTP nothing will send it: out of the mail outbox from the start.
            mail_state=MailState.SKIPPED if address and not ctx.services.settings.smtp_url else None,
        )
        ops: list[WriteOp] = [
            Put(items.Invite(invite.code, family.id, invite.id).to_item(), NotExists()),
            Put(invite.to_item(), NotExists()),
            Check(family.key, is_admin_now(family, me.user_id)),
            event_put(
                ctx,
                family.id,
                FamilyEventType.INVITE_CREATED,
                me.user_id,
                None,
                f"invite {invite_public_id(family.id, invite.id)}",
            ),
        ]
        try:
            if address is not None:
                await ctx.counted("invite-email", ops)
            else:
                await ctx.table.transact(ops)
        except TransactionCancelled as error:
            if error.failed_on(keys.invite(invite.code)):
                continue  # the code is taken: draw again
            ctx.loaders.forget(family.key)
            raise Conflict("you are no longer an ADMIN of this family") from error
        ctx.loaders.remember(invite.to_item())
        return invite
    raise Conflict("could not allocate an invite code; try again")


async def revoke_invite(ctx: Context, public_id: str) -> FamilyInvite:
    """Revoked for good (revoking twice changes nothing more); its code then
    answers that it was revoked."""
    family_id, invite_id = _parse_invite_id(public_id)
    ctx.loaders.ask(keys.family_invite(family_id, invite_id))
    family, me = await admin_family(ctx, family_id)
    item = await ctx.loaders.item.load(keys.family_invite(family_id, invite_id))
    if item is None:
        raise not_found("invite")
    invite = FamilyInvite.from_item(item)
    if invite.revoked_at is not None:
        return invite
    at = ctx.services.now_iso()
    try:
        await ctx.table.transact(
            [
                Update(invite.key, set={"revokedAt": at}, condition=all_of(Exists(), eq("revokedAt", None))),
                Check(family.key, is_admin_now(family, me.user_id)),
                event_put(
                    ctx,
                    family_id,
                    FamilyEventType.INVITE_REVOKED,
                    me.user_id,
                    None,
                    f"invite {invite_public_id(family_id, invite_id)}",
                ),
            ]
        )
    except TransactionCancelled as error:
        ctx.loaders.forget(invite.key, family.key)
        if error.failed_on(invite.key):
            return invite  # revoked meanwhile by another ADMIN: the same outcome
        raise Conflict("you are no longer an ADMIN of this family") from error
    ctx.loaders.forget(invite.key)
    return replace(invite, revoked_at=at)


async def invites_of(ctx: Context, family: Family) -> list[FamilyInvite]:
    """The newest invites, for the family's ADMINs; nothing for anyone else."""
    if not await is_viewer_admin(ctx, family):
        return []
    page = await ctx.table.query(
        keys.family_pk(family.id),
        SortKey.begins_with(keys.FAMILY_INVITE_PREFIX),
        descending=True,
        limit=INVITES_LISTED,
    )
    ctx.loaders.prime(page.items)
    return [FamilyInvite.from_item(item) for item in page.items]


async def family_invites(ctx: Context, family_id: str) -> list[FamilyInvite]:
    """Every invite of a family (for dissolving it)."""
    found = await all_items(
        ctx.table, keys.family_pk(family_id), SortKey.begins_with(keys.FAMILY_INVITE_PREFIX)
    )
    return [FamilyInvite.from_item(item) for item in found]
