"""Configuration from `MIFAMILIAS_*` environment variables (see README)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(f"MIFAMILIAS_{name}")
    return default if raw in (None, "") else int(raw)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(f"MIFAMILIAS_{name}")
    return default if raw in (None, "") else float(raw)


def _str(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(f"MIFAMILIAS_{name}")
    return raw or None


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in (_str(env, name) or "").split(",") if part.strip())


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("data")
    auth_secret: str | None = None
    jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    dynamodb_endpoint: str | None = None
    aws_region: str | None = None
    table_name: str = "mifamilias-main"
    s3_bucket: str | None = None
    s3_endpoint: str | None = None
    redis_url: str | None = None
    unlock_poll_seconds: float = 5.0
    unlock_shards: int = 8
    abandoned_unlock_seconds: float = 30.0
    allowed_origins: tuple[str, ...] = ()
    public_url: str | None = None
    max_upload_bytes: int = 500 * 1024 * 1024
    max_body_bytes: int = 1024 * 1024
    max_query_cost: int = 5_000
    operation_deadline_seconds: float = 10.0
    rate_limits: str | None = None
    trusted_proxies: tuple[str, ...] = ()
    pipeline_workers: int = 2
    pipeline_lease_seconds: float = 60.0
    pipeline_recovery_seconds: float = 30.0
    archive_after_days: int = 90
    capsule_retention_days: int = 365
    transcribe_bucket: str | None = None
    transcriber: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        origins = _str(env, "ALLOWED_ORIGINS")
        return cls(
            host=_str(env, "HOST") or "127.0.0.1",
            port=_int(env, "PORT", 8000),
            data_dir=Path(_str(env, "DATA_DIR") or "data"),
            auth_secret=_str(env, "AUTH_SECRET"),
            jwks_url=_str(env, "JWKS_URL"),
            jwt_issuer=_str(env, "JWT_ISSUER"),
            jwt_audience=_str(env, "JWT_AUDIENCE"),
            dynamodb_endpoint=_str(env, "DYNAMODB_ENDPOINT"),
            aws_region=_str(env, "AWS_REGION"),
            table_name=_str(env, "TABLE_NAME") or "mifamilias-main",
            s3_bucket=_str(env, "S3_BUCKET"),
            s3_endpoint=_str(env, "S3_ENDPOINT"),
            redis_url=_str(env, "REDIS_URL"),
            unlock_poll_seconds=_float(env, "UNLOCK_POLL_SECONDS", 5.0),
            unlock_shards=_int(env, "UNLOCK_SHARDS", 8),
            abandoned_unlock_seconds=_float(env, "ABANDONED_UNLOCK_SECONDS", 30.0),
            allowed_origins=tuple(o.strip() for o in origins.split(",") if o.strip()) if origins else (),
            public_url=_str(env, "PUBLIC_URL"),
            max_upload_bytes=_int(env, "MAX_UPLOAD_BYTES", 500 * 1024 * 1024),
            max_body_bytes=_int(env, "MAX_BODY_BYTES", 1024 * 1024),
            max_query_cost=_int(env, "MAX_QUERY_COST", 5_000),
            operation_deadline_seconds=_float(env, "OPERATION_DEADLINE_SECONDS", 10.0),
            rate_limits=_str(env, "RATE_LIMITS"),
            trusted_proxies=tuple(
                p.strip() for p in (_str(env, "TRUSTED_PROXIES") or "").split(",") if p.strip()
            ),
            pipeline_workers=_int(env, "PIPELINE_WORKERS", 2),
            pipeline_lease_seconds=_float(env, "PIPELINE_LEASE_SECONDS", 60.0),
            pipeline_recovery_seconds=_float(env, "PIPELINE_RECOVERY_SECONDS", 30.0),
            archive_after_days=_int(env, "ARCHIVE_AFTER_DAYS", 90),
            capsule_retention_days=_int(env, "CAPSULE_RETENTION_DAYS", 365),
            transcriber=_str(env, "TRANSCRIBER"),
            transcribe_bucket=_str(env, "TRANSCRIBE_BUCKET"),
        )

    @property
    def uses_dynamodb(self) -> bool:
        return self.dynamodb_endpoint is not None or self.aws_region is not None

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    def resolved_auth_secret(self) -> str:
        """The HS256 secret; generated once into the data directory when unset,
        so a fresh clone can mint and verify tokens with no set-up."""
        if self.auth_secret:
            return self.auth_secret
        path = self.data_dir / "auth-secret"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another process wrote it first: use theirs
            else:
                with os.fdopen(fd, "w") as handle:
                    handle.write(secrets.token_urlsafe(48))
        return path.read_text().strip()
