"""Relay cursors: the store's position, signed (itsdangerous) so a client can
neither forge one nor carry one from one list to another."""

from __future__ import annotations

from itsdangerous import BadData, URLSafeSerializer

from resolvers.core.errors import BadInput


class CursorSigner:
    def __init__(self, secret: str) -> None:
        # The salt keeps these signatures apart from anything else signed with the secret.
        self._serializer = URLSafeSerializer(secret, salt="mifamilias.cursor")

    def sign(self, scope: str, position: str) -> str:
        """`scope` binds the cursor to one list (e.g. one family's feed)."""
        return str(self._serializer.dumps([scope, position]))

    def open(self, scope: str, cursor: str) -> str:
        try:
            signed_scope, position = self._serializer.loads(cursor)
        except (BadData, TypeError, ValueError) as error:
            raise BadInput("the cursor is not valid") from error
        if signed_scope != scope or not isinstance(position, str):
            raise BadInput("the cursor is not valid")
        return position
