"""What runs beside the requests, started and stopped by the app's lifespan:
the broker, the blob store, the media pipeline and the periodic sweeps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from resolvers import capsules
from resolvers.broker import Broker, InProcessBroker, RedisBroker
from resolvers.context import Services
from resolvers.pipeline import Pipeline
from resolvers.scheduler import UnlockScheduler
from resolvers.transcribe import Transcriber
from store.blobs import BlobStore, LocalBlobStore

log = logging.getLogger("mifamilias.runtime")

ARCHIVE_SWEEP_SECONDS = 600.0


async def every(seconds: float, name: str, job: Callable[[], Awaitable[object]]) -> None:
    """Runs `job` now and then every `seconds`; a failure is logged, not fatal."""
    while True:
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; trying again in %.0f s", name, seconds)
        await asyncio.sleep(seconds)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _open_transcriber(services: Services, stack: contextlib.AsyncExitStack) -> Transcriber | None:
    settings = services.settings
    if settings.transcriber != "aws":
        return None
    from resolvers.transcribe import open_aws_transcriber

    if not settings.s3_bucket:
        raise RuntimeError("MIFAMILIAS_TRANSCRIBER=aws needs MIFAMILIAS_S3_BUCKET")
    transcriber: Transcriber = await stack.enter_async_context(
        open_aws_transcriber(settings.s3_bucket, settings.s3_endpoint, settings.aws_region or "us-east-1")
    )
    return transcriber


async def start_background(
    services: Services, stack: contextlib.AsyncExitStack, local_blobs: LocalBlobStore | None
) -> None:
    settings = services.settings
    broker: Broker = RedisBroker(settings.redis_url) if settings.redis_url else InProcessBroker()
    stack.push_async_callback(broker.close)
    services.extras["broker"] = broker

    blobs: BlobStore
    if settings.s3_bucket:
        from store.blobs import open_s3_blob_store

        blobs = await stack.enter_async_context(
            open_s3_blob_store(settings.s3_bucket, settings.s3_endpoint, settings.aws_region or "us-east-1")
        )
    else:
        assert local_blobs is not None
        blobs = local_blobs
    services.extras["blobs"] = blobs

    pipeline = Pipeline(
        services, workers=settings.pipeline_workers, transcriber=await _open_transcriber(services, stack)
    )
    services.extras["pipeline"] = pipeline
    services.extras["submit"] = pipeline.submit
    await pipeline.start()
    stack.push_async_callback(pipeline.stop)

    scheduler = UnlockScheduler(services)
    services.extras["scheduler"] = scheduler

    async def archive_capsules() -> int:
        return await capsules.archive_viewed(services.table, services.now(), settings.capsule_retention_days)

    tasks = [
        asyncio.create_task(every(ARCHIVE_SWEEP_SECONDS, "capsule retention sweep", archive_capsules)),
        asyncio.create_task(every(settings.unlock_poll_seconds, "unlock scheduler", scheduler.run_once)),
        asyncio.create_task(every(settings.pipeline_recovery_seconds, "pipeline recovery", pipeline.recover)),
        asyncio.create_task(
            every(
                ARCHIVE_SWEEP_SECONDS,
                "archive sweep",
                lambda: pipeline.archive_due(settings.archive_after_days),
            )
        ),
    ]
    stack.push_async_callback(_cancel, tasks)
