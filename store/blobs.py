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
    content_type: str | None  # PUT: the Content-Type the request must carry


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
    `prune_used` can drop them once they could no longer verify anyway) and
    `<root>/.archive/<key>` as the marker of a GLACIER_IR object.
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
        for directory in (self.root, self._tmp, self._used, self._archive):
            directory.mkdir(parents=True, exist_ok=True)

    # URLs

    def _sign(
        self, method: str, key: str, expires: int, size: int | None, nonce: str, content_type: str | None
    ) -> str:
        return self._signer.get_signature(
            self._message(method, key, expires, size, nonce, content_type)
        ).decode()

    @staticmethod
    def _message(
        method: str, key: str, expires: int, size: int | None, nonce: str, content_type: str | None
    ) -> bytes:
        return json.dumps([method, key, expires, size, nonce, content_type], separators=(",", ":")).encode()

    def _url(
        self, method: Method, key: str, expires_in: int, size: int | None, content_type: str | None
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
        params["nonce"] = nonce
        params["sig"] = self._sign(method, key, expires, size, nonce, content_type)
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
        try:
            url_method = query_params["method"]
            expires = int(query_params["expires"])
            nonce = query_params["nonce"]
            sig = query_params["sig"]
            size = int(query_params["size"]) if url_method == "PUT" else None
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
        message = self._message(signed_method, key, expires, size, nonce, content_type)
        if not self._signer.verify_signature(message, sig.encode()):
            raise BlobAccessDenied("bad signature")
        if signed_method != method:
            raise BlobAccessDenied(f"url is for {signed_method}")
        if self._clock() > expires:
            raise BlobAccessDenied("url expired")
        if signed_method == "PUT" and (self._used / nonce).exists():
            raise BlobAccessDenied("url already used")
        return VerifiedUrl(signed_method, key, expires, nonce, size, content_type)

    def claim(self, verified: VerifiedUrl) -> None:
        """Consume a PUT URL: the first caller wins, across processes too (O_EXCL)."""
        if verified.method != "PUT":
            raise ValueError("only PUT urls are single-use")
        try:
            fd = os.open(self._used / verified.nonce, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise BlobAccessDenied("url already used") from None
        try:
            os.write(fd, str(verified.expires).encode())
        finally:
            os.close(fd)

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
            await asyncio.to_thread(self._commit, tmp, key)
        except BaseException:
            _discard(tmp)
            raise
        return total

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
