from __future__ import annotations

from datetime import datetime

import strawberry

from resolvers.domain import content as content_resolvers
from resolvers.domain import users
from resolvers.domain.tags import TagPage
from schema.common import Edge, Info, PageInfo, when
from schema.content import Content
from schema.user import User
from store import items


@strawberry.type
class Tag:
    item: strawberry.Private[items.Tag]
    # The tagged content when the resolver already holds it (and has checked it readable).
    content_item: strawberry.Private[items.Content | None] = None

    @strawberry.field
    def value(self) -> str:
        return self.item.value

    @strawberry.field
    async def author(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.author_id))

    @strawberry.field
    async def content(self, info: Info) -> Content:
        found = self.content_item
        if found is None:
            found, _ = await content_resolvers.readable_content(info.context, self.item.content_id)
        return Content(item=found)

    @strawberry.field
    def set_name(self) -> str | None:
        return self.item.set_name

    @strawberry.field
    def mime_type(self) -> str | None:
        return self.item.mime_type

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)


@strawberry.type
class TagEdge(Edge):
    node: Tag


@strawberry.type
class TagConnection:
    edges: list[TagEdge]
    page_info: PageInfo


@strawberry.type
class TagStatus:
    tagged_by_anyone: bool
    tagged_by_viewer: bool


def tag_connection(page: TagPage) -> TagConnection:
    return TagConnection(
        edges=[
            TagEdge(position=cursor, node=Tag(item=tag, content_item=content))
            for tag, content, cursor in zip(page.tags, page.contents, page.cursors, strict=True)
        ],
        page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
    )
