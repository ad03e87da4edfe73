"""The blob-store port: media bytes live here, never in the table.

Clients move bytes straight to and from the store through short-lived URLs
(`upload_url` for an HTTP PUT of the raw body, `download_url` for a GET); the
server itself only touches bytes in the media pipeline (`fetch_to_file`,
`put_file`). Two adapters:

- `S3BlobStore`: an aioboto3 S3 client and a bucket; URLs are SigV4 presigned.
- `LocalBlobStore`: files under a directory; URLs point back at the app
  (`resolvers.adapters.media_http`), signed with itsdangerous (salted), PUT URLs single-use.

Upload URL contract, identical on both adapters: the PUT must carry
`Content-Type` exactly equal to the `content_type` passed to `upload_url` and
a `Content-Length` header (any HTTP client sends it for a body of known size).
S3 binds both headers into the signature (`X-Amz-SignedHeaders=
content-length;content-type;host`), so real S3 refuses any other type and any
other length (403 SignatureDoesNotMatch). The local store refuses another type
(403) and a body over the announced size (413) but accepts a shorter one; the
caller checks the exact size with `head` when the upload is completed.

Keys are relative, `/`-separated paths (`validate_key`): no empty, `.` or `..`
segment, no segment starting with `.`, no backslash or control character. Both
adapters apply the same rule so a key that works locally works on S3.

Multipart uploads (large files, resumable): `start_multipart` opens one,
`part_url` signs a PUT of one part (exactly its size on S3: Content-Length is
signed; at most its size locally, like single PUT URLs; no Content-Type is
bound, the type was given when the upload started), `uploaded_parts` lists what
arrived (S3 `ListParts`), `complete_multipart` assembles the listed parts in
order into the object, and `abort_multipart` drops them. Parts of an upload
nobody completes go after `ABANDONED_UPLOAD_DAYS`: an S3 lifecycle rule on a
bucket this module creates (the deployment's template has the same rule), and
`LocalBlobStore.sweep_abandoned` locally. The server never holds a part in
memory: S3 parts go straight to S3, local ones stream to disk, and local
assembly copies file to file.

Storage classes: `archive` moves an object to GLACIER_IR (instant retrieval:
it stays downloadable, only cheaper to keep and dearer to read) and `restore`
moves it back to STANDARD. Both are idempotent. Writing an object again makes
it STANDARD, as a new S3 object is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, Protocol
from urllib.parse import quote, urlencode

from itsdangerous import Signer

STANDARD = "STANDARD"
GLACIER_IR = "GLACIER_IR"

MAX_KEY_BYTES = 1024
MAX_PARTS = 10_000  # S3's limit; part numbers are 1 to 10,000
# Parts of a multipart upload left this long after it started are dropped.
ABANDONED_UPLOAD_DAYS = 2
ABANDONED_UPLOAD_SECONDS = ABANDONED_UPLOAD_DAYS * 24 * 3600
_DELETE_BATCH = 1000  # DeleteObjects limit
_CHUNK = 1 << 20


# Errors -------------------------------------------------------------------


class BlobError(Exception):
    """Base of the blob store's errors."""


class InvalidBlobKey(BlobError, ValueError):
    """The key is not a safe relative path (see `validate_key`)."""


class BlobNotFound(BlobError):
    """No object under this key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no blob at {key!r}")
        self.key = key


class BlobAccessDenied(BlobError):
    """A local media URL was refused; `reason` is short and safe to show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BlobTooLarge(BlobError):
    """An upload body went over the size announced in its URL."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"body larger than the announced {max_bytes} bytes")
        self.max_bytes = max_bytes


class PartsChanged(BlobError):
    """The parts of a multipart upload changed between listing and completing it."""


@dataclass(frozen=True)
class Part:
    """A part of a multipart upload that has arrived."""

    number: int
    size: int
    etag: str = ""  # S3's, which completing the upload names; empty locally


def _check_part(part_number: int, size_bytes: int) -> None:
    if not 1 <= part_number <= MAX_PARTS:
        raise ValueError(f"part numbers go from 1 to {MAX_PARTS}")
    if size_bytes < 0:
        raise ValueError("size_bytes must not be negative")


# Keys ---------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")


def validate_key(key: str) -> str:
    """Return `key` unchanged if it is a safe relative path, else raise `InvalidBlobKey`."""
    if not key or len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidBlobKey("key must be 1 to 1024 bytes")
    if _CONTROL.search(key):
        raise InvalidBlobKey("key must not contain control characters or backslashes")
    for segment in key.split("/"):
        # Covers absolute paths (leading empty segment), '//', '.', '..' and
        # the local store's reserved directories (.used, .tmp, .archive).
        if not segment or segment.startswith("."):
            raise InvalidBlobKey(f"invalid key {key!r}")
    return key


# The port -----------------------------------------------------------------


class BlobStore(Protocol):
    async def upload_url(self, key: str, *, content_type: str, size_bytes: int, expires_in: int) -> str:
        """A URL an HTTP PUT of the raw body to stores the object.

        The PUT must send `Content-Type: <content_type>` and a Content-Length.
        """
        ...

    async def download_url(self, key: str, *, expires_in: int) -> str:
        """A URL an HTTP GET of returns the object."""
        ...

    async def head(self, key: str) -> int | None:
        """The object's size in bytes, or None if there is no object."""
        ...

    async def put_file(self, key: str, path: Path, content_type: str) -> None: ...

    async def fetch_to_file(self, key: str, path: Path) -> None:
        """Write the object to `path` (whole or not at all); `BlobNotFound` if missing."""
        ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete these objects; missing ones are ignored."""
        ...

    async def archive(self, key: str) -> None:
        """Move the object to GLACIER_IR; `BlobNotFound` if missing."""
        ...

    async def restore(self, key: str) -> None:
        """Move the object back to STANDARD; `BlobNotFound` if missing."""
        ...

    async def storage_class(self, key: str) -> str:
        """ "STANDARD" or "GLACIER_IR"; `BlobNotFound` if missing."""
        ...

    async def start_multipart(self, key: str, *, content_type: str) -> str:
        """Open a multipart upload of `key`; returns its id."""
        ...

    async def part_url(
        self, key: str, upload_id: str, part_number: int, *, size_bytes: int, expires_in: int
    ) -> str:
        """A URL an HTTP PUT of part `part_number` (`size_bytes` long) to stores it.

        Sending a part again replaces it. No Content-Type is needed.
        """
        ...

    async def uploaded_parts(self, key: str, upload_id: str) -> list[Part] | None:
        """The parts that have arrived, by number; None if the upload is no
        longer open (completed, aborted or cleaned up)."""
        ...

    async def complete_multipart(self, key: str, upload_id: str, parts: Sequence[Part]) -> None:
        """Write the object `key` from these parts (as `uploaded_parts` listed
        them), in order, and close the upload. `BlobNotFound` if the upload is
        no longer open; `PartsChanged` if a part was replaced since it was listed."""
        ...

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Close the upload and drop its parts; one no longer open is ignored."""
        ...


def _check_expiry(expires_in: int) -> None:
    if expires_in <= 0:
        raise ValueError("expires_in must be positive")


# S3 -----------------------------------------------------------------------


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
        _check_expiry(expires_in)
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
        _check_expiry(expires_in)
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
        tmp = await asyncio.to_thread(_temp_beside, path)
        try:
            await self._client.download_file(self.bucket, key, str(tmp))
            await asyncio.to_thread(os.replace, tmp, path)
        except Exception as exc:
            _discard(tmp)
            if _is_not_found(exc):
                raise BlobNotFound(key) from exc
            raise
        except BaseException:
            _discard(tmp)
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
        _check_expiry(expires_in)
        _check_part(part_number, size_bytes)
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


# Local --------------------------------------------------------------------

Method = Literal["GET", "PUT"]
_NONCE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class VerifiedUrl:
    """A local media URL whose signature, expiry, method and key checked out."""

    method: Method
    key: str
    expires: int
    nonce: str
    size: int | None  # PUT: the announced size, the most the body may be
    content_type: str | None  # PUT of a whole object: the Content-Type the request must carry
    upload_id: str | None = None  # PUT of a part: its multipart upload
    part: int | None = None  # PUT of a part: its number


def _discard(path: Path) -> None:
    # Sync on purpose: one quick syscall, and safe in a cancelled task's cleanup.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _flush_and_sync(out: BinaryIO) -> None:
    out.flush()
    os.fsync(out.fileno())


def _temp_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    return Path(name)


class LocalBlobStore:
    """Objects as files under `root`, served by the app itself (`resolvers.adapters.media_http`).

    Layout: `<root>/<key>` for objects, `<root>/.tmp/` for uploads in flight,
    `<root>/.used/<nonce>` for consumed PUT URLs (content: their expiry, so
    `prune_used` can drop them once they could no longer verify anyway),
    `<root>/.archive/<key>` as the marker of a GLACIER_IR object, and
    `<root>/.multipart/<upload id>/` for a multipart upload: `upload.json` (its
    key and when it started) and one `part-<n>` file per part that arrived.
    """

    def __init__(
        self, root: Path, base_url: str, secret: bytes, clock: Callable[[], float] = time.time
    ) -> None:
        if not secret:
            raise ValueError("secret must not be empty")
        self.root = Path(root)
        self.base_url = base_url.rstrip("/")
        # itsdangerous signs with a key derived from the secret and this salt, so
        # one configured secret serves tokens, cursors and media URLs apart.
        self._signer = Signer(secret, salt="mifamilias.media-url", digest_method=hashlib.sha256)
        self._clock = clock
        self._tmp = self.root / ".tmp"
        self._used = self.root / ".used"
        self._archive = self.root / ".archive"
        self._multipart = self.root / ".multipart"
        for directory in (self.root, self._tmp, self._used, self._archive, self._multipart):
            directory.mkdir(parents=True, exist_ok=True)

    # URLs

    @staticmethod
    def _message(
        method: str,
        key: str,
        expires: int,
        size: int | None,
        nonce: str,
        content_type: str | None,
        part: tuple[str, int] | None = None,
    ) -> bytes:
        signed: list[object] = [method, key, expires, size, nonce, content_type]
        if part is not None:  # a part's URL signs its upload and number too
            signed += list(part)
        return json.dumps(signed, separators=(",", ":")).encode()

    def _url(
        self,
        method: Method,
        key: str,
        expires_in: int,
        size: int | None,
        content_type: str | None,
        part: tuple[str, int] | None = None,
    ) -> str:
        validate_key(key)
        _check_expiry(expires_in)
        expires = int(self._clock()) + expires_in
        nonce = secrets.token_hex(16)
        params: dict[str, str] = {"method": method, "expires": str(expires)}
        if size is not None:
            params["size"] = str(size)
        if content_type is not None:
            params["content_type"] = content_type
        if part is not None:
            params["upload"], params["part"] = part[0], str(part[1])
        params["nonce"] = nonce
        message = self._message(method, key, expires, size, nonce, content_type, part)
        params["sig"] = self._signer.get_signature(message).decode()
        return f"{self.base_url}/media/{quote(key, safe='/')}?{urlencode(params)}"

    async def upload_url(self, key: str, *, content_type: str, size_bytes: int, expires_in: int) -> str:
        if size_bytes < 0:
            raise ValueError("size_bytes must not be negative")
        return self._url("PUT", key, expires_in, size_bytes, content_type)

    async def download_url(self, key: str, *, expires_in: int) -> str:
        return self._url("GET", key, expires_in, None, None)

    def verify(self, method: str, key: str, query_params: Mapping[str, str]) -> VerifiedUrl:
        """Check a media URL for `method` on `key`; raise `BlobAccessDenied` if it does not hold.

        For PUT this also refuses a URL whose nonce is already consumed, but
        only `claim` consumes it (atomically).
        """
        try:
            validate_key(key)
        except InvalidBlobKey:
            raise BlobAccessDenied("invalid key") from None
        part: tuple[str, int] | None = None
        try:
            url_method = query_params["method"]
            expires = int(query_params["expires"])
            nonce = query_params["nonce"]
            sig = query_params["sig"]
            size = int(query_params["size"]) if url_method == "PUT" else None
            if url_method == "PUT" and "upload" in query_params:
                part = (query_params["upload"], int(query_params["part"]))
                content_type = None
            else:
                content_type = query_params["content_type"] if url_method == "PUT" else None
        except (KeyError, ValueError):
            raise BlobAccessDenied("malformed url") from None
        signed_method: Method
        if url_method == "GET":
            signed_method = "GET"
        elif url_method == "PUT":
            signed_method = "PUT"
        else:
            raise BlobAccessDenied("malformed url")
        if not _NONCE.fullmatch(nonce) or (size is not None and size < 0):
            raise BlobAccessDenied("malformed url")
        if part is not None and (not _NONCE.fullmatch(part[0]) or not 1 <= part[1] <= MAX_PARTS):
            raise BlobAccessDenied("malformed url")
        message = self._message(signed_method, key, expires, size, nonce, content_type, part)
        if not self._signer.verify_signature(message, sig.encode()):
            raise BlobAccessDenied("bad signature")
        if signed_method != method:
            raise BlobAccessDenied(f"url is for {signed_method}")
        if self._clock() > expires:
            raise BlobAccessDenied("url expired")
        if signed_method == "PUT" and (self._used / nonce).exists():
            raise BlobAccessDenied("url already used")
        if part is None:
            return VerifiedUrl(signed_method, key, expires, nonce, size, content_type)
        return VerifiedUrl(signed_method, key, expires, nonce, size, None, part[0], part[1])

    def claim(self, verified: VerifiedUrl) -> None:
        """Consume a PUT URL: the first caller wins, across processes too (O_EXCL)."""
        if verified.method != "PUT":
            raise ValueError("only PUT urls are single-use")
        try:
            fd = os.open(self._used / verified.nonce, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise BlobAccessDenied("url already used") from None
        try:
            try:
                os.write(fd, str(verified.expires).encode())
            finally:
                os.close(fd)
        except OSError:
            self.release(verified)  # a full disk took the marker: the URL stays usable
            raise

    def release(self, verified: VerifiedUrl) -> None:
        """Give a claimed PUT URL back: its body did not land (a full disk, the
        client gone), so the client may send it again with the same URL."""
        (self._used / verified.nonce).unlink(missing_ok=True)

    def prune_used(self) -> int:
        """Forget consumed nonces whose URLs have expired; returns how many."""
        now = self._clock()
        removed = 0
        for marker in self._used.iterdir():
            try:
                expires = int(marker.read_text() or "0")
            except (OSError, ValueError):
                continue
            if expires < now:
                marker.unlink(missing_ok=True)
                removed += 1
        return removed

    # Files

    def path_for(self, key: str) -> Path:
        """Where the object for `key` lives (it may not exist)."""
        validate_key(key)
        path = self.root / key
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise InvalidBlobKey(f"invalid key {key!r}")
        return path

    def _archive_marker(self, key: str) -> Path:
        return self._archive / validate_key(key)

    def _commit(self, tmp: Path, key: str) -> None:
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
        self._archive_marker(key).unlink(missing_ok=True)  # a new object is STANDARD

    async def receive(self, key: str, stream: AsyncIterator[bytes], max_bytes: int) -> int:
        """Store a body from `stream` under `key`; returns its length.

        Bytes go to a temp file renamed into place at the end; over `max_bytes`
        raises `BlobTooLarge`. On any failure nothing is left on disk.
        """
        self.path_for(key)
        return await self._stream_to(stream, max_bytes, lambda tmp: self._commit(tmp, key))

    async def _stream_to(
        self, stream: AsyncIterator[bytes], max_bytes: int, commit: Callable[[Path], None]
    ) -> int:
        """Write `stream` to a temp file chunk by chunk, then `commit` it (in a thread)."""
        fd, name = tempfile.mkstemp(dir=self._tmp, suffix=".part")
        tmp = Path(name)
        total = 0
        try:
            with os.fdopen(fd, "wb") as out:
                async for chunk in stream:
                    total += len(chunk)
                    if total > max_bytes:
                        raise BlobTooLarge(max_bytes)
                    if chunk:
                        await asyncio.to_thread(out.write, chunk)
                await asyncio.to_thread(_flush_and_sync, out)
            await asyncio.to_thread(commit, tmp)
        except BaseException:
            _discard(tmp)
            raise
        return total

    # Multipart

    def _upload_dir(self, key: str, upload_id: str) -> Path:
        """The open upload's folder; `BlobNotFound` if it is not open (or not `key`'s)."""
        validate_key(key)
        folder = self._multipart / upload_id
        if not _NONCE.fullmatch(upload_id):
            raise BlobNotFound(key)
        try:
            meta = json.loads((folder / "upload.json").read_text())
        except (OSError, ValueError):
            raise BlobNotFound(key) from None
        if meta.get("key") != key:
            raise BlobNotFound(key)
        return folder

    def _start_multipart(self, key: str) -> str:
        upload_id = secrets.token_hex(16)
        # Made aside and renamed into place, so an open upload always has its upload.json.
        folder = Path(tempfile.mkdtemp(dir=self._tmp, prefix=".upload-"))
        try:
            (folder / "upload.json").write_text(json.dumps({"key": key, "started": self._clock()}))
            os.rename(folder, self._multipart / upload_id)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return upload_id

    async def start_multipart(self, key: str, *, content_type: str) -> str:
        # The content type is not kept: GET guesses it from the key's extension.
        validate_key(key)
        return await asyncio.to_thread(self._start_multipart, key)

    async def part_url(
        self, key: str, upload_id: str, part_number: int, *, size_bytes: int, expires_in: int
    ) -> str:
        _check_part(part_number, size_bytes)
        if not _NONCE.fullmatch(upload_id):
            raise ValueError("not an upload id of this store")
        return self._url("PUT", key, expires_in, size_bytes, None, (upload_id, part_number))

    async def receive_part(self, verified: VerifiedUrl, stream: AsyncIterator[bytes]) -> int:
        """Store one part of a multipart upload from `stream` (a verified, claimed
        part URL); returns its length. Streams to a temp file renamed into the
        upload's folder at the end, replacing an earlier copy of the part.
        `BlobTooLarge` over the URL's size; `BlobNotFound` if the upload is not
        open (before reading, or when the part lands). Nothing is left on failure."""
        if verified.upload_id is None or verified.part is None or verified.size is None:
            raise ValueError("not a part url")
        folder = await asyncio.to_thread(self._upload_dir, verified.key, verified.upload_id)
        target = folder / f"part-{verified.part}"

        def commit(tmp: Path) -> None:
            try:
                os.rename(tmp, target)  # the folder is gone once the upload completed or was dropped
            except FileNotFoundError:
                raise BlobNotFound(verified.key) from None

        return await self._stream_to(stream, verified.size, commit)

    def _uploaded_parts(self, key: str, upload_id: str) -> list[Part] | None:
        try:
            folder = self._upload_dir(key, upload_id)
            names = os.listdir(folder)
        except (BlobNotFound, FileNotFoundError):
            return None
        parts = []
        for name in names:
            number = name.removeprefix("part-")
            if name.startswith("part-") and number.isdigit():
                with contextlib.suppress(FileNotFoundError):
                    parts.append(Part(int(number), (folder / name).stat().st_size))
        return sorted(parts, key=lambda part: part.number)

    async def uploaded_parts(self, key: str, upload_id: str) -> list[Part] | None:
        return await asyncio.to_thread(self._uploaded_parts, key, upload_id)

    def _complete_multipart(self, key: str, upload_id: str, parts: Sequence[Part]) -> None:
        folder = self._upload_dir(key, upload_id)
        # Take the folder away first: a part arriving late, or a second
        # completion, then finds the upload closed instead of changing it.
        taken = Path(tempfile.mkdtemp(dir=self._tmp, prefix=".assembling-")) / upload_id
        try:
            os.rename(folder, taken)
        except FileNotFoundError:
            taken.parent.rmdir()
            raise BlobNotFound(key) from None
        fd, name = tempfile.mkstemp(dir=self._tmp, suffix=".part")
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    path = taken / f"part-{part.number}"
                    try:
                        with path.open("rb") as source:
                            if os.fstat(source.fileno()).st_size != part.size:
                                raise PartsChanged(f"part {part.number} of {key!r} changed")
                            shutil.copyfileobj(source, out, _CHUNK)
                    except FileNotFoundError:
                        raise PartsChanged(f"part {part.number} of {key!r} is gone") from None
                _flush_and_sync(out)
            self._commit(tmp, key)
        except BaseException:
            tmp.unlink(missing_ok=True)
            os.rename(taken, folder)  # the upload is open again, as it was
            taken.parent.rmdir()
            raise
        shutil.rmtree(taken.parent, ignore_errors=True)

    async def complete_multipart(self, key: str, upload_id: str, parts: Sequence[Part]) -> None:
        await asyncio.to_thread(self._complete_multipart, key, upload_id, parts)

    def _abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            folder = self._upload_dir(key, upload_id)
        except BlobNotFound:
            return
        shutil.rmtree(folder, ignore_errors=True)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        await asyncio.to_thread(self._abort_multipart, key, upload_id)

    def sweep_abandoned(self, max_age_seconds: float = ABANDONED_UPLOAD_SECONDS) -> int:
        """Drop multipart uploads started more than `max_age_seconds` ago, and
        temp files (an upload cut off by a crash) untouched that long, as S3's
        lifecycle rule does for its uploads; returns how many went."""
        cutoff = self._clock() - max_age_seconds
        removed = 0
        for folder in list(self._multipart.iterdir()):
            try:
                started = float(json.loads((folder / "upload.json").read_text())["started"])
            except (OSError, ValueError, KeyError, TypeError):
                try:
                    started = folder.stat().st_mtime
                except FileNotFoundError:
                    continue
            if started < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        for leftover in list(self._tmp.iterdir()):
            try:
                if leftover.stat().st_mtime >= cutoff:
                    continue
            except FileNotFoundError:
                continue
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
            removed += 1
        return removed

    async def head(self, key: str) -> int | None:
        path = self.path_for(key)
        try:
            stat = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return None
        return stat.st_size

    def _put_file(self, key: str, source: Path) -> None:
        self.path_for(key)
        fd, name = tempfile.mkstemp(dir=self._tmp, suffix=".part")
        os.close(fd)
        tmp = Path(name)
        try:
            shutil.copyfile(source, tmp)
            self._commit(tmp, key)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    async def put_file(self, key: str, path: Path, content_type: str) -> None:
        # The content type is not kept: GET guesses it from the key's extension.
        await asyncio.to_thread(self._put_file, key, path)

    def _fetch_to_file(self, key: str, path: Path) -> None:
        source = self.path_for(key)
        if not source.is_file():
            raise BlobNotFound(key)
        tmp = _temp_beside(path)
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, path)
        except FileNotFoundError as exc:
            tmp.unlink(missing_ok=True)
            raise BlobNotFound(key) from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    async def fetch_to_file(self, key: str, path: Path) -> None:
        await asyncio.to_thread(self._fetch_to_file, key, path)

    def _delete(self, keys: Sequence[str]) -> None:
        paths = [(self.path_for(key), self._archive_marker(key)) for key in keys]
        for path, marker in paths:
            path.unlink(missing_ok=True)
            marker.unlink(missing_ok=True)

    async def delete(self, keys: Sequence[str]) -> None:
        await asyncio.to_thread(self._delete, keys)

    def _storage_class(self, key: str) -> str:
        if not self.path_for(key).is_file():
            raise BlobNotFound(key)
        return GLACIER_IR if self._archive_marker(key).exists() else STANDARD

    async def storage_class(self, key: str) -> str:
        return await asyncio.to_thread(self._storage_class, key)

    def _set_storage_class(self, key: str, storage_class: str) -> None:
        if not self.path_for(key).is_file():
            raise BlobNotFound(key)
        marker = self._archive_marker(key)
        if storage_class == GLACIER_IR:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        else:
            marker.unlink(missing_ok=True)

    async def archive(self, key: str) -> None:
        await asyncio.to_thread(self._set_storage_class, key, GLACIER_IR)

    async def restore(self, key: str) -> None:
        await asyncio.to_thread(self._set_storage_class, key, STANDARD)
