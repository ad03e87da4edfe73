"""Exporting one's data: asking for it, reading it, and what the
background job (`resolvers.processes.exports`) builds.

An export is a zip: `mifamilias.json` (the profile, memberships, the person's
content with its metadata and transcripts, their comments, reactions and tags,
the capsules they created and those they received that have opened, and their
notifications) and `media/<contentId>/original.<ext>` for each content of
theirs whose original is stored, with `media/<contentId>/captions.vtt` beside it
when it has a transcription. It is written to a temporary file, each media
file copied into it a chunk at a time, and the file is then stored in the blob
store, so the memory it takes does not grow with the media.

An export stays downloadable for `EXPORT_DAYS` after it is built; then the
expiry sweep deletes its file and its record. The record's TTL attribute is a
day later still, so DynamoDB never removes a record whose file the sweep has
not deleted yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mimetypes
import shutil
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from resolvers.core import leases
from resolvers.core.context import Context
from resolvers.core.errors import not_found
from resolvers.domain import access, footprint, notifications, push
from resolvers.domain.access import OPEN
from store import keys
from store.blobs import BlobNotFound, BlobStore
from store.enums import ContentStatus, ExportStatus
from store.items import (
    Capsule,
    Comment,
    Content,
    DataExport,
    Family,
    Membership,
    PushDevice,
    User,
    iso,
    parse_iso,
)
from store.port import (
    Condition,
    ConditionFailed,
    Exists,
    Item,
    NotExists,
    Put,
    SortKey,
    Table,
    Update,
    all_of,
    eq,
    pages,
)

EXPORT_DAYS = 7
# The record outlives its file by this much (see the module's docstring).
RECORD_GRACE = timedelta(days=1)
DOWNLOAD_URL_SECONDS = 15 * 60
MAX_ATTEMPTS = 3
FORMAT = "mifamilias-export/1"
DOCUMENT = "mifamilias.json"
CHUNK = 1 << 20


# Asking and reading ---------------------------------------------------------------


async def request_export(ctx: Context) -> DataExport:
    viewer = await ctx.viewer_id()
    await ctx.check_rate("export")
    now = ctx.services.now()
    export = DataExport(
        user_id=viewer,
        id=uuid.uuid4().hex,
        status=ExportStatus.PENDING,
        requested_at=iso(now),
        expires_at=_ttl(now + timedelta(days=EXPORT_DAYS)),
    )
    await ctx.counted("export", [Put(export.to_item(), NotExists())])
    ctx.services.exports.submit(viewer, export.id)
    return export


def _ttl(available_until: datetime) -> int:
    return int((available_until + RECORD_GRACE).timestamp())


def is_gone(export: DataExport, now: datetime) -> bool:
    """Past its time, whether or not the sweep has come by yet."""
    if export.available_until is not None and export.available_until <= iso(now):
        return True
    return export.expires_at <= now.timestamp()


async def load_export(ctx: Context, export_id: str) -> DataExport:
    """The viewer's own export; NOT_FOUND for anyone else's, and once it expired."""
    viewer = await ctx.viewer_id()
    if not keys.usable_id(export_id):
        raise not_found("export")
    item = await ctx.loaders.item.load(keys.data_export(viewer, export_id))
    export = DataExport.from_item(item) if item else None
    if export is None or is_gone(export, ctx.services.now()):
        raise not_found("export")
    return export


async def download_url(ctx: Context, export: DataExport) -> str | None:
    if export.status != ExportStatus.READY or not export.blob_key or not export.available_until:
        return None
    left = int((parse_iso(export.available_until) - ctx.services.now()).total_seconds())
    if left <= 0:
        return None
    return await ctx.services.blobs.download_url(export.blob_key, expires_in=min(DOWNLOAD_URL_SECONDS, left))


# The build's lease ------------------------------------------------------------------

# An export is built while it is PENDING (the lease spec's condition, in
# `resolvers.processes.exports`).
BUILDING = eq("status", ExportStatus.PENDING)
# How many times the previous format's builder claimed an export
# (`store.formats`); its lease had today's names already.
PREVIOUS_ATTEMPTS = "attempts"


def _held(owner: str) -> Condition:
    return all_of(BUILDING, leases.held_by(owner))


async def _finish(table: Table, export: DataExport, owner: str, **changes: Any) -> bool:
    """PENDING -> READY or FAILED, while this build still holds the export."""
    done = replace(export, **changes)
    fields = {name: value for name, value in done.to_item().items() if name not in ("PK", "SK", "type")}
    try:
        await table.update(Update(export.key, set={**fields, **leases.CLEARED}, condition=_held(owner)))
    except ConditionFailed:
        return False
    return True


async def fail(table: Table, export: DataExport, owner: str, now: datetime, reason: str) -> None:
    until = now + timedelta(days=EXPORT_DAYS)
    await _finish(
        table,
        export,
        owner,
        status=ExportStatus.FAILED,
        failure_reason=reason[:500],
        available_until=iso(until),
        expires_at=_ttl(until),
    )


# Building -------------------------------------------------------------------------------


async def build(
    table: Table,
    blobs: BlobStore,
    export: DataExport,
    owner: str,
    clock: Callable[[], datetime],
    workdir: Path,
) -> bool:
    """Writes the zip, stores it, and makes the export READY; False when the
    export was taken from this build meanwhile (its file is then removed)."""
    document, own = await collect(table, export.user_id, iso(clock()))
    archive = workdir / "export.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zipped:
        files = await _media(blobs, zipped, own, workdir)
        captions = await _captions(blobs, zipped, own, workdir)
        for entry in document["content"]:
            entry["file"] = files.get(entry["id"])
            entry["captionsFile"] = captions.get(entry["id"])
        text = json.dumps(document, ensure_ascii=False, indent=2, sort_keys=True)
        await asyncio.to_thread(zipped.writestr, DOCUMENT, text)
    # Each attempt writes its own file, so a build that lost its lease never
    # overwrites (or deletes) the file of the one that took over.
    blob_key = f"exports/{export.id}/{owner}.zip"
    await blobs.put_file(blob_key, archive, "application/zip")
    now = clock()
    until = now + timedelta(days=EXPORT_DAYS)
    if await _finish(
        table,
        export,
        owner,
        status=ExportStatus.READY,
        blob_key=blob_key,
        ready_at=iso(now),
        available_until=iso(until),
        expires_at=_ttl(until),
    ):
        return True
    await blobs.delete([blob_key])  # deleted with the account, or taken over
    return False


def _extension(mime_type: str) -> str:
    if mime_type == "text/plain":
        return ".txt"
    return mimetypes.guess_extension(mime_type) or ""


def _copy_into(zipped: zipfile.ZipFile, name: str, source: Path, when: str) -> None:
    moment = parse_iso(when)
    info = zipfile.ZipInfo(name, date_time=moment.timetuple()[:6])
    info.compress_type = zipfile.ZIP_STORED  # media is compressed already
    with source.open("rb") as reading, zipped.open(info, "w", force_zip64=True) as writing:
        shutil.copyfileobj(reading, writing, CHUNK)


async def _media(
    blobs: BlobStore, zipped: zipfile.ZipFile, own: list[Content], workdir: Path
) -> dict[str, str]:
    """Each original, fetched to a file and copied into the zip, one at a time."""
    files: dict[str, str] = {}
    scratch = workdir / "original"
    for content in own:
        if not content.s3_key or content.status == ContentStatus.UPLOADING:
            continue
        try:
            await blobs.fetch_to_file(content.s3_key, scratch)
        except BlobNotFound:
            continue
        name = f"media/{content.id}/original{_extension(content.mime_type)}"
        await asyncio.to_thread(_copy_into, zipped, name, scratch, content.created_at)
        scratch.unlink(missing_ok=True)
        files[content.id] = name
    return files


async def _captions(
    blobs: BlobStore, zipped: zipfile.ZipFile, own: list[Content], workdir: Path
) -> dict[str, str]:
    """Each transcription's captions, as `media/<contentId>/captions.vtt`."""
    files: dict[str, str] = {}
    scratch = workdir / "captions.vtt"
    for content in own:
        if not content.captions_key:
            continue
        try:
            await blobs.fetch_to_file(content.captions_key, scratch)
        except BlobNotFound:
            continue
        name = f"media/{content.id}/captions.vtt"
        await asyncio.to_thread(_copy_into, zipped, name, scratch, content.ready_at or content.created_at)
        scratch.unlink(missing_ok=True)
        files[content.id] = name
    return files


# What the document holds ---------------------------------------------------------------


async def collect(table: Table, user_id: str, now_iso: str) -> tuple[dict[str, Any], list[Content]]:
    """The document, and the person's content whose originals go with it."""
    family_ids = await footprint.family_ids(table, user_id)
    wanted = [keys.user(user_id)] + [keys.member(f, user_id) for f in family_ids]
    wanted += [keys.family(f) for f in family_ids]
    found = await table.batch_get(wanted)
    profile = found.get(keys.user(user_id))
    memberships = []
    for family_id in family_ids:
        membership = found.get(keys.member(family_id, user_id))
        family = found.get(keys.family(family_id))
        if membership is not None:
            memberships.append(_membership(Membership.from_item(membership), family))

    own: dict[str, Content] = {}
    comments: list[Comment] = []
    reactors: list[tuple[Content, list[str]]] = []
    for family_id in family_ids:
        async for contents in footprint.feed(table, family_id):
            traces = await footprint.traces_in(table, user_id, contents)
            own.update((content.id, content) for content in traces.own)
            comments += traces.comments
            reactors += traces.reactors

    created = await footprint.capsules_created(table, user_id)
    sealed = [keys.content(c.content_id) for c in created if c.content_id and c.content_id not in own]
    for sealed_item in (await table.batch_get(sealed)).values() if sealed else ():
        content = Content.from_item(sealed_item)
        if content.author_id == user_id:
            own[content.id] = content

    received = await footprint.received(table, user_id)
    opened_items = await table.batch_get([keys.capsule(r.capsule_id) for r in received]) if received else {}
    opened = []
    for recipient in received:
        item = opened_items.get(keys.capsule(recipient.capsule_id))
        if item is None or item.get("status") not in OPEN:
            continue
        # What the person may read now: not a capsule of a family they left.
        opening = Capsule.from_item(item)
        member_item = found.get(keys.member(opening.family_id, user_id))
        member = Membership.from_item(member_item) if member_item is not None else None
        if access.capsule_readable(opening, user_id, member):
            opened.append(_received(opening, recipient.viewed_at))

    # Read as the API shows them: a "mark everything read" since counts.
    epoch = await notifications.epoch_of(table, user_id)
    reaction_keys = [keys.reaction(c.id, e, user_id) for c, emojis in reactors for e in emojis]
    reacted = await table.batch_get(reaction_keys) if reaction_keys else {}
    contents = sorted(own.values(), key=lambda c: (c.created_at, c.id))
    document: dict[str, Any] = {
        "format": FORMAT,
        "exportedAt": now_iso,
        "user": _profile(User.from_item(profile)) if profile else {"id": user_id},
        "memberships": memberships,
        "content": [_content(content) for content in contents],
        "comments": [_comment(comment) for comment in sorted(comments, key=lambda c: (c.created_at, c.id))],
        "reactions": [
            {
                "contentId": content.id,
                "emoji": emoji,
                "createdAt": (reacted.get(keys.reaction(content.id, emoji, user_id)) or {}).get("createdAt"),
            }
            for content, emojis in reactors
            for emoji in emojis
        ],
        "tags": [
            {
                "contentId": tag.content_id,
                "familyId": tag.family_id,
                "value": tag.value,
                "setName": tag.set_name,
                "private": tag.private,
                "createdAt": tag.created_at,
            }
            for tag in await footprint.tags_by(table, user_id)
        ],
        "capsulesCreated": [_created(capsule) for capsule in created],
        "pushDevices": [_device(device) for device in await push.devices_of(table, user_id)],
        "capsulesReceived": opened,
        "notifications": [
            {
                "id": note.id,
                "type": note.type,
                "createdAt": note.created_at,
                "read": note.read_in(epoch),
                "familyId": note.family_id,
                "contentId": note.content_id,
                "capsuleId": note.capsule_id,
            }
            for note in await footprint.notifications_of(table, user_id)
        ],
    }
    return document, contents


def _device(device: PushDevice) -> dict[str, Any]:
    """A device the person receives pushes on: what it is and which push
    service, not its endpoint, keys or token, with which anyone holding the
    file could push to it."""
    service = urlsplit(device.endpoint).hostname if device.endpoint else None
    return {
        "id": device.id,
        "platform": device.platform,
        "name": device.name,
        "pushService": service,
        "createdAt": device.created_at,
        "updatedAt": device.updated_at,
        "lastPushedAt": device.last_pushed_at,
    }


def _profile(user: User) -> dict[str, Any]:
    return {
        "id": user.id,
        "email": user.email,
        "givenName": user.given_name,
        "familyName": user.family_name,
        "profileImageUrl": user.profile_image_url,
        "createdAt": user.created_at,
        "onboardingComplete": user.onboarding_complete,
    }


def _membership(membership: Membership, family: Item | None) -> dict[str, Any]:
    return {
        "familyId": membership.family_id,
        "familyName": Family.from_item(family).name if family else None,
        "role": membership.role,
        "joinedAt": membership.joined_at,
        "vouchScore": membership.vouch_score,
    }


def _content(content: Content) -> dict[str, Any]:
    return {
        "id": content.id,
        "familyId": content.family_id,
        "type": content.type,
        "status": content.status,
        "title": content.title,
        "mimeType": content.mime_type,
        "sizeBytes": content.size_bytes,
        "createdAt": content.created_at,
        "readyAt": content.ready_at,
        "capturedAt": content.captured_at,
        "capsuleId": content.capsule_id,
        "transcription": content.transcription,
        "transcriptLanguage": content.transcript_language,
        "commentCount": content.comment_count,
        "reactions": dict(sorted(content.reactions.items())),
        "file": None,
    }


def _comment(comment: Comment) -> dict[str, Any]:
    return {
        "id": comment.id,
        "contentId": comment.content_id,
        "body": comment.body,
        "createdAt": comment.created_at,
    }


def _created(capsule: Capsule) -> dict[str, Any]:
    return {
        "id": capsule.id,
        "familyId": capsule.family_id,
        "title": capsule.title,
        "unlockDate": capsule.unlock_date,
        "status": capsule.status,
        "createdAt": capsule.created_at,
        "recipientIds": list(capsule.recipient_ids),
        "contentId": capsule.content_id,
        "unlockedAt": capsule.unlocked_at,
    }


def _received(capsule: Capsule, viewed_at: str | None) -> dict[str, Any]:
    return {
        "id": capsule.id,
        "familyId": capsule.family_id,
        "creatorId": capsule.creator_id,
        "title": capsule.title,
        "unlockDate": capsule.unlock_date,
        "unlockedAt": capsule.unlocked_at,
        "status": capsule.status,
        "contentId": capsule.content_id,
        "viewedAt": viewed_at,
    }


# Expiry -----------------------------------------------------------------------------------


async def expire(table: Table, blobs: BlobStore, now: datetime) -> int:
    """Deletes the file, then the record, of every export past its time."""
    expired = 0
    async for found in pages(table, keys.EXPORTS_EXPIRY_PK, SortKey("<", iso(now)), index="GSI2"):
        for item in found:
            export = DataExport.from_item(item)
            if export.blob_key:
                await blobs.delete([export.blob_key])
            with contextlib.suppress(ConditionFailed):
                await table.delete(export.key, Exists())
                expired += 1
    return expired
