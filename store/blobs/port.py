"""The blob-store port: media bytes live here, never in the table.

Clients move bytes straight to and from the store through short-lived URLs
(`upload_url` for an HTTP PUT of the raw body, `download_url` for a GET); the
server itself only touches bytes in the media pipeline (`fetch_to_file`,
`put_file`). Two adapters, one module each:

- `store.blobs.s3.S3BlobStore`: an aioboto3 S3 client and a bucket; URLs are
  SigV4 presigned.
- `store.blobs.local.LocalBlobStore`: files under a directory; URLs point back
  at the app (`resolvers.adapters.media_http`), signed with itsdangerous
  (salted), PUT URLs single-use.

One contract suite runs on both: `tests/store/test_blobs.py`.

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

import contextlib
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

STANDARD = "STANDARD"
GLACIER_IR = "GLACIER_IR"

MAX_KEY_BYTES = 1024
MAX_PARTS = 10_000  # S3's limit; part numbers are 1 to 10,000
# Parts of a multipart upload left this long after it started are dropped.
ABANDONED_UPLOAD_DAYS = 2
ABANDONED_UPLOAD_SECONDS = ABANDONED_UPLOAD_DAYS * 24 * 3600


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


class BlobTooSmall(BlobError):
    """An upload body ended before the size announced in its URL."""

    def __init__(self, received: int, announced: int) -> None:
        super().__init__(f"the body has {received} bytes, but {announced} were announced")
        self.received = received
        self.announced = announced


class PartsChanged(BlobError):
    """The parts of a multipart upload changed between listing and completing it."""


@dataclass(frozen=True)
class Part:
    """A part of a multipart upload that has arrived."""

    number: int
    size: int
    etag: str = ""  # S3's, which completing the upload names; empty locally


def check_part(part_number: int, size_bytes: int) -> None:
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


def check_expiry(expires_in: int) -> None:
    if expires_in <= 0:
        raise ValueError("expires_in must be positive")


# Shared by both adapters --------------------------------------------------


def discard(path: Path) -> None:
    # Sync on purpose: one quick syscall, and safe in a cancelled task's cleanup.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def temp_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    return Path(name)
