"""Section 1: the family feed query executed in-process three ways: our
Strawberry schema, the same SDL on raw graphql-core with resolvers calling the
same `resolvers/` functions, and a hand-written function (the floor)."""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
from typing import Any

import graphql

from bench.common import VIEWER, Row, Stats, now, ratio_stats, token, verdict
from resolvers.core.context import Context
from resolvers.core.pagination import page_size
from resolvers.domain import content as content_resolvers
from resolvers.domain import families, users
from resolvers.domain.tags import content_tags
from resolvers.services import Services
from store import items
from tests.typical_calls import FEED_QUERY

SECTION = "1. Execution (in-process, feed of 20)"


async def new_context(services: Services, authorization: str) -> Context:
    """As app.py's get_context: a fresh Context (and loaders) per execution."""
    ctx = Context(services=services)
    await ctx.authenticate(authorization)
    return ctx


# The floor: the same store calls, the same JSON, no GraphQL ---------------------------


async def feed_floor(ctx: Context, family_id: str, first: int = 20, comments: int = 3) -> dict[str, Any]:
    family, _ = await families.visible_family(ctx, family_id)  # as Query.family does
    page = await content_resolvers.feed_page(ctx, family.id, first, None)
    contents = [items.Content.from_item(item) for item in page.items]

    async def node(content: items.Content) -> dict[str, Any]:
        author, reacted, tags, thread = await asyncio.gather(
            users.load_user(ctx, content.author_id),
            content_resolvers.viewer_reactions(ctx, content),
            content_tags(ctx, content),
            content_resolvers.comments_page(ctx, content, comments, None),
        )
        notes = [items.Comment.from_item(item) for item in thread.items]
        writers = await asyncio.gather(*(users.load_user(ctx, note.author_id) for note in notes))
        return {
            "id": content.id,
            "author": {"givenName": author.given_name},
            "reactions": [{"emoji": e, "count": n} for e, n in content_resolvers.reaction_counts(content)],
            "viewerReactions": reacted,
            "commentCount": content.comment_count,
            "tags": [{"value": tag.value} for tag in tags],
            "comments": {
                "edges": [
                    {"node": {"body": note.body, "author": {"givenName": writer.given_name}}}
                    for note, writer in zip(notes, writers, strict=True)
                ]
            },
        }

    nodes = await asyncio.gather(*(node(content) for content in contents))
    return {"family": {"feed": {"edges": [{"node": n} for n in nodes]}}}


async def me_floor(ctx: Context) -> dict[str, Any]:
    user = await users.me(ctx)
    return {"me": {"id": user.id}}


# Raw graphql-core on the same SDL -------------------------------------------------------


def build_core_schema(sdl: str) -> graphql.GraphQLSchema:
    schema = graphql.build_schema(sdl)

    def field(type_name: str, name: str) -> graphql.GraphQLField:
        found = schema.get_type(type_name)
        assert isinstance(found, graphql.GraphQLObjectType)
        return found.fields[name]

    async def family(_: Any, info: graphql.GraphQLResolveInfo, id: str) -> items.Family:
        found, _ = await families.visible_family(info.context, id)
        return found

    async def feed(
        obj: items.Family, info: graphql.GraphQLResolveInfo, first: int | None = 20, after: str | None = None
    ) -> dict[str, Any]:
        page = await content_resolvers.feed_page(info.context, obj.id, page_size(first, 20), after)
        return {
            "edges": [
                {"cursor": cursor, "node": items.Content.from_item(item)}
                for item, cursor in zip(page.items, page.cursors, strict=True)
            ],
            "pageInfo": {"hasNextPage": page.has_next, "endCursor": page.end_cursor},
        }

    async def author(obj: Any, info: graphql.GraphQLResolveInfo) -> items.User:
        return await users.load_user(info.context, obj.author_id)

    def reactions(obj: items.Content, info: graphql.GraphQLResolveInfo) -> list[dict[str, Any]]:
        return [{"emoji": e, "count": n} for e, n in content_resolvers.reaction_counts(obj)]

    async def viewer_reactions(obj: items.Content, info: graphql.GraphQLResolveInfo) -> list[str]:
        return await content_resolvers.viewer_reactions(info.context, obj)

    async def tags(obj: items.Content, info: graphql.GraphQLResolveInfo) -> list[items.Tag]:
        return await content_tags(info.context, obj)

    async def comments(
        obj: items.Content, info: graphql.GraphQLResolveInfo, first: int | None = 20, after: str | None = None
    ) -> dict[str, Any]:
        page = await content_resolvers.comments_page(info.context, obj, page_size(first, 20), after)
        return {
            "edges": [
                {"cursor": cursor, "node": items.Comment.from_item(item)}
                for item, cursor in zip(page.items, page.cursors, strict=True)
            ],
            "pageInfo": {"hasNextPage": page.has_next, "endCursor": page.end_cursor},
        }

    async def me(_: Any, info: graphql.GraphQLResolveInfo) -> items.User:
        return await users.me(info.context)

    field("Query", "family").resolve = family
    field("Query", "me").resolve = me
    field("Family", "feed").resolve = feed
    field("Content", "author").resolve = author
    field("Content", "reactions").resolve = reactions
    field("Content", "viewerReactions").resolve = viewer_reactions
    field("Content", "commentCount").resolve = lambda obj, info: obj.comment_count
    field("Content", "tags").resolve = tags
    field("Content", "comments").resolve = comments
    field("Comment", "author").resolve = author
    field("User", "givenName").resolve = lambda obj, info: obj.given_name
    return schema


# The measurement --------------------------------------------------------------------------


async def run(services: Services, family_id: str, rounds: int, iterations: int) -> list[Row]:
    from schema import schema as strawberry_schema

    core_schema = build_core_schema(strawberry_schema.as_str())
    authorization = f"Bearer {token(VIEWER)}"
    variables = {"id": family_id}

    async def strawberry_once() -> Any:
        ctx = await new_context(services, authorization)
        result = await strawberry_schema.execute(FEED_QUERY, variable_values=variables, context_value=ctx)
        assert not result.errors, result.errors
        return result.data

    # Parsed and validated once, as our schema's ParserCache and ValidationCache do.
    parse = functools.lru_cache(maxsize=256)(graphql.parse)
    validate = functools.lru_cache(maxsize=256)(
        lambda document: tuple(graphql.validate(core_schema, document))
    )

    async def core_once() -> Any:
        ctx = await new_context(services, authorization)
        document = parse(FEED_QUERY)
        assert not validate(document)
        result = graphql.execute(core_schema, document, variable_values=variables, context_value=ctx)
        if inspect.isawaitable(result):
            result = await result
        assert not result.errors, result.errors
        return result.data

    async def floor_once() -> Any:
        ctx = await new_context(services, authorization)
        return await feed_floor(ctx, family_id)

    ways = {
        "strawberry": strawberry_once,
        "graphql-core (cached parse+validate)": core_once,
        "floor": floor_once,
    }
    # The three must agree on the answer (and so make the same store calls).
    answers = [await way() for way in ways.values()]
    assert answers[0] == answers[1] == answers[2], "the three ways answer differently"
    edges = answers[0]["family"]["feed"]["edges"]
    assert len(edges) == 20 or len(edges) > 0

    table = services.table
    calls: dict[str, int] = {}
    if hasattr(table, "reset"):
        for name, way in ways.items():
            table.reset()
            await way()
            calls[name] = table.total_calls  # type: ignore[attr-defined]  # a CountingTable

    for _ in range(max(3, iterations // 3)):  # warm-up
        for way in ways.values():
            await way()

    # The machine's speed drifts by tens of percent within a second (other
    # tenants of the VM), so the ways alternate execution by execution, and
    # each round's ratio compares executions run side by side.
    samples: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for r in range(rounds):
        rotated = order[r % 3 :] + order[: r % 3]  # a different order each round
        spent = dict.fromkeys(ways, 0.0)
        gc.collect()  # each round starts from a collected heap
        for _ in range(iterations):
            for name in rotated:
                start = now()
                await ways[name]()
                spent[name] += now() - start
        for name in ways:
            samples[name].append(spent[name] / iterations)

    rows = []
    for name in ways:
        median, spread = Stats.of(samples[name]).fmt(" ms", 2, 1000)
        note = f"{calls[name]} store calls" if calls else ""
        rows.append(Row(SECTION, f"{name} per execution ({note})" if note else name, median, spread))
    vs_core = ratio_stats(samples["strawberry"], samples["graphql-core (cached parse+validate)"])
    vs_floor = ratio_stats(samples["strawberry"], samples["floor"])
    m, s = vs_core.fmt("×", 2)
    rows.append(Row(SECTION, "Strawberry / graphql-core", m, s, m, "≤ 1.15", verdict(vs_core.median <= 1.15)))
    m, s = vs_floor.fmt("×", 2)
    rows.append(Row(SECTION, "Strawberry / floor", m, s, m))
    return rows
