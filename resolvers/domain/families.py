"""Families and memberships: who may see and manage what, and how people get in."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from dataclasses import replace
from datetime import timedelta

from resolvers.core.context import Context
from resolvers.core.errors import BadInput, Conflict, Forbidden, RateLimited, not_found
from resolvers.core.pagination import ItemPage, query_page
from resolvers.core.validation import clean_text
from resolvers.domain import access, notifications
from resolvers.domain.access import READERS
from store import items, keys
from store.enums import Role, TrustLevel
from store.items import Family, Membership
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
    all_of,
    any_of,
    eq,
)

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
    return await _memberships(ctx, await _mirrors(ctx))


async def _mirrors(ctx: Context) -> list[items.UserFamily]:
    viewer = await ctx.viewer_id()
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
        return ItemPage([item] if item else [], [], False)
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
    family, _ = await admin_family(ctx, family_id)
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
                        condition=eq("inviteCode", family.invite_code),
                    ),
                ]
            )
        except TransactionCancelled as error:
            if error.failed_on(keys.invite(code)):
                continue
            raise Conflict("the invite code changed meanwhile; try again") from error
        ctx.loaders.forget(family.key)
        return replace(family, invite_code=code)
    raise Conflict("could not allocate an invite code; try again")


async def _check_not_blocked(ctx: Context, user_id: str) -> None:
    item = await ctx.table.get(keys.invite_guesses(user_id))
    if item is None:
        return
    guesses = items.InviteGuesses.from_item(item)
    if guesses.blocked_until and guesses.blocked_until > ctx.services.now_iso():
        raise RateLimited("too many wrong invite codes; wait a few minutes and try again")


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
    # Guessing is bounded per person and, across accounts, per client address.
    address = ctx.client_address()
    code = normalize_invite_code(invite_code)
    # The code is read beside the checks; it counts for nothing if they refuse.
    _, _, invite_item = await asyncio.gather(
        _check_not_blocked(ctx, viewer),
        ctx.services.rates.check(f"address:{address}", "join-address", ctx.services.now()),
        ctx.loaders.item.load(keys.invite(code)) if code else _nothing(),
    )
    if invite_item is None:
        await asyncio.gather(
            _record_wrong_code(ctx, viewer),
            ctx.services.rates.count(f"address:{address}", "join-address", ctx.services.now()),
        )
        raise BadInput("that invite code is not valid; check it with the family's admin")
    invite = items.Invite.from_item(invite_item)
    # Whom to tell of the join is read with the family (a member who leaves
    # meanwhile is told of it all the same, as a late notification would be).
    family, members = await asyncio.gather(
        load_family(ctx, invite.family_id), notifications.family_members(ctx.table, invite.family_id)
    )
    if family is None:
        raise BadInput("that invite code is not valid; check it with the family's admin")
    role = Role.MEMBER if family.trust_level == TrustLevel.OPEN else Role.PENDING
    membership = Membership(family.id, viewer, role, ctx.services.now_iso())
    notes = notifications.joined_notes(ctx, family, membership, members)
    join = ctx.table.transact(
        [
            Check(invite.key, eq("familyId", family.id)),
            *_join_ops(membership),
            Update(
                family.key,
                add={"memberCount": 1},
                # Families from before the count start counting at their next join.
                condition=any_of(NotExists("memberCount"), Compare("memberCount", "<", MAX_MEMBERS)),
            ),
        ]
    )
    try:
        # The addressees' unread epochs are read beside the join's write; the
        # notes are written once it has committed.
        _, prepared = await asyncio.gather(join, notifications.prepare(ctx.table, notes))
    except TransactionCancelled as error:
        if error.failed_on(membership.key) or error.failed_on(keys.user_family(viewer, family.id)):
            raise Conflict("you are already in this family") from error
        if error.failed_on(family.key):
            raise Conflict(f"this family is full: a family has at most {MAX_MEMBERS} members") from error
        raise BadInput("that invite code is not valid; check it with the family's admin") from error
    ctx.loaders.remember(membership.to_item())
    await notifications.write(ctx.table, notifications.broker_of(ctx), notes, prepared=prepared)
    return membership


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
        try:
            await ctx.table.transact(
                [
                    Put(vouch_item.to_item(), NotExists()),
                    Update(
                        target.key,
                        set={"role": Role.MEMBER} if promote else {},
                        add={"vouchScore": 1},
                        condition=all_of(eq("role", Role.PENDING), eq("vouchScore", target.vouch_score)),
                    ),
                ]
            )
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
        family, _ = await admin_family(ctx, family_id)
        target = await load_membership(ctx, family_id, user_id)
        if target is None:
            raise not_found("member")
        if target.role != Role.PENDING:
            raise Conflict("that member is not pending")
        members = await members_read
    finally:
        members_read.cancel()
    admit = Update(target.key, set={"role": Role.MEMBER}, condition=eq("role", Role.PENDING))
    updated = replace(target, role=Role.MEMBER)
    notes = notifications.admitted_notes(ctx, family, updated, members)
    try:
        # The addressees' unread epochs are read beside the write; they are told
        # once it has committed.
        _, prepared = await asyncio.gather(ctx.table.update(admit), notifications.prepare(ctx.table, notes))
    except ConditionFailed as error:
        raise Conflict("that member is not pending") from error
    ctx.loaders.forget(target.key)
    await notifications.write(ctx.table, notifications.broker_of(ctx), notes, prepared=prepared)
    return updated


async def _no_members() -> list[Membership]:
    return []


async def _leave(ctx: Context, family: Family, target: Membership) -> None:
    ops: list[WriteOp] = [
        Delete(target.key, eq("role", target.role)),
        Delete(keys.user_family(target.user_id, family.id)),
    ]
    if target.role == Role.ADMIN:
        # The admin count on the family item makes "never the last ADMIN" race-free.
        ops.append(
            Update(
                family.key,
                add={"adminCount": -1, "memberCount": -1},
                condition=Compare("adminCount", ">", 1),
            )
        )
    else:
        ops.append(Update(family.key, add={"memberCount": -1}, condition=Exists()))
    vouches = await ctx.table.query(
        keys.family_pk(family.id), SortKey.begins_with(keys.vouch_prefix(target.user_id))
    )
    ops += [Delete((v["PK"], v["SK"])) for v in vouches.items[:90]]
    try:
        await ctx.table.transact(ops)
    except TransactionCancelled as error:
        if error.failed_on(family.key):
            raise Conflict("the last ADMIN cannot leave or be removed") from error
        raise Conflict("the membership changed meanwhile; try again") from error
    ctx.loaders.forget(target.key, family.key)


# Deleting an account leaves each family this very way.
leave_as = _leave


async def remove_member(ctx: Context, family_id: str, user_id: str) -> bool:
    _ask_target(ctx, family_id, user_id)
    family, _ = await admin_family(ctx, family_id)
    target = await load_membership(ctx, family_id, user_id)
    if target is None:
        raise not_found("member")
    await _leave(ctx, family, target)
    return True


async def leave_family(ctx: Context, family_id: str) -> bool:
    family, me = await visible_family(ctx, family_id)
    await _leave(ctx, family, me)
    return True
