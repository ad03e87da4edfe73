"""Persisted operations: Apollo's automatic persisted queries (APQ), and the
opt-in list of trusted documents.

APQ (on by default): a request may carry `extensions.persistedQuery =
{version: 1, sha256Hash}`. With the query beside it, the hash must be the
SHA-256 (hex) of the query text; the query runs, and once it has passed
validation, sign-in and the cost limit the document is stored in the table
(`PERSISTED#<hash>` / `DOC`, with a TTL) so that every server process can run
it from the hash alone. A hash alone that nobody registered answers
PERSISTED_QUERY_NOT_FOUND, and the client sends it again with the query.
An in-process LRU sits in front of the table: after the first use in a
process, a hash costs no store call.

Trusted documents (`MIFAMILIAS_TRUSTED_DOCUMENTS`): a manifest lists the only
documents that run, by id or by their text; anything else answers
PERSISTED_QUERY_NOT_IN_LIST, and nothing is registered.

Nothing here knows GraphQL: the schema's side decides what is introspection
and validates manifests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cachetools import LRUCache

from resolvers.core.caches import lru
from resolvers.core.errors import BadInput, PersistedQueryNotFound, PersistedQueryNotInList, RateLimited
from resolvers.core.ratelimit import RateLimiter
from store import keys
from store.items import PersistedDocument
from store.port import Put, Table

log = logging.getLogger("mifamilias.persisted")

APQ_VERSION = 1
# A document lives this long after it was last written...
TTL = timedelta(days=30)
# ...and a process that uses it writes it again once it is this old, so a
# document in use never expires and is written about once a week per process.
REFRESH_AFTER = timedelta(days=7)
CACHE_SIZE = 1000
# Persisted queries are queries: the largest of ours is a few kilobytes.
MAX_DOCUMENT_CHARS = 16 * 1024
APOLLO_FORMAT = "apollo-persisted-query-manifest"

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

MISMATCH = "provided sha does not match query"


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def requested_hash(extensions: object) -> str | None:
    """The hash in `extensions.persistedQuery`, or None when there is none."""
    if not isinstance(extensions, Mapping):
        return None
    persisted = extensions.get("persistedQuery")
    if persisted is None:
        return None
    if not isinstance(persisted, Mapping):
        raise BadInput("extensions.persistedQuery must be an object: {version: 1, sha256Hash: ...}")
    if persisted.get("version") != APQ_VERSION:
        raise BadInput(f"unsupported persisted query version {persisted.get('version')!r}: send version 1")
    found = persisted.get("sha256Hash")
    if not isinstance(found, str) or not found:
        raise BadInput("extensions.persistedQuery.sha256Hash must be a non-empty string")
    return found


@dataclass(frozen=True)
class Resolved:
    """The document to run, and the hash to register it under once it has
    passed every check (None when it needs no write)."""

    query: str
    register: str | None = None


# Trusted documents ------------------------------------------------------------------


class ManifestError(ValueError):
    """A trusted-documents manifest the server cannot use."""


@dataclass(frozen=True)
class ManifestEntry:
    id: str
    body: str
    name: str | None = None


def parse_manifest(data: object) -> list[ManifestEntry]:
    """The operations of a manifest in Apollo's format
    (`{"format": "apollo-persisted-query-manifest", "version": 1, "operations":
    [{"id", "body", "name", "type"}]}`) or Relay's (`{id: document}`)."""
    if isinstance(data, dict) and data.get("format") == APOLLO_FORMAT:
        if data.get("version") != 1:
            raise ManifestError(f"{APOLLO_FORMAT} version {data.get('version')!r} is not supported (only 1)")
        operations = data.get("operations")
        if not isinstance(operations, list):
            raise ManifestError('an Apollo manifest needs an "operations" list')
        entries = []
        for n, operation in enumerate(operations):
            if not (
                isinstance(operation, dict)
                and isinstance(operation.get("id"), str)
                and operation["id"]
                and isinstance(operation.get("body"), str)
            ):
                raise ManifestError(f"operations[{n}] needs a non-empty string id and a string body")
            name = operation.get("name")
            entries.append(
                ManifestEntry(operation["id"], operation["body"], name if isinstance(name, str) else None)
            )
    elif isinstance(data, dict) and all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in data.items()
    ):
        entries = [ManifestEntry(id_, body) for id_, body in data.items()]
    else:
        raise ManifestError(
            f'expected Apollo\'s manifest ({{"format": "{APOLLO_FORMAT}", "version": 1, '
            '"operations": [...]}) or Relay\'s ({"<id>": "<document>", ...})'
        )
    bodies: dict[str, str] = {}
    for entry in entries:
        if bodies.setdefault(entry.id, entry.body) != entry.body:
            raise ManifestError(f"id {entry.id} is listed twice with different documents")
    return entries


def load_manifest(path: Path) -> list[ManifestEntry]:
    try:
        data = json.loads(path.read_bytes())
    except OSError as error:
        raise ManifestError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise ManifestError(f"{path} is not JSON: {error}") from None
    try:
        return parse_manifest(data)
    except ManifestError as error:
        raise ManifestError(f"{path}: {error}") from None


class TrustedDocuments:
    """The only documents that run: by id (the manifest's, or the SHA-256 of a
    body), or sent in full with a text that is listed."""

    def __init__(self, entries: Iterable[ManifestEntry]) -> None:
        self._by_id: dict[str, str] = {}
        self._listed: set[str] = set()
        for entry in entries:
            digest = sha256_hex(entry.body)
            self._by_id[entry.id] = entry.body
            self._by_id.setdefault(digest, entry.body)
            self._listed.add(digest)

    def __len__(self) -> int:
        return len(self._listed)

    def body(self, id_: str) -> str | None:
        return self._by_id.get(id_)

    def lists(self, query: str) -> bool:
        return sha256_hex(query) in self._listed

    def resolve(
        self, query: str | None, hash_: str | None, unlisted_allowed: Callable[[str], bool]
    ) -> Resolved:
        if query:
            if hash_ is not None and hash_ != sha256_hex(query) and self.body(hash_) != query:
                raise BadInput(MISMATCH)
            if self.lists(query) or unlisted_allowed(query):
                return Resolved(query)
            raise PersistedQueryNotInList(
                "this document is not in the server's list of trusted documents: "
                "send the id of a listed one in extensions.persistedQuery.sha256Hash"
            )
        if hash_ is None:
            raise BadInput("no GraphQL query in the request: send a 'query'")
        body = self.body(hash_)
        if body is None:
            raise PersistedQueryNotInList(f"{hash_} is not in the server's list of trusted documents")
        return Resolved(body)


# Automatic persisted queries ------------------------------------------------------


def _never(query: str) -> bool:
    return False


class PersistedDocuments:
    """What a request's `query` and `extensions` mean: the document to run,
    found in the trusted list, the in-process cache or the table."""

    def __init__(
        self,
        table: Table,
        clock: Callable[[], datetime],
        *,
        trusted: TrustedDocuments | None = None,
        ttl: timedelta = TTL,
        refresh_after: timedelta = REFRESH_AFTER,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.table = table
        self.clock = clock
        self.trusted = trusted
        self.ttl = ttl
        self.refresh_after = refresh_after
        self.cache_size = cache_size
        # hash -> (document, when its item expires), most recently used last
        self._cache: LRUCache[str, tuple[str, int]] = lru(cache_size)

    def _now(self) -> int:
        return int(self.clock().timestamp())

    def _due(self, expires_at: int) -> bool:
        """Whether the item was written longer than `refresh_after` ago."""
        return expires_at - self._now() < (self.ttl - self.refresh_after).total_seconds()

    def _remember(self, hash_: str, body: str, expires_at: int) -> None:
        self._cache[hash_] = (body, expires_at)

    def _cached(self, hash_: str) -> tuple[str, int] | None:
        return self._cache.get(hash_)

    async def resolve(
        self, query: str | None, extensions: object, unlisted_allowed: Callable[[str], bool] = _never
    ) -> Resolved:
        """The document a request runs. BAD_USER_INPUT for a malformed
        persistedQuery or a hash that is not the query's; PERSISTED_QUERY_NOT_FOUND
        for an unknown hash alone; PERSISTED_QUERY_NOT_IN_LIST for anything
        unlisted when trusted documents are on (`unlisted_allowed` may let some
        through, e.g. introspection)."""
        hash_ = requested_hash(extensions)
        if self.trusted is not None:
            return self.trusted.resolve(query, hash_, unlisted_allowed)
        if hash_ is None:
            if not query:
                raise BadInput("no GraphQL query in the request: send a 'query'")
            return Resolved(query)
        if query:
            if sha256_hex(query) != hash_:
                raise BadInput(MISMATCH)
            if len(query) > MAX_DOCUMENT_CHARS:
                raise BadInput(
                    f"a persisted query may be at most {MAX_DOCUMENT_CHARS} characters; "
                    "send this one without extensions.persistedQuery"
                )
            cached = self._cached(hash_)
            if cached is not None and not self._due(cached[1]):
                return Resolved(query)
            return Resolved(query, register=hash_)
        if not _SHA256_HEX.fullmatch(hash_):
            raise BadInput("extensions.persistedQuery.sha256Hash must be 64 lower-case hex digits")
        found = self._cached(hash_) or await self._load(hash_)
        if found is None:
            raise PersistedQueryNotFound("PersistedQueryNotFound")
        body, expires_at = found
        if self._due(expires_at):
            await self.register(hash_, body)
        return Resolved(body)

    async def _load(self, hash_: str) -> tuple[str, int] | None:
        item = await self.table.get(keys.persisted_document(hash_))
        if item is None:
            return None
        document = PersistedDocument.from_item(item)
        # Expired items linger until DynamoDB deletes them (SQLite never does).
        if document.expires_at <= self._now() or sha256_hex(document.body) != hash_:
            return None
        self._remember(hash_, document.body, document.expires_at)
        return document.body, document.expires_at

    async def register(self, hash_: str, query: str, by: tuple[RateLimiter, str] | None = None) -> None:
        """Stores (or refreshes) a document whose hash was checked; `by` (the
        limiter and the person) counts a new one against the person's
        `persist` limit, in the same write. A failed or refused write is logged
        and costs the client a PERSISTED_QUERY_NOT_FOUND later, never the
        operation at hand."""
        document = PersistedDocument(
            sha256=hash_, body=query, expires_at=self._now() + int(self.ttl.total_seconds())
        )
        try:
            if by is None:
                await self.table.put(document.to_item())
            else:
                rates, subject = by
                await rates.counted(subject, "persist", self.clock(), [Put(document.to_item())])
        except RateLimited:
            log.info("not storing persisted document %s: %s has stored their most for now", hash_, by)
            return
        except Exception:
            log.exception("could not store persisted document %s", hash_)
            return
        self._remember(hash_, query, document.expires_at)
