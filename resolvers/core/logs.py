"""Logging: what a line says about its request, and what it must never say.

A request's id, operation name and viewer travel in a `ContextVar` (`current`),
set when the request arrives (`schema.observability.RequestObservability`),
completed as they become known, and read by `RequestFields` when a line is
written; nobody formats them into messages. `configure` installs one handler
on the root logger: human lines by default, JSON lines with
`MIFAMILIAS_LOG_FORMAT=json`. `Redact` is the last guard on that handler: a
Bearer token, anything shaped like a JWT, anything shaped like an invite code
and the signature of a signed URL are replaced before the line is written,
traceback included.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson


@dataclass
class RequestLog:
    """What the lines of one request (or one WebSocket connection) carry."""

    request_id: str = field(default_factory=lambda: new_request_id())
    started: float = field(default_factory=time.perf_counter)
    operation: str | None = None
    viewer: str | None = None


current: ContextVar[RequestLog | None] = ContextVar("mifamilias_request_log", default=None)


def new_request_id() -> str:
    return os.urandom(6).hex()


def set_viewer(viewer: str) -> None:
    found = current.get()
    if found is not None:
        found.viewer = viewer


def set_operation(name: str | None) -> None:
    """The operation's name, for this task's lines (a WebSocket runs each
    operation in a task of its own: the connection's other operations keep theirs)."""
    found = current.get()
    if found is not None and found.operation != name:
        current.set(RequestLog(found.request_id, found.started, (name or "")[:100] or None, found.viewer))


# Redaction -------------------------------------------------------------------------

REDACTED = "[redacted]"
_BEARER = re.compile(r"(?i)\bbearer\s+[^\s\"'\\,;}\]]+")
# Signed URLs are capabilities while they last (local media URLs' `sig`, S3's presigned
# `X-Amz-Signature` and `X-Amz-Security-Token`), and a client may put a token in a URL.
_URL_SECRET = re.compile(
    r"(?i)([?&](?:sig|x-amz-signature|x-amz-security-token|token|access_token)=)[^&\s\"']+"
)
# A JWT's header always starts with `{"` base64url-encoded: "eyJ". Whatever follows,
# signature or not, cut or whole, goes.
_JWT = re.compile(r"eyJ[A-Za-z0-9_\-]{2,}(?:\.[A-Za-z0-9_\-]*){0,2}")
# Invite codes (resolvers/domain/families.py): 10 symbols of 23456789 and the
# capitals without I, L and O, shown as XXXXX-XXXXX. With the dash in any case;
# without it in capitals only (ten lower-case letters are too often a word).
INVITE_SYMBOLS = "2-9A-HJKMNP-Z"
# Not inside a longer word; a percent-escape before it (`%22CODE` in a query
# string) does not count as part of the word.
_START = r"(?:(?<![0-9A-Za-z])|(?<=%[0-9A-Fa-f]{2}))"
_INVITE_DASHED = re.compile(rf"(?i){_START}[{INVITE_SYMBOLS}]{{5}}-[{INVITE_SYMBOLS}]{{5}}(?![0-9A-Za-z])")
_INVITE_PLAIN = re.compile(rf"{_START}[{INVITE_SYMBOLS}]{{10}}(?![0-9A-Za-z])")


def redact(text: str) -> str:
    if not text:
        return text
    text = _BEARER.sub("Bearer " + REDACTED, text)
    text = _URL_SECRET.sub(r"\1" + REDACTED, text)
    text = _JWT.sub(REDACTED, text)
    text = _INVITE_DASHED.sub(REDACTED, text)
    return _INVITE_PLAIN.sub(REDACTED, text)


class Redact(logging.Filter):
    """Rewrites a record's message and traceback with `redact` (a last guard:
    no code of ours logs a token or an invite code)."""

    _plain = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep what there is
            message = str(record.msg)
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._plain.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class RequestFields(logging.Filter):
    """Puts the request's fields on each record: `request_id`, `operation`,
    `viewer`, `duration_ms` (since the request arrived); None outside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = current.get()
        if found is None:
            record.request_id = record.operation = record.viewer = record.duration_ms = None
        else:
            record.request_id = found.request_id
            record.operation = found.operation
            record.viewer = found.viewer
            record.duration_ms = round((time.perf_counter() - found.started) * 1000, 3)
        return True


# Formats ---------------------------------------------------------------------------


class TextFormatter(logging.Formatter):
    """`time LEVEL logger [request id]: message`, the request id when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(request)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.request = f" [{request_id}]" if request_id else ""
        return super().format(record)


# Fields a record may carry (`extra=`) that a JSON line shows; the deployment's
# metric filters read some of them (tests/test_deploy.py checks which).
LOGGED_FIELDS = ("request_id", "operation", "viewer", "duration_ms", "schedulerLagSeconds")


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in LOGGED_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return orjson.dumps(line, default=str).decode()


# Libraries that write request bodies at DEBUG: INFO at most, whatever the level.
_CHATTY = ("botocore", "aiobotocore", "boto3", "urllib3", "s3transfer", "PIL", "multipart", "hpack")


def configure(log_format: str = "text", level: str = "INFO") -> logging.Handler:
    """One handler on the root logger for the whole process (uvicorn's loggers
    included: serve with `log_config=None`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RequestFields())
    handler.addFilter(Redact())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    numeric = logging.getLevelName(level)
    if isinstance(numeric, int) and numeric < logging.INFO:
        for name in _CHATTY:
            logging.getLogger(name).setLevel(logging.INFO)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.captureWarnings(True)
    return handler
