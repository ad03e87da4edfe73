"""Content: uploads, reading rules, the feed, comments, reactions and the
moves of its state machine that people make (the pipeline makes the rest)."""

from __future__ import annotations

import asyncio
import secrets
import unicodedata
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import emoji as emoji_data

from resolvers.adapters.broker import content_channel, publish_in_turn
from resolvers.core.context import Context
from resolvers.core.errors import BadInput, Conflict, Forbidden, not_found
from resolvers.core.pagination import ItemPage, query_page
from resolvers.core.ports import EventBus
from resolvers.core.validation import clean_mime_type, clean_optional, clean_text
from resolvers.domain import access, families, notifications, tags
from store import keys
from store.blobs import BlobNotFound, BlobStore, Part, PartsChanged
from store.enums import CapsuleStatus, ContentStatus, ContentType, Role
from store.items import (
    IN_PIPELINE,
    Capsule,
    Comment,
    Content,
    Membership,
    Reaction,
    iso,
    reaction_attr,
)
from store.port import (
    MAX_TRANSACTION_ITEMS,
    Check,
    ConditionFailed,
    Delete,
    Exists,
    Item,
    NotExists,
    Put,
    SortKey,
    TransactionCancelled,
    Update,
    WriteOp,
    all_of,
    eq,
    op_key,
)

MIME_PREFIX: dict[str, str] = {
    ContentType.VIDEO: "video/",
    ContentType.AUDIO: "audio/",
    ContentType.PHOTO: "image/",
    ContentType.TEXT: "text/",
}
MAX_TITLE = 200
MAX_COMMENT = 2000
UPLOAD_URL_SECONDS = 15 * 60
MEDIA_URL_SECONDS = 10 * 60
REACTOR_ATTR = "E#"


# Services this module needs beyond the table ---------------------------------------


def blobs_of(ctx: Context) -> BlobStore:
    return ctx.services.blobs


def broker_of(ctx: Context) -> EventBus | None:
    return notifications.broker_of(ctx)


def original_key(content: Content) -> str:
    return f"content/{content.id}/original"


async def publish_status(broker: EventBus | None, content: Content, was: str) -> None:
    """After the move from status `was` to `content.status` is committed: best
    effort, and in the order of this process's commits (`publish_in_turn`)."""
    # The id lets the subscribers of one change share its reads; `was` lets a
    # stream that read the status tell a move from it from one that came
    # before its read (`live.content_status`).
    event = {
        "kind": "content",
        "contentId": content.id,
        "status": content.status,
        "was": was,
        "eventId": uuid.uuid4().hex,
    }
    await publish_in_turn(broker, content_channel(content.id), event)


# Reading ----------------------------------------------------------------------


is_sealed = access.is_sealed


# Reading content goes through the read rule's own module; named here too,
# since most callers think of it as content's.
load_content = access.load_content
readable_content = access.readable_content


async def _readable_within_rate(ctx: Context, content_id: str, action: str) -> tuple[Content, Membership]:
    """The content, read beside the viewer's rate limit for `action`."""
    _, found = await asyncio.gather(ctx.check_rate(action), readable_content(ctx, content_id))
    return found


async def media_url(ctx: Context, content: Content, which: str) -> str | None:
    if content.status not in (ContentStatus.READY, ContentStatus.DELIVERED):
        return None
    key = {"media": content.media_key, "thumbnail": content.thumbnail_key, "captions": content.captions_key}[
        which
    ]
    if key is None:
        return None
    return await blobs_of(ctx).download_url(key, expires_in=MEDIA_URL_SECONDS)


async def viewer_reactions(ctx: Context, content: Content) -> list[str]:
    viewer = await ctx.viewer_id()
    item = await ctx.loaders.item.load(keys.reactor(content.id, viewer))
    if item is None:
        return []
    return sorted(name[len(REACTOR_ATTR) :] for name in item if name.startswith(REACTOR_ATTR))


async def feed_page(ctx: Context, family_id: str, first: int, after: str | None) -> ItemPage:
    await families.readable_family(ctx, family_id)
    page = await query_page(
        ctx,
        scope=f"feed:{family_id}",
        pk=keys.family_pk(family_id),
        sk=SortKey.begins_with(keys.FEED_PREFIX),
        index="GSI1",
        descending=True,
        first=first,
        after=after,
    )
    return await access.readable_page(ctx, page, Content)


# Uploads ----------------------------------------------------------------------


@dataclass(frozen=True)
class PartTarget:
    number: int
    url: str
    size_bytes: int


@dataclass(frozen=True)
class UploadTarget:
    """Where a client sends an upload's bytes: one PUT to `url`, or, for an
    upload in parts, a PUT per part still missing (`parts`; `url` is part 1's)."""

    content: Content
    url: str
    expires_at: datetime
    part_size_bytes: int | None = None
    parts: tuple[PartTarget, ...] | None = None
    received_parts: tuple[int, ...] | None = None


def part_sizes(size_bytes: int, part_size: int) -> list[int]:
    """The size of each part, in order: all `part_size` but the last."""
    count = -(-size_bytes // part_size)
    return [part_size] * (count - 1) + [size_bytes - part_size * (count - 1)]


def _numbers(numbers: list[int]) -> str:
    """1, 2, 3, 5 -> "1-3, 5"."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and runs[-1][-1] == number - 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


async def _upload_target(
    ctx: Context, content: Content, received: tuple[int, ...] | None = None
) -> UploadTarget:
    """Fresh URLs: the single PUT's, or those of every part not in `received`."""
    blobs = blobs_of(ctx)
    key = original_key(content)
    expires_at = ctx.services.now() + timedelta(seconds=UPLOAD_URL_SECONDS)
    if content.upload_id is None or content.part_size_bytes is None:
        url = await blobs.upload_url(
            key, content_type=content.mime_type, size_bytes=content.size_bytes, expires_in=UPLOAD_URL_SECONDS
        )
        return UploadTarget(content, url, expires_at)
    received = received or ()
    upload_id = content.upload_id

    async def target(number: int, size: int) -> PartTarget:
        url = await blobs.part_url(key, upload_id, number, size_bytes=size, expires_in=UPLOAD_URL_SECONDS)
        return PartTarget(number, url, size)

    sizes = part_sizes(content.size_bytes, content.part_size_bytes)
    wanted = [(n, size) for n, size in enumerate(sizes, start=1) if n == 1 or n not in received]
    made = {p.number: p for p in await asyncio.gather(*(target(n, size) for n, size in wanted))}
    # The contract makes uploadUrl non-null: for an upload in parts it is part 1's.
    return UploadTarget(
        content,
        made[1].url,
        expires_at,
        part_size_bytes=content.part_size_bytes,
        parts=tuple(made[n] for n, _ in wanted if n not in received),
        received_parts=received,
    )


def _check_upload(settings_max: int, content_type: str, mime_type: str, size_bytes: int) -> str:
    prefix = MIME_PREFIX.get(content_type)
    if prefix is None:
        raise BadInput("type must be one of VIDEO, AUDIO, PHOTO, TEXT")
    mime = clean_mime_type(mime_type)
    if not mime.startswith(prefix):
        raise BadInput(f"a {content_type} upload needs a {prefix}* MIME type, not {mime!r}")
    if not 1 <= size_bytes <= settings_max:
        raise BadInput(f"sizeBytes must be between 1 and {settings_max}")
    return mime


async def create_upload(
    ctx: Context,
    *,
    family_id: str,
    content_type: str,
    mime_type: str,
    size_bytes: int,
    title: str | None,
    capsule_id: str | None,
) -> UploadTarget:
    viewer = await ctx.viewer_id()
    settings = ctx.services.settings
    mime = _check_upload(settings.max_upload_bytes, content_type, mime_type, size_bytes)
    title = clean_optional(title, "title", MAX_TITLE)
    _, (family, membership) = await asyncio.gather(
        ctx.check_rate("upload"), families.readable_family(ctx, family_id)
    )
    families.check_may_post(family, membership)
    capsule: Capsule | None = None
    if capsule_id is not None:
        capsule = await _capsule_for_upload(ctx, capsule_id, family_id, viewer)
    content = Content(
        id=uuid.uuid4().hex,
        family_id=family_id,
        author_id=viewer,
        type=content_type,
        status=ContentStatus.UPLOADING,
        mime_type=mime,
        size_bytes=size_bytes,
        created_at=ctx.services.now_iso(),
        title=title,
        capsule_id=capsule_id,
        in_feed=capsule is None,
    )
    content = replace(content, s3_key=original_key(content))
    blobs = blobs_of(ctx)
    if size_bytes > settings.multipart_threshold_bytes:
        upload_id = await blobs.start_multipart(original_key(content), content_type=mime)
        content = replace(content, upload_id=upload_id, part_size_bytes=settings.multipart_part_bytes)
    ops: list[WriteOp] = [
        Put(content.to_item(), NotExists()),
        # Who may post is the family's setting at the write, not at the read.
        Check(family.key, families.may_post_condition(family, viewer)),
    ]
    if capsule is not None:
        ops.append(
            Update(
                capsule.key,
                set={"contentId": content.id},
                condition=all_of(eq("status", CapsuleStatus.SCHEDULED), eq("contentId", None)),
            )
        )
    try:
        await ctx.counted("upload", ops)
    except TransactionCancelled as error:
        if content.upload_id is not None:
            await blobs.abort_multipart(original_key(content), content.upload_id)
        if error.failed_on(family.key):
            ctx.loaders.forget(family.key)
            raise Forbidden(families.ADMINS_ONLY) from error
        raise Conflict("the capsule already has its content or is no longer SCHEDULED") from error
    return await _upload_target(ctx, content, ())


async def resume_upload(ctx: Context, content_id: str) -> UploadTarget:
    """The author, while UPLOADING: fresh URLs for what has not arrived. For an
    upload in parts, the parts that arrived whole are listed and skipped; one
    whose parts were dropped (abandoned for `ABANDONED_UPLOAD_DAYS`) starts again."""
    content = await _own_content(ctx, content_id)
    if content.status != ContentStatus.UPLOADING:
        raise Conflict(f"the upload is already complete (status {content.status})")
    if content.upload_id is None or content.part_size_bytes is None:
        return await _upload_target(ctx, content)
    blobs = blobs_of(ctx)
    key = original_key(content)
    sizes = part_sizes(content.size_bytes, content.part_size_bytes)
    found = await blobs.uploaded_parts(key, content.upload_id)
    if found is None:
        if await blobs.head(key) == content.size_bytes:
            # Assembled by a completion whose status change did not land: completing again finishes it.
            return await _upload_target(ctx, content, tuple(range(1, len(sizes) + 1)))
        content = await _restart_multipart(ctx, content)
        found = []
    received = tuple(p.number for p in found if p.number <= len(sizes) and p.size == sizes[p.number - 1])
    return await _upload_target(ctx, content, received)


async def _restart_multipart(ctx: Context, content: Content) -> Content:
    blobs = blobs_of(ctx)
    key = original_key(content)
    upload_id = await blobs.start_multipart(key, content_type=content.mime_type)
    try:
        item = await ctx.table.update(
            Update(
                content.key,
                set={"uploadId": upload_id},
                condition=all_of(eq("status", ContentStatus.UPLOADING), eq("uploadId", content.upload_id)),
            )
        )
    except ConditionFailed as error:
        await blobs.abort_multipart(key, upload_id)
        raise Conflict("the upload changed meanwhile; ask again") from error
    ctx.loaders.remember(item)
    return Content.from_item(item)


async def _assemble_parts(ctx: Context, content: Content, upload_id: str, part_size: int) -> None:
    """Checks that every part arrived whole, then has the blob store assemble
    them into the original. Refusals change nothing."""
    blobs = blobs_of(ctx)
    key = original_key(content)
    found = await blobs.uploaded_parts(key, upload_id)
    if found is None:
        return  # assembled already, or dropped: the size check that follows tells which
    sizes = part_sizes(content.size_bytes, part_size)
    by_number = {p.number: p for p in found}
    missing = [n for n in range(1, len(sizes) + 1) if n not in by_number]
    if missing:
        raise BadInput(
            f"part(s) {_numbers(missing)} of {len(sizes)} have not arrived; "
            "resumeUpload gives fresh URLs for them"
        )
    parts: list[Part] = [by_number[n] for n in range(1, len(sizes) + 1)]
    wrong = [p.number for p in parts if p.size != sizes[p.number - 1]]
    if wrong:
        total = sum(p.size for p in parts)
        first = by_number[wrong[0]]
        raise BadInput(
            f"the parts hold {total} bytes, but {content.size_bytes} were announced: part "
            f"{first.number} has {first.size} bytes, not {sizes[first.number - 1]}; send part(s) "
            f"{_numbers(wrong)} again (resumeUpload gives fresh URLs for them)"
        )
    try:
        await blobs.complete_multipart(key, upload_id, parts)
    except BlobNotFound:
        return  # a completion racing this one assembled it; the size check tells
    except PartsChanged as error:
        raise BadInput("a part was sent again while the upload was completing; complete it again") from error


async def _capsule_for_upload(ctx: Context, capsule_id: str, family_id: str, viewer: str) -> Capsule:
    item = await ctx.loaders.item.load(keys.capsule(capsule_id)) if keys.usable_id(capsule_id) else None
    capsule = Capsule.from_item(item) if item else None
    if capsule is None or capsule.creator_id != viewer:
        raise not_found("capsule")
    if capsule.family_id != family_id:
        raise BadInput("the capsule belongs to another family")
    if capsule.status != CapsuleStatus.SCHEDULED or capsule.content_id is not None:
        raise Conflict("content can be added only to a SCHEDULED capsule without content")
    if capsule.unlock_date <= ctx.services.now_iso():
        raise Conflict("the capsule's unlock date has passed; it stays closed")
    return capsule


async def _own_content(ctx: Context, content_id: str) -> Content:
    content, membership = await readable_content(ctx, content_id)
    if content.author_id != membership.user_id:
        raise Forbidden("only the author can do that")
    return content


async def complete_upload(ctx: Context, content_id: str) -> Content:
    content = await _own_content(ctx, content_id)
    if content.status != ContentStatus.UPLOADING:
        raise Conflict(f"the upload is already complete (status {content.status})")
    upload_id, part_size = content.upload_id, content.part_size_bytes
    if upload_id is not None and part_size is not None:
        await _assemble_parts(ctx, content, upload_id, part_size)
    size = await blobs_of(ctx).head(original_key(content))
    if size is None and upload_id is not None:
        raise BadInput(
            "the parts were dropped after the upload was left for too long; resumeUpload starts it again"
        )
    if size is None:
        raise BadInput("the bytes have not arrived: PUT the file to the upload URL first")
    if size != content.size_bytes:
        raise BadInput(
            f"the upload has {size} bytes, but {content.size_bytes} were announced; "
            "resumeUpload gives a fresh URL to send the whole file again"
        )
    now = ctx.services.now_iso()
    ops: list[WriteOp] = [content.transition(ContentStatus.PROCESSING, now)]
    if content.capsule_id is not None:
        capsule_item = await ctx.table.get(keys.capsule(content.capsule_id))
        if capsule_item is None or capsule_item["unlockDate"] <= now:
            raise Conflict("the capsule's unlock date has passed; it stays closed")
        ops.append(
            Update(
                keys.capsule(content.capsule_id),
                set={"status": CapsuleStatus.LOCKED},
                condition=all_of(eq("status", CapsuleStatus.SCHEDULED), eq("contentId", content.id)),
            )
        )
    try:
        await ctx.table.transact(ops)
    except TransactionCancelled as error:
        if error.failed_on(content.key):
            raise Conflict("the upload is already complete") from error
        raise Conflict("the capsule is no longer SCHEDULED") from error
    ctx.loaders.forget(content.key)
    moved = replace(content, status=ContentStatus.PROCESSING)
    await _to_pipeline(ctx, moved, was=content.status)
    return moved


async def _to_pipeline(ctx: Context, content: Content, was: str) -> None:
    # The hand-off first: it cannot fail, and the pipeline's claim is in the
    # table (a recovery pass finds the content PROCESSING if this process dies).
    ctx.services.pipeline.submit(content.id, content.author_id)
    await publish_status(broker_of(ctx), content, was)


async def retry_content(ctx: Context, content_id: str) -> Content:
    """FAILED content, or content whose processing stopped (its worker's lease
    ran out with nobody picking it up), goes back to PROCESSING; READY content
    whose transcription failed goes back to TRANSCRIBING."""
    content = await _own_content(ctx, content_id)
    now = ctx.services.now_iso()
    move = content.transition(
        ContentStatus.PROCESSING, now, failureReason=None, leaseUntil=None, leaseOwner=None
    )
    if content.status in IN_PIPELINE:
        item = await ctx.loaders.item.load(content.key)
        lease = (item or {}).get("leaseUntil")
        if lease is None or lease > now:
            raise Conflict(f"the content is being processed (status {content.status}); wait for it")
        # Only while the lease is still the expired one read here.
        move = replace(move, condition=all_of(eq("status", content.status), eq("leaseUntil", lease)))
    elif content.status == ContentStatus.READY and content.transcription_failure:
        # Only the transcription failed: that step alone runs again.
        move = content.transition(ContentStatus.TRANSCRIBING, now, leaseUntil=None, leaseOwner=None)
    elif content.status != ContentStatus.FAILED:
        raise Conflict(
            "only FAILED or stalled content, or READY content whose transcription failed, "
            f"can be retried (status {content.status})"
        )
    try:
        item = await ctx.table.update(move)
    except ConditionFailed as error:
        raise Conflict("the content changed meanwhile") from error
    ctx.loaders.remember(item)
    moved = Content.from_item(item)
    await _to_pipeline(ctx, moved, was=content.status)
    return moved


async def restore_content(ctx: Context, content_id: str) -> Content:
    content, _ = await readable_content(ctx, content_id)
    if content.status != ContentStatus.ARCHIVED:
        raise Conflict(f"only ARCHIVED content can be restored (status {content.status})")
    blobs = blobs_of(ctx)
    for key in (content.media_key, content.thumbnail_key):
        if key:
            await blobs.restore(key)
    now = ctx.services.now_iso()
    try:
        item = await ctx.table.update(content.transition(ContentStatus.READY, now, readyAt=now))
    except ConditionFailed as error:
        raise Conflict("the content changed meanwhile") from error
    ctx.loaders.remember(item)
    restored = Content.from_item(item)
    await publish_status(broker_of(ctx), restored, was=content.status)
    return restored


async def mark_viewed(ctx: Context, content_id: str) -> Content:
    content, membership = await readable_content(ctx, content_id)
    if content.status != ContentStatus.READY or content.author_id == membership.user_id:
        return content
    try:
        item = await ctx.table.update(content.transition(ContentStatus.DELIVERED, ctx.services.now_iso()))
    except ConditionFailed:
        # Someone else's first view won; the content is DELIVERED either way.
        ctx.loaders.forget(content.key)
        reread = await load_content(ctx, content_id)
        return reread or content
    ctx.loaders.remember(item)
    delivered = Content.from_item(item)
    await publish_status(broker_of(ctx), delivered, was=content.status)
    return delivered


async def _capsule_gave_up(ctx: Context, content: Content) -> bool:
    """Whether sealed content has no capsule left to open it: the capsule was
    cancelled (or is gone), so its author may delete it."""
    capsule = await access.load_capsule(ctx, content.capsule_id) if content.capsule_id else None
    return capsule is None or capsule.status == CapsuleStatus.CANCELLED


async def delete_content(ctx: Context, content_id: str) -> bool:
    found = await load_content(ctx, content_id)
    if found is None:
        raise not_found("content")
    # Everything under the content's key, read beside the viewer's membership;
    # it is used only once the rule and the checks below allow the delete.
    (content, membership), children = await asyncio.gather(
        readable_content(ctx, content_id), ctx.table.query(keys.content_pk(found.id))
    )
    if content.author_id != membership.user_id and membership.role != Role.ADMIN:
        raise Forbidden("only the author or an ADMIN can delete this content")
    if is_sealed(content) and not await _capsule_gave_up(ctx, content):
        raise Conflict("sealed capsule content cannot be deleted")
    summary = next((i for i in children.items if (i["PK"], i["SK"]) == keys.content_tags(content.id)), None)
    ops: list[WriteOp] = [Delete(content.key, Exists()), *await tags.cleanup_ops(ctx, content, summary)]
    # The rest (comments, reactions) leaves in the same transaction while it
    # fits, after it otherwise; either way only once the content is gone.
    taken = {op_key(op) for op in ops}
    rest = [(i["PK"], i["SK"]) for i in children.items if (i["PK"], i["SK"]) not in taken]
    room = max(0, MAX_TRANSACTION_ITEMS - len(ops))
    try:
        await ctx.table.transact([*ops, *(Delete(key) for key in rest[:room])])
    except TransactionCancelled as error:
        raise not_found("content") from error
    if rest[room:]:
        await ctx.table.batch_write(deletes=rest[room:])
    await blobs_of(ctx).delete(content.blob_keys())
    if content.upload_id is not None and content.status == ContentStatus.UPLOADING:
        await blobs_of(ctx).abort_multipart(original_key(content), content.upload_id)
    ctx.loaders.forget(content.key)
    return True


# Comments ---------------------------------------------------------------------


def new_comment_id(moment: datetime) -> str:
    """The id carries its creation time, so deleteComment finds the item's key
    (which sorts by time) without a query."""
    micros = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return f"{micros:014x}{secrets.token_hex(6)}"


def comment_key_of(content_id: str, comment_id: str) -> tuple[str, str] | None:
    try:
        micros = int(comment_id[:14], 16)
    except ValueError:
        return None
    if len(comment_id) != 26:
        return None
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return keys.comment(content_id, iso(moment), comment_id)


async def comments_page(ctx: Context, content: Content, first: int, after: str | None) -> ItemPage:
    page = await query_page(
        ctx,
        scope=f"comments:{content.id}",
        pk=keys.content_pk(content.id),
        sk=SortKey.begins_with(keys.COMMENT_PREFIX),
        first=first,
        after=after,
    )
    return await access.readable_page(ctx, page, Comment)


async def add_comment(ctx: Context, content_id: str, body: str) -> Comment:
    text = clean_text(body, "body", MAX_COMMENT, multiline=True)
    viewer = await ctx.viewer_id()
    # The answer usually shows the comment's author, the viewer: asked for in
    # the content's batch.
    ctx.loaders.ask(keys.user(viewer))
    _, content = await asyncio.gather(ctx.check_rate("comment"), load_content(ctx, content_id))
    if content is not None:
        # Whether the content's author still reads the family (someone who left
        # hears nothing more of it), and the author's unread epoch, asked for
        # beside the viewer's membership.
        ctx.loaders.ask(keys.member(content.family_id, content.author_id))
        ctx.loaders.ask(*notifications.reads_for_user(content.author_id))
    content, membership = await readable_content(ctx, content_id)
    author = await ctx.loaders.item.load(keys.member(content.family_id, content.author_id))
    moment = ctx.services.now()
    comment = Comment(content.id, new_comment_id(moment), membership.user_id, text, iso(moment))
    count = Update(content.key, add={"commentCount": 1}, condition=Exists())
    ops: list[WriteOp] = [Put(comment.to_item(), NotExists()), count]
    tell = (
        content.author_id != membership.user_id
        and author is not None
        and author.get("role") in access.READERS
    )
    notes = notifications.comment_notes(content, comment.id, comment.created_at, tell)
    counters = await ctx.loaders.many(notifications.reads_for(notes))
    prepared = notifications.prepared_from(
        notes, dict(zip(notifications.reads_for(notes), counters, strict=True))
    )
    before = await ctx.loaders.item.load(content.key)  # read by the rule: no round trip
    try:
        # In the comment's own transaction (with its count, and its key through
        # ctx.table): its id is new, so the note is too.
        async def commit(batch: list[WriteOp]) -> None:
            await notifications.write(ctx.table, broker_of(ctx), notes, prepared=prepared, beside=batch)

        await ctx.counted("comment", ops, transact=commit)
    except TransactionCancelled as error:
        raise not_found("content") from error
    ctx.loaders.written([before], [count])
    return comment


async def delete_comment(ctx: Context, content_id: str, comment_id: str) -> bool:
    key = comment_key_of(content_id, comment_id) if keys.usable_id(content_id) else None
    if key is not None:
        ctx.loaders.ask(key)  # in the content's batch
    content, membership = await readable_content(ctx, content_id)
    item = await ctx.loaders.item.load(key) if key else None
    if key is None or item is None:
        raise not_found("comment")
    comment = Comment.from_item(item)
    if comment.author_id != membership.user_id and membership.role != Role.ADMIN:
        raise Forbidden("only the comment's author or an ADMIN can delete it")
    try:
        await ctx.table.transact(
            [
                Delete(key, Exists()),
                Update(content.key, add={"commentCount": -1}, condition=Exists()),
            ]
        )
    except TransactionCancelled as error:
        raise not_found("comment") from error
    ctx.loaders.forget(content.key, key)
    return True


# Reactions --------------------------------------------------------------------


def clean_emoji(text: str) -> str:
    """Exactly one emoji as Unicode's emoji data knows it (the `emoji` package):
    skin tones, flags, keycaps and ZWJ sequences count as one; arrows and
    geometric shapes, or two emoji joined where Unicode joins none, do not."""
    value = unicodedata.normalize("NFC", text.strip())
    if not emoji_data.is_emoji(value):
        raise BadInput("emoji must be a single emoji")
    return value


async def add_reaction(ctx: Context, content_id: str, emoji: str) -> Content:
    emoji = clean_emoji(emoji)
    content, membership, before = await _readable_for_reaction(ctx, content_id)
    reaction = Reaction(content.id, emoji, membership.user_id, ctx.services.now_iso())
    updates = [
        Update(content.key, add={reaction_attr(emoji): 1}, condition=Exists()),
        Update(keys.reactor(content.id, membership.user_id), set={REACTOR_ATTR + emoji: True}),
    ]
    try:
        await ctx.counted("reaction", [Put(reaction.to_item(), NotExists()), *updates])
    except TransactionCancelled as error:
        if not error.failed_on(reaction.key):
            raise not_found("content") from error
        return content  # reacting twice counts once: nothing changed
    return _written(ctx, before, updates)


async def remove_reaction(ctx: Context, content_id: str, emoji: str) -> Content:
    emoji = clean_emoji(emoji)
    content, membership, before = await _readable_for_reaction(ctx, content_id)
    key = keys.reaction(content.id, emoji, membership.user_id)
    updates = [
        Update(content.key, add={reaction_attr(emoji): -1}, condition=Exists()),
        Update(keys.reactor(content.id, membership.user_id), remove=[REACTOR_ATTR + emoji]),
    ]
    try:
        await ctx.counted("reaction", [Delete(key, Exists()), *updates])
    except TransactionCancelled as error:
        if not error.failed_on(key):
            raise not_found("content") from error
        return content  # there was no such reaction: nothing changed
    return _written(ctx, before, updates)


async def _readable_for_reaction(
    ctx: Context, content_id: str
) -> tuple[Content, Membership, list[Item | None]]:
    """The content and the viewer's membership as the rule reads them, beside
    the rate limit; and the content's and the viewer's reactor items as read,
    the reactor in the content's batch (the answer shows the viewer's reactions)."""
    viewer = await ctx.viewer_id()
    if keys.usable_id(content_id):
        ctx.loaders.ask(keys.reactor(content_id, viewer))
    _, (content, membership) = await asyncio.gather(
        ctx.check_rate("reaction"), readable_content(ctx, content_id)
    )
    # Both read already (the reactor was asked for): no round trip.
    before = await ctx.loaders.many([content.key, keys.reactor(content.id, viewer)])
    return content, membership, before


def _written(ctx: Context, before: list[Item | None], updates: list[Update]) -> Content:
    """The content and reactor item as the committed transaction left them,
    from what was read before it: the answer needs no read after the write."""
    fresh, _ = ctx.loaders.written(before, updates)
    return Content.from_item(fresh)


def reaction_counts(content: Content) -> list[tuple[str, int]]:
    return sorted(content.reactions.items(), key=lambda pair: (-pair[1], pair[0]))
