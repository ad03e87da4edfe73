"""The media pipeline: an in-process worker that walks content through its
states, one conditional write per move, and the archive sweep.

Video and audio keep the seed's machine, PROCESSING -> TRANSCODING ->
TRANSCRIBING -> READY; content with no audio stream (or with transcription
turned off) takes the seed's skip edge, TRANSCODING -> READY. A transcription
that fails, or hears nothing, still ends in READY (without a transcript; the
failure's reason is kept for `retryContent`). A photo goes PROCESSING -> TRANSCODING ->
READY: in TRANSCODING its stored original loses its location metadata (unless
the settings keep it), its capture time is read and its JPEG derivatives are
made; there is nothing to transcribe. A note goes PROCESSING -> READY. Any step
may end in FAILED.

Work arrives on a bounded queue, so a request never waits for media. Content
left mid-pipeline (a crash, a restart, a full queue) is found again through the
PIPELINE partition of GSI2; a lease on the item keeps two processes from
working on the same content at once. The lease is short (a minute by default)
and the worker renews it while it works, so a long transcode keeps its content
while a process that died lets go of it within one lease: the next recovery
pass, on any process, resumes it. A process that stops on purpose hands its
leases back (`stop`), so another process's next recovery pass resumes that
content at once instead of after the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resolvers.adapters import media
from resolvers.adapters.broker import Broker
from resolvers.adapters.transcribe import Transcriber, TranscriptionError
from resolvers.core import leases, workdirs
from resolvers.core.config import Settings
from resolvers.core.metrics import Metrics
from resolvers.domain import notifications, search
from resolvers.domain.content import original_key, publish_status
from resolvers.processes.leased import Claim, LeasedJob, LeaseSpec, cancelling
from store import keys
from store.blobs import ABANDONED_UPLOAD_DAYS, BlobStore
from store.enums import ContentStatus, ContentType
from store.expressions import apply_update
from store.items import IN_PIPELINE, Content, iso
from store.port import (
    ConditionFailed,
    Item,
    SortKey,
    Table,
    any_of,
    eq,
    every_item,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger("mifamilias.pipeline")

# The kinds that pass through TRANSCRIBING: those that can carry speech.
TRANSCRIBED = frozenset({ContentType.VIDEO, ContentType.AUDIO})


@dataclass
class Job:
    """One content's walk: the step it is on, for the failure's label."""

    step: str = "check"


@dataclass(frozen=True)
class Outputs:
    media_key: str | None
    thumbnail_key: str | None
    has_audio: bool
    media_format: str | None
    captured_at: str | None = None


class Pipeline(LeasedJob):
    # Content is worked on while it is in one of the pipeline's states.
    SPEC = LeaseSpec(
        "pipeline",
        recover_from=keys.PIPELINE_PK,
        claimable=any_of(*(eq("status", status) for status in IN_PIPELINE)),
        # Fair order by author: one person's 50 uploads hold one worker at a time.
        group=lambda item: item.get("authorId"),
    )

    def __init__(
        self,
        *,
        table: Table,
        blobs: BlobStore,
        broker: Broker | None,
        settings: Settings,
        clock: Callable[[], datetime],
        transcriber: Transcriber | None = None,
        metrics: Metrics | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        super().__init__(
            table=table,
            clock=clock,
            lease=timedelta(seconds=settings.pipeline_lease_seconds),
            workers=settings.pipeline_workers,
        )
        self.blobs = blobs
        self.broker = broker
        self.transcriber = transcriber
        self.keep_original_metadata = settings.keep_original_metadata
        self.metrics = metrics or Metrics.disabled()
        self.tracer = tracer
        self.metrics.watch_queue(self.queue.qsize)

    def submit(self, content_id: str, author_id: str | None = None) -> None:
        """Never blocks: when the queue is full the content waits in the
        PIPELINE index for the next recovery pass. Its author's contents take
        their turn with everyone else's (`FairQueue`)."""
        self.jobs.submit(keys.content(content_id), author_id)

    # One content ----------------------------------------------------------------

    async def process(self, claim: Claim) -> None:
        if self.tracer is None:
            await self._process(claim.item)
            return
        with self.tracer.start_as_current_span(
            "pipeline job", attributes={"mifamilias.content.id": claim.item["id"]}
        ):
            await self._process(claim.item)

    async def _process(self, claimed: Item) -> None:
        content_id = claimed["id"]
        job = Job()
        with workdirs.work_dir("media") as workdir:
            try:
                await self._walk(Content.from_item(claimed), claimed, Path(workdir), job)
            except (media.MediaError, TranscriptionError) as error:
                detail = getattr(error, "detail", None)
                log.info("content %s failed: %s %s", content_id, error, detail or "")
                reason = "media" if isinstance(error, media.MediaError) else "transcription"
                self.metrics.pipeline_failed(job.step, reason)
                self.metrics.pipeline_job("failed")
                await self._fail(content_id, str(error))
            except Exception:
                if cancelling():  # stopped mid-step: the content is not at fault
                    raise asyncio.CancelledError from None
                log.exception("pipeline: content %s failed unexpectedly", content_id)
                self.metrics.pipeline_failed(job.step, "unexpected")
                self.metrics.pipeline_job("failed")
                await self._fail(content_id, "processing failed unexpectedly; retry later")
            else:
                self.metrics.pipeline_job("ready")

    @contextlib.contextmanager
    def _step(self, job: Job, name: str) -> Iterator[None]:
        """One step: timed, traced (a child of the job's span), named for a failure."""
        job.step = name
        started = time.perf_counter()
        span = (
            self.tracer.start_as_current_span(f"pipeline {name}")
            if self.tracer is not None
            else contextlib.nullcontext()
        )
        try:
            with span:
                yield
        finally:
            self.metrics.pipeline_step_done(name, time.perf_counter() - started)

    async def _move(self, content: Content, to: str, **changes: Any) -> Content:
        at = iso(self.clock())
        if to not in IN_PIPELINE:
            changes.update(leases.CLEARED)
        item = await self.table.update(content.transition(to, at, **changes))
        moved = Content.from_item(item)
        await publish_status(self.broker, moved, was=content.status)
        return moved

    async def _walk(self, content: Content, claimed: Item, workdir: Path, job: Job) -> None:
        """Runs the steps left from the claimed status on; a resumed walk takes
        what earlier steps recorded from the claimed item."""
        source = workdir / "original"
        outputs: Outputs | None = None
        if content.status == ContentStatus.PROCESSING:
            with self._step(job, "check"):
                await self.blobs.fetch_to_file(original_key(content), source)
                await self._check(content, source)
            if content.type == ContentType.TEXT:
                # A note has nothing to transcode or transcribe: its original is its media.
                with self._step(job, "finish"):
                    await self._ready(content, mediaKey=original_key(content), hasAudio=False)
                return
            content = await self._move(content, ContentStatus.TRANSCODING)
        if content.status == ContentStatus.TRANSCODING:
            with self._step(job, "transcode"):
                if not source.exists():
                    await self.blobs.fetch_to_file(original_key(content), source)
                outputs = await self._transcode(content, source, workdir)
            made = {
                "mediaKey": outputs.media_key,
                "thumbnailKey": outputs.thumbnail_key,
                "hasAudio": outputs.has_audio,
                "mediaFormat": outputs.media_format,
            }
            if outputs.captured_at is not None:
                made["capturedAt"] = outputs.captured_at
            if content.type not in TRANSCRIBED or not outputs.has_audio or self.transcriber is None:
                # A photo's derivatives are real work; there is nothing to transcribe. A
                # video without sound (or no transcriber at all) takes the seed's
                # "skip (no audio)" edge: straight to READY.
                with self._step(job, "finish"):
                    await self._ready(content, **made)
                return
            content = await self._move(content, ContentStatus.TRANSCRIBING, **made)
        if content.status == ContentStatus.TRANSCRIBING:
            media_format = outputs.media_format if outputs else claimed.get("mediaFormat")
            with self._step(job, "transcribe"):
                heard = await self._transcribe(content, media_format, workdir)
            with self._step(job, "finish"):
                await self._ready(content, **heard)

    async def _ready(self, content: Content, **changes: Any) -> None:
        ready_at = iso(self.clock())
        move = content.transition(
            ContentStatus.READY, ready_at, readyAt=ready_at, **changes, **leases.CLEARED
        )
        # The move and the family's notes commit together (a crash cannot leave
        # READY content that nobody was told of, since nothing resumes READY content).
        await notifications.content_ready(self.table, self.broker, content, move)
        ready = Content.from_item(apply_update(content.to_item(), move))
        await publish_status(self.broker, ready, was=content.status)
        # A crash between the move and the index leaves the content unfound by its words
        # until it is indexed again (a retried transcription); it is still READY and shown.
        await search.index_content(self.table, ready)

    async def _check(self, content: Content, source: Path) -> None:
        if content.type == ContentType.TEXT:
            await media.check_text(source)
            return
        if content.type == ContentType.PHOTO:
            await media.check_photo(source)
            return
        probe = await media.probe(source)
        await media.check_kind(probe, content.type)

    async def _transcode(self, content: Content, source: Path, workdir: Path) -> Outputs:
        base = f"content/{content.id}"
        if content.type == ContentType.TEXT:
            return Outputs(original_key(content), None, False, None)
        if content.type == ContentType.PHOTO:
            # The stored original loses its location before anything is READY (downloads
            # and exports read it); a resumed walk finds it clean and leaves it.
            clean = None if self.keep_original_metadata else workdir / "original-clean"
            original = await media.photo_original(source, clean)
            if original.stripped and clean is not None:
                await self.blobs.put_file(original_key(content), clean, content.mime_type)
                source = clean
            photo, thumb = workdir / "media.jpg", workdir / "thumb.jpg"
            await media.transcode_photo(source, photo, thumb)
            await self.blobs.put_file(f"{base}/media.jpg", photo, "image/jpeg")
            await self.blobs.put_file(f"{base}/thumb.jpg", thumb, "image/jpeg")
            return Outputs(f"{base}/media.jpg", f"{base}/thumb.jpg", False, None, original.captured_at)
        probed = await media.probe(source)
        if content.type == ContentType.VIDEO:
            video, thumb = workdir / "media.mp4", workdir / "thumb.jpg"
            await media.transcode_video(source, video, thumb, probed=probed)
            await self.blobs.put_file(f"{base}/media.mp4", video, "video/mp4")
            await self.blobs.put_file(f"{base}/thumb.jpg", thumb, "image/jpeg")
            return Outputs(f"{base}/media.mp4", f"{base}/thumb.jpg", probed.has_audio, "mp4")
        audio = workdir / "media.m4a"
        await media.transcode_audio(source, audio, probed=probed)
        await self.blobs.put_file(f"{base}/media.m4a", audio, "audio/mp4")
        return Outputs(f"{base}/media.m4a", None, True, "m4a")

    async def _transcribe(self, content: Content, media_format: Any, workdir: Path) -> dict[str, Any]:
        """What the transcription step records on the content. A failed transcription
        does not fail the content: it becomes READY without a transcript, the reason
        is kept in `transcriptionFailure`, and `retryContent` tries again."""
        cleared: dict[str, Any] = {
            "transcription": None,
            "transcriptLanguage": None,
            "captionsKey": None,
            "transcriptionFailure": None,
        }
        if self.transcriber is None or not content.media_key:
            return cleared
        try:
            heard = await self.transcriber.transcribe(
                bucket_key=content.media_key,
                media_format=str(media_format or "mp4"),
                job_name=f"mifamilias-{content.id}",
            )
        except TranscriptionError as error:
            if cancelling():
                raise asyncio.CancelledError from None
            log.info("content %s is READY without a transcript: %s", content.id, error)
            self.metrics.pipeline_failed("transcribe", "transcription")
            return {**cleared, "transcriptionFailure": str(error)[:500]}
        if heard is None:
            return cleared  # no speech: READY with a null transcript
        captions: str | None = None
        if heard.has_captions:
            captions, vtt = f"content/{content.id}/captions.vtt", workdir / "captions.vtt"
            vtt.write_text(heard.webvtt(), encoding="utf-8")
            await self.blobs.put_file(captions, vtt, "text/vtt")
        return {
            **cleared,
            "transcription": heard.text,
            "transcriptLanguage": heard.language,
            "captionsKey": captions,
        }

    async def _fail(self, content_id: str, reason: str) -> None:
        item = await self.table.get(keys.content(content_id))
        if item is None:
            return
        content = Content.from_item(item)
        if content.status not in IN_PIPELINE:
            return
        with contextlib.suppress(ConditionFailed):
            await self._move(content, ContentStatus.FAILED, failureReason=reason[:500])

    # Archive sweep --------------------------------------------------------------

    async def archive_due(self, days: int) -> int:
        """READY or DELIVERED content that became READY `days` ago moves to ARCHIVED."""
        cutoff = iso(self.clock() - timedelta(days=days))
        archived = 0
        for shard in range(keys.ARCHIVE_SHARDS):
            page = await self.table.query(
                keys.archive_pk(shard), SortKey("<", cutoff), index="GSI2", limit=100
            )
            for item in page.items:
                archived += await self._archive(Content.from_item(item))
        return archived

    async def _archive(self, content: Content) -> int:
        if content.status not in (ContentStatus.READY, ContentStatus.DELIVERED):
            return 0
        for key in _blob_keys(content):
            await self.blobs.archive(key)
        try:
            await self._move(content, ContentStatus.ARCHIVED)
        except ConditionFailed:
            return 0
        return 1

    # Abandoned uploads -----------------------------------------------------------

    async def sweep_abandoned(self) -> int:
        """Content whose capsule was cancelled while its upload was under way
        (`cancelCapsule` lists it), once that upload can no longer finish: its
        parts are dropped after ABANDONED_UPLOAD_DAYS. Its blobs go first, then
        the item, on the condition that it is still UPLOADING; a pass that stops
        in between is finished by the next."""
        cutoff = iso(self.clock() - timedelta(days=ABANDONED_UPLOAD_DAYS))
        swept = 0
        async for item in every_item(
            self.table, keys.ABANDONED_UPLOADS_PK, SortKey("<", cutoff), index="GSI2"
        ):
            content = Content.from_item(item)
            if content.status != ContentStatus.UPLOADING:
                continue  # it left the list when its upload finished
            await self.blobs.delete([*content.blob_keys(), original_key(content)])
            if content.upload_id is not None:
                await self.blobs.abort_multipart(original_key(content), content.upload_id)
            try:
                await self.table.delete(content.key, condition=eq("status", ContentStatus.UPLOADING))
            except ConditionFailed:
                continue
            swept += 1
        return swept


def _blob_keys(content: Content) -> Sequence[str]:
    return [k for k in (content.media_key, content.thumbnail_key) if k]
