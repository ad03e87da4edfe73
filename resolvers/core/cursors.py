"""Relay cursors: the store's position, signed (itsdangerous) so a client can
neither forge one nor carry one from one list to another."""

from __future__ import annotations

from dataclasses import dataclass

from itsdangerous import BadData, URLSafeSerializer

from resolvers.core.errors import BadInput
from store.expressions import cursor_for
from store.port import Index, Item


class CursorSigner:
    def __init__(self, secret: str) -> None:
        # The salt keeps these signatures apart from anything else signed with the secret.
        self._serializer = URLSafeSerializer(secret, salt="mifamilias.cursor")

    def sign(self, scope: str, position: str) -> str:
        """`scope` binds the cursor to one list (e.g. one family's feed)."""
        return str(self._serializer.dumps([scope, position]))

    def after(self, scope: str, item: Item, index: Index) -> Cursor:
        """The cursor just past `item` in the list `scope`, signed when it is read."""
        return Cursor(self, scope, item, index)

    def open(self, scope: str, cursor: str) -> str:
        try:
            signed_scope, position = self._serializer.loads(cursor)
        except (BadData, TypeError, ValueError) as error:
            raise BadInput("the cursor is not valid") from error
        if signed_scope != scope or not isinstance(position, str):
            raise BadInput("the cursor is not valid")
        return position


@dataclass(frozen=True, slots=True)
class Cursor:
    """An edge's cursor, encoded and signed only when the answer asks for it:
    most pages are read for their nodes, and signing is the dearest part of an
    edge (an HMAC over JSON, for each of up to a hundred items)."""

    signer: CursorSigner
    scope: str
    item: Item
    index: Index

    def __str__(self) -> str:
        return self.signer.sign(self.scope, cursor_for(self.item, self.index))
