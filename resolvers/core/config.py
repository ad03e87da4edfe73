"""Configuration from `MIFAMILIAS_*` environment variables (docs/configuration.md), as a
pydantic-settings model: every value is checked, and a bad one is refused at
start-up with the variable's name and the value given."""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import (
    BeforeValidator,
    Field,
    PositiveFloat,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

PREFIX = "MIFAMILIAS_"


def _comma_separated(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


CommaSeparated = Annotated[tuple[str, ...], BeforeValidator(_comma_separated)]


class ConfigError(ValueError):
    """A `MIFAMILIAS_` variable holds a value the server cannot use."""


# Why a server on DynamoDB needs a VAPID key given to it, and how to make one.
VAPID_KEY_NEEDED = (
    "MIFAMILIAS_VAPID_PRIVATE_KEY is needed with DynamoDB (MIFAMILIAS_DYNAMODB_ENDPOINT or "
    "MIFAMILIAS_AWS_REGION): a shared table is served by several hosts, and a browser "
    "subscribed with one host's key refuses pushes signed by another's, so every host must "
    "sign with the same key rather than generate its own. Make one with "
    "`python app.py vapid-key` (it prints the value to set) and give it to every host"
)
# Values never shown in a refusal: the message reaches the logs.
SECRET_SETTINGS = frozenset({"auth_secret", "vapid_private_key"})


DEFAULT_REGION = "us-east-1"
MIB = 1024 * 1024
# S3's smallest part (all but the last); the largest keeps part sizes a GraphQL Int.
MIN_PART_BYTES = 5 * MIB
MAX_PART_BYTES = 1024 * MIB


TlsMode = Literal["tls", "starttls", "opportunistic", "none"]
SMTP_DEFAULT_PORTS = {"smtp": 25, "smtps": 465, "smtp+starttls": 587}


@dataclass(frozen=True)
class SmtpTarget:
    """Where mail goes, from MIFAMILIAS_SMTP_URL."""

    host: str
    port: int
    # tls: TLS from the first byte (smtps://); starttls: STARTTLS required;
    # opportunistic: STARTTLS when the server offers it (smtp://); none: never.
    tls: TlsMode
    username: str | None = None
    password: str | None = None


def parse_smtp_url(url: str) -> SmtpTarget:
    """smtp://host[:25], smtps://user:pass@host[:465], smtp+starttls://host[:587];
    `?starttls=true|false` on smtp:// requires STARTTLS or never tries it.
    User and password are percent-decoded."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SMTP_DEFAULT_PORTS:
        raise ValueError("must start with smtp://, smtps:// or smtp+starttls://")
    if not parts.hostname:
        raise ValueError("has no host")
    try:
        port = parts.port or SMTP_DEFAULT_PORTS[scheme]
    except ValueError:
        raise ValueError("has a bad port") from None
    tls: TlsMode = {"smtp": "opportunistic", "smtps": "tls", "smtp+starttls": "starttls"}[scheme]  # type: ignore[assignment]
    flag = parse_qs(parts.query).get("starttls")
    if flag:
        if scheme != "smtp":
            raise ValueError("takes ?starttls= on smtp:// only")
        value = flag[-1].lower()
        if value not in ("true", "false", "1", "0"):
            raise ValueError("?starttls= must be true or false")
        tls = "starttls" if value in ("true", "1") else "none"
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return SmtpTarget(parts.hostname, port, tls, username, password)


# What "auto" runs: the implementation that held an idle subscription in the least
# server memory, with deflate off and with it on (bench section 3).
WS_IMPLEMENTATION_WITHOUT_DEFLATE = "wsproto"
WS_IMPLEMENTATION_WITH_DEFLATE = "websockets-sansio"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, frozen=True, extra="forbid")

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
    allowed_origins: CommaSeparated = ()
    public_url: str | None = None
    max_upload_bytes: int = 500 * 1024 * 1024
    # Uploads larger than this go in parts of `multipart_part_bytes` (resumable).
    multipart_threshold_bytes: Annotated[int, Field(ge=0)] = 16 * MIB
    multipart_part_bytes: Annotated[int, Field(ge=MIN_PART_BYTES, le=MAX_PART_BYTES)] = 8 * MIB
    max_body_bytes: int = 1024 * 1024
    # The most one operation may ask for: a bucket's worth, so that a screen
    # the budget admits is never refused for its shape. The loop's turns and
    # the operation deadline bound what one operation does to others.
    max_query_cost: int = 10_000
    # Each person's leaky bucket of cost points (Shopify's model): it holds
    # `cost_budget` points, operations and subscription events take what they
    # cost, and `cost_restore_rate` points a second flow back. 0 turns it off.
    cost_budget: Annotated[int, Field(ge=0)] = 10_000
    cost_restore_rate: Annotated[float, Field(gt=0)] = 500.0
    # Live subscriptions at once: per person across every connection, transport
    # and process; per WebSocket connection.
    max_subscriptions_per_person: Annotated[int, Field(ge=1)] = 50
    max_subscriptions_per_connection: Annotated[int, Field(ge=1)] = 20
    # Replays (`after`) of one person's subscriptions running at once in a
    # process; the rest wait their turn: each reads and executes up to a
    # thousand events, and a reconnecting app resumes a few at a time anyway.
    max_replays_per_person: Annotated[int, Field(ge=1)] = 2
    operation_deadline_seconds: float = 10.0
    # How often an idle subscription hears from the server (WebSocket ping or
    # `ka`, an SSE comment, an empty multipart part), so proxies keep it open.
    keepalive_seconds: PositiveFloat = 12.0
    # A subscriber whose socket takes nothing for this long, or whose send
    # queue (`send_queue_frames` frames) fills, is let go (WebSocket 4408).
    slow_client_seconds: PositiveFloat = 30.0
    send_queue_frames: Annotated[int, Field(ge=1)] = 256
    # uvicorn's WebSocket implementation and per-message deflate. Deflate's zlib
    # state costs more per connection than the small frames save; "auto" takes
    # the implementation that holds an idle connection in the least memory with
    # deflate as set: wsproto with it off, the sans-I/O websockets protocol with
    # it on (bench section 3, bench/NOTES.md).
    ws_implementation: Literal["auto", "websockets", "websockets-sansio", "wsproto"] = "auto"
    ws_deflate: bool = False
    # Freeze the heap after a burst of subscriptions (resolvers/core/heap.py), so
    # full collections do not walk what live subscriptions hold.
    freeze_subscriptions: bool = True
    rate_limits: str | None = None
    trusted_proxies: CommaSeparated = ()
    pipeline_workers: int = 2
    pipeline_lease_seconds: float = 60.0
    pipeline_recovery_seconds: float = 30.0
    shutdown_seconds: float = 20.0
    archive_after_days: int = 90
    capsule_retention_days: int = 365
    transcribe_bucket: str | None = None
    # Unset: the local transcriber (faster-whisper); "aws": Amazon Transcribe; "none": off.
    transcriber: Literal["local", "aws", "none"] | None = None
    # A CTranslate2 Whisper model directory; unset: the default model from the registry.
    whisper_model: Path | None = None
    # ISO 639-1; unset: detected per file.
    transcribe_language: Annotated[str, Field(pattern=r"^[a-z]{2}$")] | None = None
    # Where derived files that any data directory can share go (the assembled model);
    # unset: $XDG_CACHE_HOME/mifamilias, else ~/.cache/mifamilias.
    cache_dir: Path | None = None
    keep_original_metadata: bool = False
    trusted_documents: Path | None = None
    allow_introspection: bool | None = None
    # `./dev demo`: its second capsule unlocks this long after the world is seeded.
    demo_unlock_seconds: Annotated[float, Field(ge=5)] = 120.0
    metrics: bool = True
    metrics_port: int | None = None
    otel: bool = False
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    # Email for relatives without the app: off unless an SMTP URL is set.
    smtp_url: str | None = None
    # Checked even when unset: an SMTP URL without a sender is refused at start-up.
    mail_from: Annotated[str | None, Field(validate_default=True)] = None
    mail_poll_seconds: PositiveFloat = 30.0
    # How long an unsubscribe link in an email keeps working.
    mail_link_days: Annotated[int, Field(ge=1)] = 60

    # Push to phones and browsers. Web Push is on by default, with VAPID keys
    # generated into the data directory unless one is given (PEM, or the raw
    # private key base64url); on DynamoDB one must be given (`check_serving`).
    # Native push is on when an SNS platform application is named.
    vapid_private_key: str | None = None
    vapid_subject: str = "mailto:push@mifamilias.invalid"
    push_allowed_origins: CommaSeparated = ()
    sns_apns_arn: str | None = None
    sns_fcm_arn: str | None = None
    sns_endpoint: str | None = None
    push_workers: Annotated[int, Field(ge=1)] = 4
    push_lease_seconds: PositiveFloat = 60.0
    push_recovery_seconds: PositiveFloat = 15.0
    push_timeout_seconds: PositiveFloat = 10.0
    # Sends at once to one push service (its pool's keep-alive connections).
    push_connections_per_origin: Annotated[int, Field(ge=1)] = 32

    @field_validator("vapid_private_key")
    @classmethod
    def _vapid_private_key(cls, value: str | None) -> str | None:
        # Its shape only (the curve is the adapter's): a public key pasted by
        # mistake is refused here, by name, rather than at the first push.
        if value is None or "-----BEGIN" in value:
            return value
        try:
            raw = base64.urlsafe_b64decode(value.strip() + "=" * (-len(value.strip()) % 4))
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise ValueError(
                "must be a private key: PEM, or 32 bytes base64url as `python app.py vapid-key` prints"
            )
        return value

    @field_validator("vapid_subject")
    @classmethod
    def _vapid_subject(cls, value: str) -> str:
        if not (value.startswith("mailto:") or value.startswith("https://")):
            raise ValueError("must be a mailto: or https: contact, e.g. mailto:admin@example.org")
        return value

    @field_validator("push_allowed_origins")
    @classmethod
    def _push_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        found = []
        for origin in value:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"{origin!r} is not an origin, e.g. http://127.0.0.1:8443")
            found.append(f"{parts.scheme}://{parts.netloc.lower()}")
        return tuple(found)

    @field_validator("smtp_url")
    @classmethod
    def _smtp_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_smtp_url(value)
        return value

    @field_validator("mail_from")
    @classmethod
    def _mail_from(cls, value: str | None, info: ValidationInfo) -> str | None:
        from email.utils import parseaddr

        if value is None:
            if info.data.get("smtp_url"):
                raise ValueError("is needed when MIFAMILIAS_SMTP_URL is set")
            return None
        if "@" not in parseaddr(value)[1]:
            raise ValueError("must be an address, e.g. MiFamilias <hola@example.org>")
        return value

    @property
    def smtp(self) -> SmtpTarget | None:
        return parse_smtp_url(self.smtp_url) if self.smtp_url else None

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Settings(...) in code holds what it is given; `from_env` reads the environment.
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        given = {
            name: env[PREFIX + name.upper()]
            for name in cls.model_fields
            if env.get(PREFIX + name.upper()) not in (None, "")
        }
        # OpenTelemetry's own variable turns tracing on, unless MIFAMILIAS_OTEL says no.
        if "otel" not in given and (
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        ):
            given["otel"] = "true"
        try:
            return cls.model_validate(given)
        except ValidationError as error:
            problems = []
            for problem in error.errors():
                name = str(problem["loc"][0]) if problem["loc"] else "?"
                shown = given.get(name)
                if name == "smtp_url" and shown and "@" in shown:
                    shown = "<with credentials, not shown>"  # the message reaches the logs
                elif name in SECRET_SETTINGS and shown:
                    shown = "<not shown>"
                problems.append(f"{PREFIX}{name.upper()}={shown!r}: {problem['msg']}")
            raise ConfigError(f"bad configuration: {'; '.join(problems)}") from None

    @property
    def uses_dynamodb(self) -> bool:
        return self.dynamodb_endpoint is not None or self.aws_region is not None

    def check_serving(self) -> None:
        """Raises ConfigError for what other commands may run with but a
        server may not start with: DynamoDB without a VAPID key. The embedded
        store is one host's, which generates its own key as before."""
        if self.uses_dynamodb and not self.vapid_private_key:
            raise ConfigError(f"bad configuration: {VAPID_KEY_NEEDED}")

    @property
    def region(self) -> str:
        """The AWS region: MIFAMILIAS_AWS_REGION, else AWS's own chain (AWS_REGION,
        AWS_DEFAULT_REGION, the profile's config), else us-east-1. A local stand-in
        (moto_server, DynamoDB Local, LocalStack) then needs no region at all."""
        if self.aws_region:
            return self.aws_region
        if os.environ.get("AWS_REGION"):  # the other SDKs' variable, which botocore does not read
            return os.environ["AWS_REGION"]
        import botocore.session  # only when AWS is in use: it is slow to import

        found = botocore.session.get_session().get_config_variable("region")
        return str(found) if found else DEFAULT_REGION

    @property
    def introspection_allowed(self) -> bool:
        """Introspection (and GraphiQL, which needs it): on unless trusted
        documents are, or MIFAMILIAS_ALLOW_INTROSPECTION says otherwise."""
        if self.allow_introspection is not None:
            return self.allow_introspection
        return self.trusted_documents is None

    @property
    def resolved_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return self.cache_dir
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "mifamilias"

    @property
    def sqlite_path(self) -> Path:
        """The embedded store's file."""
        return self.data_dir / "mifamilias.sqlite3"

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    def websocket_implementation(self) -> str:
        """The uvicorn WebSocket implementation to run (`ws_implementation`,
        with "auto" resolved by `ws_deflate`)."""
        if self.ws_implementation != "auto":
            return self.ws_implementation
        return WS_IMPLEMENTATION_WITH_DEFLATE if self.ws_deflate else WS_IMPLEMENTATION_WITHOUT_DEFLATE

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
