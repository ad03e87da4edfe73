"""Bearer JWTs: HS256 with a local secret for development, RS256 against a JWKS
URL (Cognito, Auth0 and the like) in production."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import jwt

from resolvers.core.errors import Unauthenticated
from resolvers.core.validation import claim_text, subject_problem


@dataclass(frozen=True)
class Claims:
    sub: str
    email: str | None = None
    given_name: str | None = None
    family_name: str | None = None
    picture: str | None = None
    expires_at: float | None = None  # the token's `exp`, in seconds since the epoch

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Claims:
        sub = payload.get("sub")
        problem = subject_problem(sub)
        if problem is not None:
            raise Unauthenticated(problem)
        assert isinstance(sub, str)
        exp = payload.get("exp")
        return cls(
            sub=sub,
            email=claim_text(payload.get("email")),
            given_name=claim_text(payload.get("given_name")),
            family_name=claim_text(payload.get("family_name")),
            picture=claim_text(payload.get("picture")),
            expires_at=float(exp) if isinstance(exp, int | float) else None,
        )

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now if now is not None else time.time()) >= self.expires_at


class TokenExpired(Unauthenticated):
    """A token that was good and has run out: a client can tell it from a bad
    one (a socket's close reason says which)."""

    def __init__(self) -> None:
        super().__init__("the token has expired")


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    return token.strip()


class TokenVerifier:
    def __init__(
        self,
        *,
        secret: str | None = None,
        jwks_url: str | None = None,
        issuer: str | None = None,
        audience: str | None = None,
    ) -> None:
        if secret is None and jwks_url is None:
            raise ValueError("a verifier needs a secret or a JWKS URL")
        self.secret = secret
        self.issuer = issuer
        self.audience = audience
        self._jwks = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=3600) if jwks_url else None

    async def verify(self, token: str) -> Claims:
        try:
            key: Any
            if self._jwks is not None:
                # PyJWKClient fetches over blocking HTTP; keys are cached after the first.
                key, algorithm = (
                    (await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)).key,
                    "RS256",
                )
            else:
                key, algorithm = self.secret, "HS256"
            payload = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                issuer=self.issuer,
                audience=self.audience,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError as error:
            raise TokenExpired from error
        except (jwt.PyJWTError, ValueError) as error:
            raise Unauthenticated("the token is not valid") from error
        return Claims.from_payload(payload)


def mint_token(
    secret: str,
    user_id: str,
    *,
    email: str | None = None,
    given_name: str | None = None,
    family_name: str | None = None,
    picture: str | None = None,
    ttl_seconds: int = 30 * 24 * 3600,
    issuer: str | None = None,
    audience: str | None = None,
) -> str:
    now = int(time.time())
    payload: dict[str, Any] = {"sub": user_id, "iat": now, "exp": now + ttl_seconds}
    for name, value in (
        ("email", email),
        ("given_name", given_name),
        ("family_name", family_name),
        ("picture", picture),
        ("iss", issuer),
        ("aud", audience),
    ):
        if value is not None:
            payload[name] = value
    return jwt.encode(payload, secret, algorithm="HS256")
