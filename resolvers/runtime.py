"""What runs beside the requests, started and stopped by the app's lifespan."""

from __future__ import annotations

import contextlib

from resolvers.broker import Broker, InProcessBroker, RedisBroker
from resolvers.context import Services
from store.blobs import BlobStore, LocalBlobStore


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
