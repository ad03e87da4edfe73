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
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resolvers.adapters import media
from resolvers.adapters.broker import Broker
from resolvers.adapters.transcribe import Transcriber, TranscriptionError
from resolvers.core.config import Settings
from resolvers.core.metrics import Metrics
from resolvers.domain import notifications, search
from resolvers.domain.content import original_key, publish_status
from resolvers.processes.workers import cancelling
from store import keys
from store.blobs import BlobStore
from store.enums import ContentStatus, ContentType
from store.items import IN_PIPELINE, Content, iso
from store.port import (
    Compare,
    ConditionFailed,
    Item,
    NotExists,
    SortKey,
    Table,
    Update,
    all_of,
    any_of,
    eq,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger("mifamilias.pipeline")

QUEUE_SIZE = 100
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


class Pipeline:
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
        self.table = table
        self.blobs = blobs
        self.broker = broker
        self.clock = clock
        self.workers = settings.pipeline_workers
        self.transcriber = transcriber
        self.keep_original_metadata = settings.keep_original_metadata
        self.queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_SIZE)
        self._tasks: list[asyncio.Task[None]] = []
        self._queued: set[str] = set()
        self.lease = timedelta(seconds=settings.pipeline_lease_seconds)
        # Whose lease it is: renewals and releases touch only this process's own.
        self.owner = uuid.uuid4().hex
        # Content whose lease this process may hold: noted before the claim (a
        # claim cancelled on its way may still have landed), left noted when the
        # work is cancelled, so that `stop` hands the lease back.
        self._holding: set[str] = set()
        self.metrics = metrics or Metrics.disabled()
        self.tracer = tracer
        self.metrics.watch_queue(self.queue.qsize)

    # Running --------------------------------------------------------------------

    def submit(self, content_id: str) -> None:
        """Never blocks: when the queue is full the content waits in the
        PIPELINE index for the next recovery pass."""
        if content_id in self._queued:
            return
        try:
            self.queue.put_nowait(content_id)
        except asyncio.QueueFull:
            log.warning("pipeline queue full; content %s waits for the next recovery pass", content_id)
            return
        self._queued.add(content_id)

    async def start(self) -> None:
        # Recovery runs from the periodic job, which starts at once.
        self._tasks = [asyncio.create_task(self._work(), name=f"pipeline-{n}") for n in range(self.workers)]

    async def stop(self) -> None:
        """Stops the workers, then hands back the leases their work held: a
        conditional write clears the lease while it is still this process's, and
        the content keeps the status it reached, so another process's recovery
        pass takes it up from there at once. Safe to call twice."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for content_id in sorted(self._holding):
            await self._release(content_id)
            self._holding.discard(content_id)

    async def _release(self, content_id: str) -> None:
        try:
            await self.table.update(
                Update(
                    keys.content(content_id),
                    set={"leaseUntil": None, "leaseOwner": None},
                    condition=all_of(
                        eq("leaseOwner", self.owner),
                        any_of(*(eq("status", status) for status in IN_PIPELINE)),
                    ),
                )
            )
        except ConditionFailed:
            return  # never claimed, finished, or no longer ours
        except Exception:
            log.exception("pipeline: could not hand back the lease of content %s", content_id)
            return
        log.info("pipeline: handed back content %s for another process to resume", content_id)

    async def _work(self) -> None:
        while True:
            content_id = await self.queue.get()
            self._queued.discard(content_id)
            try:
                await self.process(content_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                if cancelling():
                    raise asyncio.CancelledError from None
                log.exception("pipeline: unexpected failure on content %s", content_id)
            finally:
                self.queue.task_done()

    async def recover(self) -> int:
        """Queues what a crash, a shutdown or a full queue left mid-pipeline:
        content with no lease (never claimed, or handed back) or a lease run out."""
        found = 0
        cursor: str | None = None
        while True:
            page = await self.table.query(keys.PIPELINE_PK, index="GSI2", limit=100, cursor=cursor)
            for item in page.items:
                lease = item.get("leaseUntil")
                if lease and lease > iso(self.clock()):
                    continue
                self.submit(item["id"])
                found += 1
            if page.cursor is None or self.queue.full():
                return found
            cursor = page.cursor

    # One content ----------------------------------------------------------------

    async def process(self, content_id: str) -> None:
        self._holding.add(content_id)
        cancelled = False
        try:
            if self.tracer is None:
                await self._process(content_id)
            else:
                with self.tracer.start_as_current_span(
                    "pipeline job", attributes={"mifamilias.content.id": content_id}
                ):
                    await self._process(content_id)
        except asyncio.CancelledError:
            cancelled = True  # stays noted: `stop` hands the lease back
            raise
        finally:
            if not cancelled:
                self._holding.discard(content_id)

    async def _process(self, content_id: str) -> None:
        claimed = await self._claim(content_id)
        if claimed is None:
            return
        heartbeat = asyncio.create_task(self._renew(content_id))
        job = Job()
        try:
            with tempfile.TemporaryDirectory(prefix="mifamilias-") as workdir:
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
        finally:
            heartbeat.cancel()
            # Waits for the heartbeat to stop without swallowing a cancel of this
            # task (`stop` cancelling the worker just now): suppressing
            # CancelledError here would keep the worker alive and `stop` waiting.
            await asyncio.gather(heartbeat, return_exceptions=True)

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

    async def _renew(self, content_id: str) -> None:
        """Keeps the lease while the work goes on: a third of it at a time."""
        while True:
            await asyncio.sleep(self.lease.total_seconds() / 3)
            try:
                await self.table.update(
                    Update(
                        keys.content(content_id),
                        set={"leaseUntil": iso(self.clock() + self.lease)},
                        condition=all_of(
                            eq("leaseOwner", self.owner),
                            any_of(*(eq("status", status) for status in IN_PIPELINE)),
                        ),
                    )
                )
            except ConditionFailed:
                return  # done, gone, or no longer ours
            except Exception:
                log.exception("pipeline: could not renew the lease of content %s", content_id)

    async def _claim(self, content_id: str) -> Item | None:
        now = self.clock()
        try:
            item = await self.table.update(
                Update(
                    keys.content(content_id),
                    set={"leaseUntil": iso(now + self.lease), "leaseOwner": self.owner},
                    condition=all_of(
                        any_of(
                            eq("status", ContentStatus.PROCESSING),
                            eq("status", ContentStatus.TRANSCODING),
                            eq("status", ContentStatus.TRANSCRIBING),
                        ),
                        any_of(
                            NotExists("leaseUntil"),
                            eq("leaseUntil", None),
                            Compare("leaseUntil", "<", iso(now)),
                        ),
                    ),
                )
            )
        except ConditionFailed:
            return None  # done, gone, or another process holds the lease
        return item

    async def _move(self, content: Content, to: str, **changes: Any) -> Content:
        at = iso(self.clock())
        if to not in IN_PIPELINE:
            changes["leaseUntil"] = None
            changes["leaseOwner"] = None
        item = await self.table.update(content.transition(to, at, **changes))
        moved = Content.from_item(item)
        await publish_status(self.broker, moved)
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
        content = await self._move(content, ContentStatus.READY, readyAt=ready_at, **changes)
        # A crash between the move and the index leaves the content unfound by its words
        # until it is indexed again (a retried transcription); it is still READY and shown.
        await search.index_content(self.table, content)
        await notifications.content_ready(self.table, self.broker, content, ready_at)

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


def _blob_keys(content: Content) -> Sequence[str]:
    return [k for k in (content.media_key, content.thumbnail_key) if k]
