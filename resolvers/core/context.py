"""The per-request context: who is asking, their loaders, and the services
(as `resolvers.core.ports` describes them)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from cachetools import LRUCache

from resolvers.core import idempotency, logs
from resolvers.core.auth import Claims, TokenExpired, bearer_token
from resolvers.core.caches import lru
from resolvers.core.errors import ApiError, Unauthenticated
from resolvers.core.loaders import Loaders
from resolvers.core.ports import ContextServices
from resolvers.core.ratelimit import Transact, client_address
from store import items, keys
from store.port import ConditionFailed, NotExists, Table, WriteOp

T = TypeVar("T")

MAX_DOCUMENTS_TO_REGISTER = 16


def utc_now() -> datetime:
    return datetime.now(UTC)


class KnownUsers:
    """User ids this process has seen a profile for, so the first-request
    check costs one read per user per process, not one per request."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._ids: LRUCache[str, bool] = lru(capacity)
        self.capacity = capacity

    def __contains__(self, user_id: str) -> bool:
        return self._ids.get(user_id, False)  # a look-up that keeps the id recent

    def add(self, user_id: str) -> None:
        self._ids[user_id] = True

    def discard(self, user_id: str) -> None:
        """Forgets one person (their account was deleted): their next request
        checks the profile again."""
        self._ids.pop(user_id, None)


@dataclass
class Context:
    services: ContextServices
    request: Any = None
    response: Any = None
    claims: Claims | None = None
    auth_error: ApiError | None = None
    connection_params: dict[str, Any] | None = None
    # The request's (or the WebSocket connection's) id, as its log lines carry it.
    request_id: str = field(default_factory=logs.new_request_id)
    _loaders: Loaders | None = field(default=None, init=False, repr=False)
    # The rate-limit window each action's counter was seen in (see RateLimiter.count).
    _rate_windows: dict[str, int | None] = field(default_factory=dict, init=False, repr=False)
    # Persisted queries sent with their hash, to store once their operation
    # has passed every check: document -> hash (see `register_later`).
    documents_to_register: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def loaders(self) -> Loaders:
        # Made on first use: an idle subscription holds none.
        if self._loaders is None:
            self._loaders = Loaders(self.services.table, owner=self)
        return self._loaders

    def forget_loaders(self) -> None:
        """A new operation, or a new subscription event, starts with an empty cache."""
        self._loaders = None

    def register_later(self, query: str, sha256: str) -> None:
        """Remembers a document to store once its operation passes validation,
        sign-in and the cost limit. A WebSocket keeps its context for many
        operations: those that never get that far are forgotten, oldest first."""
        self.documents_to_register[query] = sha256
        while len(self.documents_to_register) > MAX_DOCUMENTS_TO_REGISTER:
            del self.documents_to_register[next(iter(self.documents_to_register))]

    @property
    def table(self) -> Table:
        # While a mutation with an Idempotency-Key runs, its first write carries the key.
        return idempotency.keyed(self.services.table)

    async def check_rate(self, action: str) -> None:
        """RATE_LIMITED when the viewer has used up their `action`s for now."""
        subject = f"user:{await self.viewer_id()}"
        self._rate_windows[action] = await self.services.rates.check(subject, action, self.services.now())

    async def counted(self, action: str, ops: Sequence[WriteOp], transact: Transact | None = None) -> None:
        """Runs the operation's transaction with one `action` by the viewer
        counted in it, under the limit's condition (RATE_LIMITED, and nothing
        written, when the window is full); `transact` commits it, if not the table."""
        seen = self._rate_windows.get(action)
        subject = f"user:{await self.viewer_id()}"
        # Through ctx.table by default: with an Idempotency-Key, the key joins the transaction.
        await self.services.rates.counted(
            subject, action, self.services.now(), ops, seen, transact or self.table.transact
        )

    def client_address(self) -> str:
        """Who is asking, on the network: the peer, or what a trusted proxy says."""
        client = getattr(self.request, "client", None)
        headers = getattr(self.request, "headers", None)
        forwarded = headers.get("x-forwarded-for") if headers is not None else None
        return client_address(
            client.host if client else None, forwarded, self.services.settings.trusted_proxies
        )

    async def authenticate(self, authorization: str | None) -> None:
        try:
            token = bearer_token(authorization)
            if token is None:
                self.claims, self.auth_error = None, Unauthenticated("sign in: send a Bearer token")
                return
            self.claims = await self.services.verifier.verify(token)
            self.auth_error = None
            logs.set_viewer(self.claims.sub)
        except ApiError as error:
            self.claims, self.auth_error = None, error

    def signed_in_error(self) -> ApiError | None:
        """Why this context may not run an operation now, or None when it may.
        A WebSocket keeps its context for hours: the token's expiry counts at
        every operation, not only at the handshake."""
        if self.claims is None:
            return self.auth_error or Unauthenticated("sign in: send a Bearer token")
        if self.claims.expired():
            return TokenExpired()
        return None

    def signed_in_id(self) -> str:
        """The signed-in user's id as the token says, without creating their
        User (what counts against them before the operation runs)."""
        refusal = self.signed_in_error()
        if refusal is not None or self.claims is None:
            raise refusal or Unauthenticated("sign in: send a Bearer token")
        return self.claims.sub

    async def viewer_id(self) -> str:
        """The signed-in user's id; creates their User on their first request."""
        refusal = self.signed_in_error()
        if refusal is not None or self.claims is None:
            raise refusal or Unauthenticated("sign in: send a Bearer token")
        user_id = self.claims.sub
        if user_id not in self.services.known_users:
            with idempotency.aside():  # the person's profile, not the mutation's write
                await self._ensure_user(self.claims)
            self.services.known_users.add(user_id)
        return user_id

    async def _ensure_user(self, claims: Claims) -> None:
        # A deletion under way (its marker, read in the same batch) is finished
        # first; the person then starts again with a fresh profile.
        existing, deleting = await self.loaders.many(
            [keys.user(claims.sub), keys.account_deletion(claims.sub)]
        )
        if deleting is not None:
            await self.services.accounts.finish(self, claims.sub)
            existing = None
        if existing is not None:
            return
        user = items.User(
            id=claims.sub,
            created_at=self.services.now_iso(),
            email=claims.email,
            given_name=claims.given_name,
            family_name=claims.family_name,
            profile_image_url=claims.picture,
        )
        with contextlib.suppress(ConditionFailed):  # a parallel first request created it
            await self.table.put(user.to_item(), NotExists())
        self.loaders.item.clear(user.key)
