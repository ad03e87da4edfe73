"""What a cache in front of GET may keep (the README suggests a CDN there).

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


class CachePolicy(SchemaExtension):
    def on_operation(self) -> Iterator[None]:
        yield
        context = self.execution_context.context
        if not isinstance(context, Context):
            return
        request, response = context.request, context.response
        if getattr(request, "method", None) != "GET" or response is None:
            return
        response.headers["Vary"] = "Authorization"
        if self.execution_context.graphql_document is None or not is_introspection(self.execution_context):
            response.headers["Cache-Control"] = "private, no-store"
