"""Relay cursors: the store's position, signed so a client cannot forge one."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from resolvers.core.errors import BadInput

_TAG_BYTES = 16


class CursorSigner:
    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(b"mifamilias-cursor\0" + secret.encode()).digest()

    def _tag(self, scope: str, position: bytes) -> bytes:
        return hmac.new(self._key, scope.encode() + b"\0" + position, hashlib.sha256).digest()[:_TAG_BYTES]

    def sign(self, scope: str, position: str) -> str:
        """`scope` binds the cursor to one list (e.g. one family's feed)."""
        raw = position.encode()
        return base64.urlsafe_b64encode(self._tag(scope, raw) + raw).decode().rstrip("=")

    def open(self, scope: str, cursor: str) -> str:
        try:
            blob = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except (ValueError, binascii.Error) as error:
            raise BadInput("the cursor is not valid") from error
        tag, raw = blob[:_TAG_BYTES], blob[_TAG_BYTES:]
        if len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, self._tag(scope, raw)):
            raise BadInput("the cursor is not valid")
        return raw.decode()
