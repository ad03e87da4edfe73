"""Profiles: the viewer's own, and those of people they share a family with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resolvers.core.context import Context
from resolvers.core.errors import NotFound, not_found
from resolvers.core.validation import clean_text, clean_url
from resolvers.domain import push
from resolvers.domain.families import can_see_user
from resolvers.domain.mail import preference_changes
from store import keys
from store.items import User
from store.port import ConditionFailed, Exists, Update

MAX_NAME = 100


# What a person whose account was deleted reads as, where something of theirs
# stays (a sealed capsule opening for its recipients): their id and nothing else.
DELETED_USER_CREATED_AT = "1970-01-01T00:00:00.000000Z"


async def load_user(ctx: Context, user_id: str) -> User:
    item = await ctx.loaders.item.load(keys.user(user_id))
    if item is None:
        return User(id=user_id, created_at=DELETED_USER_CREATED_AT)
    return ctx.loaders.decoded(User, item)


def email_for_viewer(ctx: Context, user: User) -> str | None:
    """A person's email is theirs alone to read."""
    return user.email if ctx.claims is not None and ctx.claims.sub == user.id else None


def email_preference_for_viewer(ctx: Context, user: User) -> str | None:
    """What a person chose to receive by email is theirs alone to read, too."""
    return user.email_preference if ctx.claims is not None and ctx.claims.sub == user.id else None


def push_types_for_viewer(ctx: Context, user: User) -> tuple[str, ...] | None:
    """What is pushed to a person is theirs alone to read."""
    if ctx.claims is None or ctx.claims.sub != user.id:
        return None
    return push.push_types_of(user)


async def me(ctx: Context) -> User:
    viewer = await ctx.viewer_id()
    item = await ctx.loaders.item.load(keys.user(viewer))
    if item is None:
        # Deleted since this process last checked: a fresh profile, as at a first request.
        ctx.services.known_users.discard(viewer)
        ctx.loaders.forget(keys.user(viewer))
        viewer = await ctx.viewer_id()
        item = await ctx.loaders.item.load(keys.user(viewer))
        if item is None:
            raise NotFound("user not found")
    return User.from_item(item)


async def user(ctx: Context, user_id: str) -> User:
    if keys.usable_id(user_id):
        # Read beside the rule's first read; answered only if the rule allows it.
        ctx.loaders.ask(keys.user(user_id))
    if not keys.usable_id(user_id) or not await can_see_user(ctx, user_id):
        raise not_found("user")
    return await load_user(ctx, user_id)


async def _update_me(ctx: Context, changes: dict[str, Any], remove: list[str] | None = None) -> User:
    viewer = await ctx.viewer_id()
    try:
        item = await ctx.table.update(
            Update(keys.user(viewer), set=changes, remove=remove or [], condition=Exists())
        )
    except ConditionFailed as error:
        raise NotFound("user not found") from error
    ctx.loaders.remember(item)
    return User.from_item(item)


async def update_profile(
    ctx: Context,
    *,
    given_name: str | None = None,
    family_name: str | None = None,
    profile_image_url: str | None = None,
    email_preference: str | None = None,
    push_types: Sequence[str] | None = None,
) -> User:
    changes: dict[str, Any] = {}
    remove: list[str] = []
    if given_name is not None:
        changes["givenName"] = clean_text(given_name, "givenName", MAX_NAME)
    if family_name is not None:
        changes["familyName"] = clean_text(family_name, "familyName", MAX_NAME)
    if profile_image_url is not None:
        changes["profileImageUrl"] = clean_url(profile_image_url, "profileImageUrl")
    if email_preference is not None:
        # Against the profile as read now; two racing changes end with the last.
        mail_set, remove = preference_changes(await me(ctx), email_preference, ctx.services.now())
        changes.update(mail_set)
    if push_types is not None:
        changes["pushTypes"] = push.checked_push_types(push_types)
    if not changes and not remove:
        return await me(ctx)
    return await _update_me(ctx, changes, remove)


async def complete_onboarding(ctx: Context) -> User:
    return await _update_me(ctx, {"onboardingComplete": True})
