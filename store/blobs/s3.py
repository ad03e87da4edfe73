"""The blob store on S3: one aioboto3 client and a bucket; URLs are SigV4
presigned, and a bucket made here gets the rule that drops abandoned multipart
uploads. The contract is `store.blobs.port`'s."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from store.blobs.port import (
    ABANDONED_UPLOAD_DAYS,
    GLACIER_IR,
    STANDARD,
    BlobError,
    BlobNotFound,
    Part,
    PartsChanged,
    check_expiry,
    check_part,
    discard,
    temp_beside,
    validate_key,
)

_DELETE_BATCH = 1000  # DeleteObjects limit


def _error_code(exc: Exception) -> str:
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        if isinstance(error, dict):
            return str(error.get("Code", ""))
    return ""


def _is_not_found(exc: Exception) -> bool:
    return _error_code(exc) in {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


class S3BlobStore:
    """Objects in one S3 bucket, through an open aioboto3 S3 client."""

    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self.bucket = bucket

    async def upload_url(self, key: str, *, content_type: str, size_bytes: int, expires_in: int) -> str:
        validate_key(key)
        check_expiry(expires_in)
        if size_bytes < 0:
            raise ValueError("size_bytes must not be negative")
        url = await self._client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ContentType": content_type,
                "ContentLength": size_bytes,
            },
            ExpiresIn=expires_in,
        )
        return str(url)

    async def download_url(self, key: str, *, expires_in: int) -> str:
        validate_key(key)
        check_expiry(expires_in)
        url = await self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_in
        )
        return str(url)

    async def _head(self, key: str) -> dict[str, Any] | None:
        validate_key(key)
        try:
            response = await self._client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise
        return dict(response)

    async def head(self, key: str) -> int | None:
        response = await self._head(key)
        return None if response is None else int(response["ContentLength"])

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        validate_key(key)
        # The managed transfer: multipart (and parallel) for large files.
        await self._client.upload_file(str(path), self.bucket, key, ExtraArgs={"ContentType": content_type})

    async def fetch_to_file(self, key: str, path: Path) -> None:
        validate_key(key)
        tmp = await asyncio.to_thread(temp_beside, path)
        try:
            await self._client.download_file(self.bucket, key, str(tmp))
            await asyncio.to_thread(os.replace, tmp, path)
        except Exception as exc:
            discard(tmp)
            if _is_not_found(exc):
                raise BlobNotFound(key) from exc
            raise
        except BaseException:
            discard(tmp)
            raise

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            validate_key(key)
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _DELETE_BATCH):
            batch = unique[start : start + _DELETE_BATCH]
            response = await self._client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise BlobError(
                    f"could not delete {len(errors)} object(s), first {first.get('Key')!r}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    async def storage_class(self, key: str) -> str:
        response = await self._head(key)
        if response is None:
            raise BlobNotFound(key)
        # S3 leaves StorageClass out of HeadObject for STANDARD objects.
        return str(response.get("StorageClass") or STANDARD)

    async def _set_storage_class(self, key: str, storage_class: str) -> None:
        if await self.storage_class(key) == storage_class:
            # S3 refuses an in-place copy that changes nothing.
            return
        # An in-place copy keeps the body, Content-Type and metadata
        # (MetadataDirective COPY). CopyObject handles objects up to 5 GB.
        try:
            await self._client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                StorageClass=storage_class,
                MetadataDirective="COPY",
            )
        except Exception as exc:
            if _is_not_found(exc):
                raise BlobNotFound(key) from exc
            raise

    async def archive(self, key: str) -> None:
        await self._set_storage_class(key, GLACIER_IR)

    async def restore(self, key: str) -> None:
        await self._set_storage_class(key, STANDARD)

    # Multipart

    async def start_multipart(self, key: str, *, content_type: str) -> str:
        validate_key(key)
        response = await self._client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ContentType=content_type
        )
        return str(response["UploadId"])

    async def part_url(
        self, key: str, upload_id: str, part_number: int, *, size_bytes: int, expires_in: int
    ) -> str:
        validate_key(key)
        check_expiry(expires_in)
        check_part(part_number, size_bytes)
        url = await self._client.generate_presigned_url(
            "upload_part",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "UploadId": upload_id,
                "PartNumber": part_number,
                "ContentLength": size_bytes,
            },
            ExpiresIn=expires_in,
        )
        return str(url)

    async def uploaded_parts(self, key: str, upload_id: str) -> list[Part] | None:
        validate_key(key)
        parts: list[Part] = []
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "UploadId": upload_id}
        while True:
            try:
                response = await self._client.list_parts(**params)
            except Exception as exc:
                if _error_code(exc) in {"NoSuchUpload", "404", "NoSuchKey"}:
                    return None
                raise
            for found in response.get("Parts") or []:
                parts.append(Part(int(found["PartNumber"]), int(found["Size"]), str(found["ETag"])))
            if not response.get("IsTruncated"):
                return sorted(parts, key=lambda part: part.number)
            params["PartNumberMarker"] = response["NextPartNumberMarker"]

    async def complete_multipart(self, key: str, upload_id: str, parts: Sequence[Part]) -> None:
        validate_key(key)
        try:
            await self._client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": p.etag} for p in parts]},
            )
        except Exception as exc:
            code = _error_code(exc)
            if code == "NoSuchUpload":
                raise BlobNotFound(key) from exc
            if code in {"InvalidPart", "InvalidPartOrder"}:
                raise PartsChanged(f"the parts of {key!r} changed: {code}") from exc
            raise

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        validate_key(key)
        try:
            await self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except Exception as exc:
            if _error_code(exc) not in {"NoSuchUpload", "404"}:
                raise


@contextlib.asynccontextmanager
async def open_s3_blob_store(
    bucket: str, endpoint_url: str | None = None, region: str = "us-east-1"
) -> AsyncIterator[S3BlobStore]:
    """Open one S3 client for the process and make sure the bucket exists.

    Credentials come from the usual chain (environment, profile, role). With
    an `endpoint_url` (moto, MinIO, LocalStack) path-style addressing is used,
    and the presigned URLs point at that endpoint, so clients must reach it.
    """
    import aioboto3
    from aiobotocore.config import AioConfig

    config = AioConfig(
        signature_version="s3v4",
        s3={"addressing_style": "path" if endpoint_url else "auto"},
    )
    session = aioboto3.Session()
    async with session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config) as client:
        await _ensure_bucket(client, bucket, region)
        yield S3BlobStore(client, bucket)


async def _ensure_bucket(client: Any, bucket: str, region: str) -> None:
    try:
        await client.head_bucket(Bucket=bucket)
        return
    except Exception as exc:
        if not _is_not_found(exc):
            raise
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        await client.create_bucket(**kwargs)
    except Exception as exc:
        if _error_code(exc) not in {"BucketAlreadyOwnedByYou"}:
            raise
        return  # another process made it, rule included
    # Only on a bucket made here: putting a lifecycle configuration replaces the
    # whole of it, and an existing bucket's rules are its owner's (the
    # deployment's template has this rule among its own).
    await client.put_bucket_lifecycle_configuration(
        Bucket=bucket,
        LifecycleConfiguration={"Rules": [ABORT_INCOMPLETE_UPLOADS_RULE]},
    )


ABORT_INCOMPLETE_UPLOADS_RULE: dict[str, Any] = {
    "ID": "abort-incomplete-multipart-uploads",
    "Status": "Enabled",
    "Filter": {"Prefix": ""},
    "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": ABANDONED_UPLOAD_DAYS},
}
