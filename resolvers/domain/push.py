"""Push devices, what is pushed to them, and what a push says.

A device is a browser's Web Push subscription or an app's APNs or FCM token,
kept under its person's own partition (nobody else's request can name it),
with an id derived from its endpoint or token: registering the same one again
updates it. A person has at most `MAX_DEVICES`; the next one registered takes
the place of the one registered or refreshed longest ago (a browser that was
reinstalled never unregisters its old subscription, so the oldest is the one
most likely dead). A counter item moves with every add and removal, in the
same transaction, so racing registrations cannot pass the limit.

What is pushed is decided when it is sent (`resolvers/processes/pusher.py`):
the person's `pushTypes`, a family they muted, and whether they still read the
family then. The payload names the notification and says nothing sealed: a
capsule's push says it opened, never what it holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from resolvers.adapters import webpush
from resolvers.core.config import Settings
from resolvers.core.context import Context
from resolvers.core.errors import BadInput, not_found
from resolvers.core.validation import clean_optional
from resolvers.domain import access
from store import keys
from store.enums import DEFAULT_PUSH_TYPES, NotificationType, PushPlatform
from store.items import Membership, Notification, PushDevice, PushDeviceCount, User, iso
from store.port import (
    Compare,
    ConditionFailed,
    Delete,
    Exists,
    NotExists,
    Put,
    SortKey,
    Table,
    TransactionCancelled,
    Update,
    WriteOp,
    any_of,
)

MAX_DEVICES = 20
MAX_NAME = 100
MAX_TOKEN = 4096
ATTEMPTS = 5
# Several comments on one content within this long reach a device as one push.
COLLAPSE_SECONDS = 60


def device_id(platform: str, address: str) -> str:
    return hashlib.sha256(f"{platform}\0{address}".encode()).hexdigest()[:24]


def _refused(field: str, problem: str) -> BadInput:
    return BadInput(f"{field} {problem}", field=field)


async def devices_of(table: Table, user_id: str) -> list[PushDevice]:
    page = await table.query(keys.user_pk(user_id), SortKey.begins_with(keys.PUSH_DEVICE_PREFIX))
    return [PushDevice.from_item(item) for item in page.items]


@dataclass(frozen=True)
class DeviceInput:
    platform: str
    endpoint: str | None = None
    p256dh: str | None = None
    auth: str | None = None
    token: str | None = None
    name: str | None = None


def _local_push_hint(settings: Settings) -> str:
    """How to reach a push service on this machine, for a server that signs its
    own tokens (no JWKS: a development one): a real push service is out of reach
    offline, and a local one is refused until its origin is allowed."""
    if settings.jwks_url is not None:
        return ""
    return (
        "; while developing, a push service on this machine or network is reached by adding "
        "its origin (as http://localhost:8090) to MIFAMILIAS_PUSH_ALLOWED_ORIGINS"
    )


async def checked(ctx: Context, given: DeviceInput) -> DeviceInput:
    """The input as it will be stored, or BAD_USER_INPUT naming the field."""
    name = clean_optional(given.name, "name", MAX_NAME)
    settings = ctx.services.settings
    if given.platform == PushPlatform.WEB:
        if given.token is not None:
            raise _refused("token", "is for APNS and FCM devices; a browser gives endpoint, p256dh and auth")
        for field, value in (("endpoint", given.endpoint), ("p256dh", given.p256dh), ("auth", given.auth)):
            if not value:
                raise _refused(field, "is needed for a WEB device (from PushSubscription.toJSON())")
        assert given.endpoint and given.p256dh and given.auth
        for field, check in (("p256dh", webpush.check_p256dh), ("auth", webpush.check_auth)):
            try:
                check(getattr(given, field))
            except webpush.Refused as error:
                raise _refused(field, str(error)) from None
        try:
            await webpush.resolve(given.endpoint, settings.push_allowed_origins)
        except webpush.Refused as error:
            raise _refused("endpoint", f"{error}{_local_push_hint(settings)}") from None
        return replace(given, name=name, p256dh=given.p256dh.strip(), auth=given.auth.strip())
    arn = settings.sns_apns_arn if given.platform == PushPlatform.APNS else settings.sns_fcm_arn
    if arn is None or ctx.services.native_push is None:
        raise _refused("platform", f"{given.platform}: native push is not configured on this server")
    if given.endpoint is not None or given.p256dh is not None or given.auth is not None:
        raise _refused("endpoint", "is for WEB devices; an app gives its device token")
    token = (given.token or "").strip()
    if not token:
        raise _refused("token", f"is needed for an {given.platform} device")
    if len(token) > MAX_TOKEN or not token.isascii() or not token.isprintable() or " " in token:
        raise _refused("token", "is not a device token")
    return replace(given, token=token, name=name)


async def register(ctx: Context, given: DeviceInput) -> PushDevice:
    viewer = await ctx.viewer_id()
    device = await checked(ctx, given)
    address = device.endpoint if device.platform == PushPlatform.WEB else device.token
    assert address is not None
    now = ctx.services.now_iso()
    record = PushDevice(
        user_id=viewer,
        id=device_id(device.platform, address),
        platform=device.platform,
        created_at=now,
        updated_at=now,
        name=device.name,
        endpoint=device.endpoint,
        p256dh=device.p256dh,
        auth=device.auth,
        token=device.token,
    )
    native = ctx.services.native_push
    for _ in range(ATTEMPTS):
        mine = await devices_of(ctx.table, viewer)
        same = next((d for d in mine if d.id == record.id), None)
        if same is not None:
            # Registered again: pushed to again if its push service had let it go.
            updated = replace(
                record,
                created_at=same.created_at,
                sns_endpoint_arn=same.sns_endpoint_arn,
                last_pushed_at=same.last_pushed_at,
                last_delivery_at=same.last_delivery_at,
                last_delivery_status=same.last_delivery_status,
                last_delivery_error=same.last_delivery_error,
            )
            if native is not None and updated.token and updated.sns_endpoint_arn is None:
                updated = replace(
                    updated,
                    sns_endpoint_arn=await native.endpoint_for(updated.platform, updated.token, viewer),
                )
            try:
                await ctx.table.put(updated.to_item(), Exists())
            except ConditionFailed:
                continue  # unregistered meanwhile: registered anew
            return updated
        fresh = record
        if native is not None and fresh.token:
            fresh = replace(
                fresh, sns_endpoint_arn=await native.endpoint_for(fresh.platform, fresh.token, viewer)
            )
        ops: list[WriteOp] = [Put(fresh.to_item(), NotExists())]
        counter = PushDeviceCount(viewer)
        if len(mine) < MAX_DEVICES:
            ops.append(
                Update(
                    counter.key,
                    set={"type": PushDeviceCount.item_type(), "userId": viewer},
                    add={"count": 1},
                    condition=any_of(NotExists(), Compare("count", "<", MAX_DEVICES)),
                )
            )
            evicted = None
        else:
            evicted = min(mine, key=lambda d: (d.updated_at, d.id))
            ops.append(Delete(evicted.key, Exists()))
        try:
            await ctx.table.transact(ops)
        except TransactionCancelled:
            continue  # another registration or removal raced this one: read again
        if evicted is not None and native is not None and evicted.sns_endpoint_arn:
            await native.forget(evicted.sns_endpoint_arn)
        return fresh
    raise BadInput("your devices keep changing; try again")


async def my_devices(ctx: Context) -> list[PushDevice]:
    found = await devices_of(ctx.table, await ctx.viewer_id())
    return sorted(found, key=lambda d: (d.created_at, d.id))


async def remove(table: Table, device: PushDevice) -> bool:
    """The device goes, and its person's count with it; False if it was gone."""
    try:
        await table.transact(
            [
                Delete(device.key, Exists()),
                Update(keys.push_device_count(device.user_id), add={"count": -1}, condition=Exists()),
            ]
        )
    except TransactionCancelled:
        return False
    return True


async def unregister(ctx: Context, device: str) -> bool:
    """Only a device of the viewer's own can be named; False for any other id."""
    viewer = await ctx.viewer_id()
    if not keys.usable_id(device):
        return False
    item = await ctx.table.get(keys.push_device(viewer, device))
    if item is None:
        return False
    found = PushDevice.from_item(item)
    gone = await remove(ctx.table, found)
    native = ctx.services.native_push
    if gone and native is not None and found.sns_endpoint_arn:
        await native.forget(found.sns_endpoint_arn)
    return gone


# Choices -----------------------------------------------------------------------------


def push_types_of(user: User) -> tuple[str, ...]:
    return user.push_types if user.push_types is not None else tuple(DEFAULT_PUSH_TYPES)


def checked_push_types(chosen: Sequence[str]) -> list[str]:
    known = set(NotificationType)
    unknown = [kind for kind in chosen if kind not in known]
    if unknown:
        raise _refused("pushTypes", f"holds unknown types: {', '.join(unknown)}")
    return list(dict.fromkeys(chosen))


async def mute_family(ctx: Context, family_id: str, until: datetime | None) -> bool:
    """Nothing of the family is pushed to the viewer until `until`; None (or a
    moment past) unmutes. Only a member's own membership changes."""
    viewer = await ctx.viewer_id()
    await access.require_member(ctx, family_id)
    key = keys.member(family_id, viewer)
    changes = (
        Update(key, set={"pushMutedUntil": iso(until)}, condition=Exists())
        if until is not None and until > ctx.services.now()
        else Update(key, remove=["pushMutedUntil"], condition=Exists())
    )
    try:
        await ctx.table.update(changes)
    except ConditionFailed:
        raise not_found("family") from None
    return True


def muted(membership: Membership, now: datetime) -> bool:
    return membership.push_muted_until is not None and membership.push_muted_until > iso(now)


# What a push says ----------------------------------------------------------------------

TITLES = {
    NotificationType.CAPSULE_UNLOCKED: "A time capsule opened for you",
    NotificationType.NEW_COMMENT: "New comment on your post",
    NotificationType.NEW_CONTENT: "Something new in your family",
    NotificationType.MEMBER_JOINED: "Someone joined your family",
    NotificationType.MEMBER_PENDING: "Someone is waiting to join your family",
    NotificationType.CAPSULE_EMPTY: "A time capsule of yours had nothing in it",
}


@dataclass(frozen=True)
class Push:
    """What one notification says on a device. `body` names the family only:
    never a title, a comment or anything sealed (native payloads are not
    end-to-end encrypted, and the same words go to both)."""

    id: str
    type: str
    family_id: str | None
    title: str
    body: str
    urgency: str
    ttl: int
    collapse: str | None

    def web_payload(self) -> bytes:
        return json.dumps(
            {
                "id": self.id,
                "type": self.type,
                "familyId": self.family_id,
                "title": self.title,
                "body": self.body,
            },
            separators=(",", ":"),
        ).encode()


def push_for(note: Notification, public_id: str, family_name: str | None) -> Push:
    kind = NotificationType(note.type)
    body = f"In {family_name}" if family_name else "Open MiFamilias to see it"
    opening = kind == NotificationType.CAPSULE_UNLOCKED
    collapse = None
    if kind == NotificationType.NEW_COMMENT and note.content_id:
        # One topic per content: a push service keeps only the newest of those it
        # has not delivered yet (RFC 8030 5.4); the pusher also holds a device's
        # next comment push on the content for a minute.
        collapse = hashlib.sha256(f"comments\0{note.content_id}".encode()).hexdigest()[:32]
    return Push(
        id=public_id,
        type=kind,
        family_id=note.family_id,
        title=TITLES.get(kind, "MiFamilias"),
        body=body,
        urgency="high" if opening else "normal",
        # A capsule's opening waits for a device four weeks; news, a day.
        ttl=28 * 86400 if opening else 86400,
        collapse=collapse,
    )


async def web_push_public_key(ctx: Context) -> str | None:
    sender = ctx.services.web_push
    return sender.public_key if sender is not None else None
