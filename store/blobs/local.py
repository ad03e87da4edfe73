"""The blob store on local files, served by the app itself: signed URLs
(itsdangerous, salted), single-use PUT URLs, multipart uploads assembled file
to file. The contract is `store.blobs.port`'s."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import quote, urlencode

from itsdangerous import Signer

from store.blobs.port import (
    ABANDONED_UPLOAD_SECONDS,
    GLACIER_IR,
    MAX_PARTS,
    STANDARD,
    BlobAccessDenied,
    BlobNotFound,
    BlobTooLarge,
    BlobTooSmall,
    InvalidBlobKey,
    Part,
    PartsChanged,
    check_expiry,
    check_part,
    discard,
    temp_beside,
    validate_key,
)

_CHUNK = 1 << 20


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


def _flush_and_sync(out: BinaryIO) -> None:
    out.flush()
    os.fsync(out.fileno())


_HOST = socket.gethostname().replace(".", "_")


def _writer() -> str:
    """The start of a temp file's name: which host and process write it."""
    return f"{_HOST}.{os.getpid()}."


def _orphaned(name: str) -> bool:
    """Whether a temp file's writer was a process of this host that is gone.
    (A name without a writer, or another host's, is left to the age sweep.)"""
    host, _, rest = name.partition(".")
    pid, _, _ = rest.partition(".")
    if host != _HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


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
        check_expiry(expires_in)
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

    async def receive(
        self, key: str, stream: AsyncIterator[bytes], max_bytes: int, min_bytes: int = 0
    ) -> int:
        """Store a body from `stream` under `key`; returns its length.

        Bytes go to a temp file renamed into place at the end; over `max_bytes`
        raises `BlobTooLarge`, and ending under `min_bytes` raises `BlobTooSmall`.
        On any failure nothing is left on disk.
        """
        self.path_for(key)
        return await self._stream_to(stream, max_bytes, lambda tmp: self._commit(tmp, key), min_bytes)

    async def _stream_to(
        self, stream: AsyncIterator[bytes], max_bytes: int, commit: Callable[[Path], None], min_bytes: int = 0
    ) -> int:
        """Write `stream` to a temp file chunk by chunk, then `commit` it (in a thread)."""
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix=_writer(), suffix=".part")
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
                if total < min_bytes:
                    raise BlobTooSmall(total, min_bytes)
                await asyncio.to_thread(_flush_and_sync, out)
            await asyncio.to_thread(commit, tmp)
        except BaseException:
            discard(tmp)
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
        folder = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"{_writer()}upload-"))
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
        check_part(part_number, size_bytes)
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
        taken = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"{_writer()}assembling-")) / upload_id
        try:
            os.rename(folder, taken)
        except FileNotFoundError:
            taken.parent.rmdir()
            raise BlobNotFound(key) from None
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix=_writer(), suffix=".part")
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
        lifecycle rule does for its uploads; returns how many went. A temp file
        whose writer, a process of this host, is gone goes at once: the sweep
        runs as a server starts, so what a killed one left goes with its restart."""
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
                if leftover.stat().st_mtime >= cutoff and not _orphaned(leftover.name):
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
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix=_writer(), suffix=".part")
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
        tmp = temp_beside(path)
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
