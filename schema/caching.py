"""What a cache in front of GET may keep (a CDN, say).

Every answer but introspection's is someone's: it depends on the token. So a
GET answer carries `Vary: Authorization`, and `Cache-Control: private,
no-store` unless its document reads nothing personal (introspection alone).
POST answers are not cached by anyone in between and carry nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from strawberry.extensions import SchemaExtension

from resolvers.core.context import Context
from schema.guard import is_introspection


def set_cache_headers(context: Context, introspection: bool) -> None:
    """A GET answer's `Vary` and, unless it is introspection, `Cache-Control`."""
    request, response = context.request, context.response
    if getattr(request, "method", None) != "GET" or response is None:
        return
    response.headers["Vary"] = "Authorization"
    if not introspection:
        response.headers["Cache-Control"] = "private, no-store"


class CachePolicy(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        context = self.execution_context.context
        if isinstance(context, Context):
            introspection = self.execution_context.graphql_document is not None and is_introspection(
                self.execution_context
            )
            set_cache_headers(context, introspection)
