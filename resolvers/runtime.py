"""The composition of one server process: every service, built once and typed
(`compose`), and what runs beside the requests (`start_background`): the
pipeline's workers, the unlock scheduler and the periodic sweeps."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from resolvers.adapters import media, webpush
from resolvers.adapters.broker import Broker, InProcessBroker, RedisBroker
from resolvers.adapters.budget import RedisBudgetCounter
from resolvers.adapters.sns import SnsPush
from resolvers.adapters.transcribe import Transcriber, TranscriptionError
from resolvers.adapters.webpush import WebPushSender
from resolvers.core import workdirs
from resolvers.core.auth import TokenVerifier
from resolvers.core.config import Settings
from resolvers.core.context import utc_now
from resolvers.core.cursors import CursorSigner
from resolvers.core.heap import SubscriptionHeap
from resolvers.core.metrics import Metrics
from resolvers.core.observed import ObservedTable, botocore_client, engine_of, watch_botocore
from resolvers.core.persisted import ManifestError, PersistedDocuments, TrustedDocuments, load_manifest
from resolvers.core.ratelimit import Bucket, BudgetCounter, RateLimiter, TableBudgetCounter, parse_limits
from resolvers.domain import capsules
from resolvers.processes.accounts import AccountDeletions
from resolvers.processes.exports import ExportBuilder
from resolvers.processes.live import EventReads
from resolvers.processes.mailer import Mailer
from resolvers.processes.pipeline import Pipeline
from resolvers.processes.pusher import Pusher, PushQueue
from resolvers.processes.scheduler import UnlockScheduler
from resolvers.services import Services
from store.blobs import BlobStore, LocalBlobStore
from store.port import Table

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger("mifamilias.runtime")

ARCHIVE_SWEEP_SECONDS = 600.0
UPLOAD_SWEEP_SECONDS = 3600.0


async def every(
    seconds: float,
    name: str,
    job: Callable[[], Awaitable[object]],
    tracer: Tracer | None = None,
    wait: Callable[[], float] | None = None,
) -> None:
    """Runs `job` now and then every `seconds` (or as long as `wait` says after
    each run); a failure is logged, not fatal. With tracing, each run is a
    span: its store calls are one trace, not many."""
    while True:
        try:
            if tracer is None:
                await job()
            else:
                with tracer.start_as_current_span(name):
                    await job()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; trying again in %.0f s", name, seconds)
            await asyncio.sleep(seconds)
            continue
        await asyncio.sleep(seconds if wait is None else wait())


def observe_table(table: Table, metrics: Metrics, tracer: Tracer | None, table_name: str = "") -> Table:
    """The table with its calls measured (and traced), and DynamoDB's throttles
    and retries counted; the table itself when there is nothing to observe."""
    if not metrics.enabled and tracer is None:
        return table
    client = botocore_client(table)
    if client is not None and metrics.enabled:
        watch_botocore(client, metrics)
    return ObservedTable(table, metrics, tracer, engine=engine_of(table), name=table_name)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _open_transcriber(
    settings: Settings, stack: contextlib.AsyncExitStack, blobs: BlobStore
) -> Transcriber | None:
    if settings.transcriber == "none":
        return None
    if settings.transcriber == "aws":
        from resolvers.adapters.transcribe import open_aws_transcriber

        if not settings.s3_bucket:
            raise RuntimeError("MIFAMILIAS_TRANSCRIBER=aws needs MIFAMILIAS_S3_BUCKET")
        aws: Transcriber = await stack.enter_async_context(
            open_aws_transcriber(settings.s3_bucket, settings.s3_endpoint, settings.region)
        )
        return aws
    from resolvers.adapters.whisper import open_local_transcriber

    local = await stack.enter_async_context(
        open_local_transcriber(
            blobs,
            cache_dir=settings.resolved_cache_dir / "models",
            model_dir=settings.whisper_model,
            language=settings.transcribe_language,
            workers=settings.pipeline_workers,
        )
    )
    try:
        local.check_model()
    except TranscriptionError as error:
        # Not fatal: content waits for a background install, or becomes READY without a
        # transcript and with the reason.
        if local.installing():
            log.info("transcription: %s yet; it is being installed, content waits for it", error)
        else:
            log.warning("transcription: %s; content will be READY without a transcript", error)
    return local


def local_blob_store(settings: Settings) -> LocalBlobStore:
    """Media as files in the data directory, served back by the app's own routes."""
    return LocalBlobStore(
        settings.data_dir / "media", settings.base_url, settings.resolved_auth_secret().encode()
    )


async def _open_blobs(
    settings: Settings, stack: contextlib.AsyncExitStack, local_blobs: LocalBlobStore | None
) -> BlobStore:
    if not settings.s3_bucket:
        if local_blobs is None:
            raise RuntimeError("no S3 bucket is configured and no local blob store was given")
        return local_blobs
    from store.blobs import open_s3_blob_store

    blobs: BlobStore = await stack.enter_async_context(
        open_s3_blob_store(settings.s3_bucket, settings.s3_endpoint, settings.region)
    )
    return blobs


def _verifier(settings: Settings) -> TokenVerifier:
    if settings.jwks_url:
        return TokenVerifier(
            jwks_url=settings.jwks_url, issuer=settings.jwt_issuer, audience=settings.jwt_audience
        )
    return TokenVerifier(
        secret=settings.resolved_auth_secret(), issuer=settings.jwt_issuer, audience=settings.jwt_audience
    )


def _sweep_local_uploads(blobs: LocalBlobStore) -> int:
    """Multipart uploads abandoned for ABANDONED_UPLOAD_DAYS (what S3's lifecycle
    rule does there) and consumed upload URLs that have expired."""
    return blobs.sweep_abandoned() + blobs.prune_used()


def _check_trusted_proxies(settings: Settings) -> None:
    for entry in settings.trusted_proxies:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError as error:
            raise ValueError(f"MIFAMILIAS_TRUSTED_PROXIES: {entry!r} is not an address or network") from error


def _trusted_documents(settings: Settings) -> TrustedDocuments | None:
    if settings.trusted_documents is None:
        return None
    try:
        trusted = TrustedDocuments(load_manifest(settings.trusted_documents))
    except ManifestError as error:
        raise ValueError(f"MIFAMILIAS_TRUSTED_DOCUMENTS: {error}") from None
    log.info("trusted documents: %d from %s; nothing else runs", len(trusted), settings.trusted_documents)
    return trusted


async def _open_push(
    settings: Settings, stack: contextlib.AsyncExitStack
) -> tuple[WebPushSender, SnsPush | None]:
    """Web Push always (its VAPID key generated on first use); native push when
    an SNS platform application is named."""
    # Whatever started this app: on a shared table, never a key of this host's own.
    settings.check_serving()
    vapid = webpush.load_vapid(settings.data_dir, settings.vapid_private_key)
    web = WebPushSender(
        vapid,
        settings.vapid_subject,
        settings.push_allowed_origins,
        timeout=settings.push_timeout_seconds,
        per_origin=settings.push_connections_per_origin,
    )
    stack.push_async_callback(web.close)
    native: SnsPush | None = None
    if settings.sns_apns_arn or settings.sns_fcm_arn:
        from resolvers.adapters.sns import open_sns

        native = await stack.enter_async_context(
            open_sns(settings.sns_apns_arn, settings.sns_fcm_arn, settings.sns_endpoint, settings.region)
        )
    return web, native


async def compose(
    settings: Settings,
    table: Table,
    stack: contextlib.AsyncExitStack,
    *,
    local_blobs: LocalBlobStore | None = None,
    clock: Callable[[], datetime] = utc_now,
    broker: Broker | None = None,
    metrics: Metrics | None = None,
    tracer: Tracer | None = None,
) -> Services:
    """Every service of one process, built once and typed. Nothing runs yet:
    `start_background` starts the pipeline's workers and the periodic jobs."""
    _check_trusted_proxies(settings)
    trusted = _trusted_documents(settings)
    metrics = metrics or Metrics.disabled()
    if broker is None:
        heap = SubscriptionHeap(enabled=settings.freeze_subscriptions)
        broker = (
            RedisBroker(settings.redis_url, metrics=metrics, heap=heap)
            if settings.redis_url
            else InProcessBroker(metrics=metrics, heap=heap)
        )
        stack.push_async_callback(broker.close)
    blobs = await _open_blobs(settings, stack, local_blobs)
    transcriber = await _open_transcriber(settings, stack, blobs)
    # The photo processes go with the app, after the pipeline that feeds them has
    # stopped: a stopped server leaves none of them behind.
    stack.callback(media.close_photo_pool)
    pipeline = Pipeline(
        table=table,
        blobs=blobs,
        broker=broker,
        settings=settings,
        clock=clock,
        transcriber=transcriber,
        metrics=metrics,
        tracer=tracer,
    )
    stack.push_async_callback(pipeline.stop)
    exports = ExportBuilder(table=table, blobs=blobs, settings=settings, clock=clock)
    stack.push_async_callback(exports.stop)
    accounts = AccountDeletions(
        table=table, clock=clock, lease=timedelta(seconds=settings.pipeline_lease_seconds)
    )
    stack.push_async_callback(accounts.stop)
    budget_counter: BudgetCounter = TableBudgetCounter(table)
    bucket = Bucket(settings.cost_budget, settings.cost_restore_rate)
    if settings.redis_url and bucket.enabled:
        in_redis = RedisBudgetCounter(settings.redis_url, fallback=budget_counter)
        stack.push_async_callback(in_redis.close)
        budget_counter = in_redis
    rates = RateLimiter(
        table,
        parse_limits(settings.rate_limits),
        cost_bucket=bucket,
        budget_counter=budget_counter,
        streams_per_person=settings.max_subscriptions_per_person,
        replays_per_person=settings.max_replays_per_person,
    )
    stack.push_async_callback(rates.streams.stop)
    stack.push_async_callback(rates.budget.drain)
    web_push, native_push = await _open_push(settings, stack)
    pusher = PushQueue(
        Pusher(table=table, settings=settings, clock=clock, web=web_push, native=native_push),
        table=table,
        broker=broker,
        clock=clock,
        lease=timedelta(seconds=settings.push_lease_seconds),
        workers=settings.push_workers,
    )
    stack.push_async_callback(pusher.stop)
    return Services(
        settings=settings,
        table=table,
        verifier=_verifier(settings),
        cursors=CursorSigner(settings.resolved_auth_secret()),
        rates=rates,
        broker=broker,
        blobs=blobs,
        pipeline=pipeline,
        scheduler=UnlockScheduler(
            table=table, broker=broker, settings=settings, clock=clock, metrics=metrics
        ),
        event_reads=EventReads(),
        persisted=PersistedDocuments(table, clock, trusted=trusted),
        exports=exports,
        accounts=accounts,
        transcriber=transcriber,
        mailer=Mailer(table=table, settings=settings, clock=clock) if settings.smtp_url else None,
        web_push=web_push,
        native_push=native_push,
        pusher=pusher,
        clock=clock,
        metrics=metrics,
        tracer=tracer,
    )


async def start_background(services: Services, stack: contextlib.AsyncExitStack) -> None:
    """The workers (pipeline, exports), the unlock scheduler and the sweeps, until the stack closes."""
    settings = services.settings
    pipeline, scheduler = services.pipeline, services.scheduler
    # What a killed process left in the temp folder (a transcode, an export build).
    await asyncio.to_thread(workdirs.sweep_dead)
    await pipeline.start()
    await services.exports.start()
    services.accounts.serve(services)
    await services.accounts.start()

    async def archive_capsules() -> int:
        return await capsules.archive_viewed(services.table, services.now(), settings.capsule_retention_days)

    tracer = services.tracer
    # After the scheduler's task is cancelled (the stack closes in reverse): its
    # shards handed back for another process's next pass.
    stack.push_async_callback(scheduler.release)
    tasks = [
        asyncio.create_task(
            every(ARCHIVE_SWEEP_SECONDS, "capsule retention sweep", archive_capsules, tracer)
        ),
        asyncio.create_task(
            every(
                settings.unlock_poll_seconds,
                "unlock scheduler",
                scheduler.run_once,
                tracer,
                wait=scheduler.seconds_to_next_pass,
            )
        ),
        asyncio.create_task(
            every(settings.pipeline_recovery_seconds, "pipeline recovery", pipeline.recover, tracer)
        ),
        asyncio.create_task(
            every(
                ARCHIVE_SWEEP_SECONDS,
                "archive sweep",
                lambda: pipeline.archive_due(settings.archive_after_days),
                tracer,
            )
        ),
        asyncio.create_task(
            every(ARCHIVE_SWEEP_SECONDS, "cancelled capsules' upload sweep", pipeline.sweep_abandoned, tracer)
        ),
        asyncio.create_task(
            every(settings.pipeline_recovery_seconds, "export recovery", services.exports.recover)
        ),
        asyncio.create_task(every(ARCHIVE_SWEEP_SECONDS, "export expiry sweep", services.exports.sweep)),
        asyncio.create_task(
            every(
                settings.pipeline_recovery_seconds,
                "account deletion sweep",
                lambda: services.accounts.sweep(services),
            )
        ),
    ]
    if services.pusher is not None:
        await services.pusher.start()
        tasks.append(
            asyncio.create_task(
                every(settings.push_recovery_seconds, "push recovery", services.pusher.recover, tracer)
            )
        )
    mailer = services.mailer
    if mailer is not None:
        tasks.append(
            asyncio.create_task(
                every(
                    settings.mail_poll_seconds,
                    "mailer",
                    mailer.run_once,
                    tracer,
                    wait=lambda: mailer.next_pass_in(settings.mail_poll_seconds),
                )
            )
        )
    blobs = services.blobs
    if isinstance(blobs, LocalBlobStore):
        tasks.append(
            asyncio.create_task(
                every(
                    UPLOAD_SWEEP_SECONDS,
                    "abandoned upload sweep",
                    lambda: asyncio.to_thread(_sweep_local_uploads, blobs),
                )
            )
        )
    stack.push_async_callback(_cancel, tasks)
