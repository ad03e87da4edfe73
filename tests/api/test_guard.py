"""The read rule where a record becomes a GraphQL object (schema.guard): a field
added tomorrow that returns a record without asking the rule (as a forgetful
resolver would) still answers NOT_FOUND to whoever may not read it, and its
scalar fields, lists and nested objects with it; on both engines."""

from __future__ import annotations

from typing import Any

import strawberry
from strawberry.tools import merge_types

from resolvers.core.context import Context
from schema import MiFamiliasSchema
from schema.content import Content
from schema.multiplex import MultiplexingExecutionContext
from schema.mutation import Mutation
from schema.query import Query
from schema.subscription import Subscription
from store import items, keys
from tests.api.conftest import Api
from tests.factories import make_family, settle, upload


@strawberry.type
class Forgetful:
    @strawberry.field
    async def any_content(self, info: strawberry.Info[Context, None], id: strawberry.ID) -> Content | None:
        # No access check at all: the guard is all that stands between.
        item = await info.context.loaders.item.load(keys.content(str(id)))
        return Content(item=items.Content.from_item(item)) if item else None

    @strawberry.field
    async def every_content(
        self, info: strawberry.Info[Context, None], ids: list[strawberry.ID]
    ) -> list[Content | None]:
        found = await info.context.loaders.many([keys.content(str(i)) for i in ids])
        return [Content(item=items.Content.from_item(item)) if item else None for item in found]


FORGETFUL = MiFamiliasSchema(
    query=merge_types("Query", (Query, Forgetful)),
    mutation=Mutation,
    subscription=Subscription,
    execution_context_class=MultiplexingExecutionContext,
)
ONE = "query($id: ID!) { anyContent(id: $id) { id title comments(first: 5) { edges { node { body } } } } }"
MANY = "query($ids: [ID!]!) { everyContent(ids: $ids) { id title } }"


async def run(api: Api, query: str, variables: dict[str, Any], user: str) -> Any:
    context = Context(services=api.services)
    await context.authenticate(f"Bearer {api.token(user)}")
    return await FORGETFUL.execute(query, variable_values=variables, context_value=context)


async def test_a_field_that_forgets_the_rule_still_answers_not_found(api: Api) -> None:
    await api.sign_in("ana", "zoe")
    family = await make_family(api, "ana", "Los García")
    content_id = await upload(api, "ana", family["id"], "TEXT", b"hola", "text/plain", title="secreto")
    await settle(api)
    await api.ok(
        "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }",
        {"c": content_id, "b": "muy secreto"},
        as_="ana",
    )

    allowed = await run(api, ONE, {"id": content_id}, "ana")
    assert allowed.errors is None
    assert allowed.data["anyContent"]["title"] == "secreto"
    assert allowed.data["anyContent"]["comments"]["edges"] == [{"node": {"body": "muy secreto"}}]

    refused = await run(api, ONE, {"id": content_id}, "zoe")
    assert refused.data == {"anyContent": None}
    assert [getattr(e.original_error, "code", None) for e in refused.errors or []] == ["NOT_FOUND"]
    assert refused.errors and refused.errors[0].path == ["anyContent"]
    assert "secreto" not in str(refused.data) + str(refused.errors)

    listed = await run(api, MANY, {"ids": [content_id, content_id]}, "zoe")
    assert listed.data == {"everyContent": [None, None]}
    assert [e.path for e in listed.errors or []] == [["everyContent", 0], ["everyContent", 1]]
