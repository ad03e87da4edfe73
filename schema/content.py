from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import strawberry

from resolvers.core.pagination import page_size
from resolvers.domain import content as content_resolvers
from resolvers.domain import search as search_resolvers
from resolvers.domain import users
from schema.common import Edge, Info, PageInfo, maybe_when, when
from schema.enums import ContentStatus, ContentType
from schema.user import User
from store import items

if TYPE_CHECKING:
    from schema.family import Family
    from schema.tag import Tag


@strawberry.type
class ReactionCount:
    emoji: str
    count: int


@strawberry.type
class Comment:
    item: strawberry.Private[items.Comment]

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    async def author(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.author_id))

    @strawberry.field
    def body(self) -> str:
        return self.item.body

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)


@strawberry.type
class CommentEdge(Edge):
    node: Comment


@strawberry.type
class CommentConnection:
    edges: list[CommentEdge]
    page_info: PageInfo


@strawberry.type
class Content:
    item: strawberry.Private[items.Content]
    # Whom a subscription event's answer can be shared with (schema.multiplex).
    share: strawberry.Private[tuple[Any, ...] | None] = None

    @strawberry.field
    def id(self) -> strawberry.ID:
        return strawberry.ID(self.item.id)

    @strawberry.field
    async def family(self, info: Info) -> Annotated[Family, strawberry.lazy("schema.family")]:
        from schema.family import family_of

        return await family_of(info, self.item.family_id)

    @strawberry.field
    async def author(self, info: Info) -> User:
        return User(item=await users.load_user(info.context, self.item.author_id))

    @strawberry.field
    def type(self) -> ContentType:
        return ContentType(self.item.type)

    @strawberry.field
    def status(self) -> ContentStatus:
        return ContentStatus(self.item.status)

    @strawberry.field
    def title(self) -> str | None:
        return self.item.title

    @strawberry.field(description="a short-lived signed URL; null until the content is READY (or DELIVERED)")
    async def media_url(self, info: Info) -> str | None:
        return await content_resolvers.media_url(info.context, self.item, "media")

    @strawberry.field
    async def thumbnail_url(self, info: Info) -> str | None:
        return await content_resolvers.media_url(info.context, self.item, "thumbnail")

    @strawberry.field
    def transcription(self) -> str | None:
        return self.item.transcription

    @strawberry.field(
        description="the language of the transcription (ISO 639-1), as detected; null without a transcription"
    )
    def transcript_language(self) -> str | None:
        return self.item.transcript_language if self.item.transcription else None

    @strawberry.field(
        description="a short-lived signed URL of the transcription's captions (WebVTT, text/vtt), "
        "with the times they were spoken; null until READY and without a transcription"
    )
    async def captions_url(self, info: Info) -> str | None:
        return await content_resolvers.media_url(info.context, self.item, "captions")

    @strawberry.field(
        description="why the transcription failed, when the content is READY without one; "
        "retryContent tries again"
    )
    def transcription_failure(self) -> str | None:
        return self.item.transcription_failure

    @strawberry.field(description="why processing failed, when the status is FAILED")
    def failure_reason(self) -> str | None:
        return self.item.failure_reason

    @strawberry.field
    def created_at(self) -> datetime:
        return when(self.item.created_at)

    @strawberry.field(
        description="when a photo was taken, from its EXIF, with the camera's UTC offset when it "
        "recorded one and with no offset (the camera's clock) when it did not; null when unknown"
    )
    def captured_at(self) -> datetime | None:
        return maybe_when(self.item.captured_at)

    @strawberry.field
    def reactions(self) -> list[ReactionCount]:
        return [ReactionCount(emoji=e, count=n) for e, n in content_resolvers.reaction_counts(self.item)]

    @strawberry.field
    async def viewer_reactions(self, info: Info) -> list[str]:
        return await content_resolvers.viewer_reactions(info.context, self.item)

    @strawberry.field
    def comment_count(self) -> int:
        return self.item.comment_count

    @strawberry.field
    async def comments(
        self, info: Info, first: int | None = 20, after: str | None = None
    ) -> CommentConnection:
        page = await content_resolvers.comments_page(info.context, self.item, page_size(first, 20), after)
        return CommentConnection(
            edges=[
                CommentEdge(position=cursor, node=Comment(item=items.Comment.from_item(item)))
                for item, cursor in zip(page.items, page.cursors, strict=True)
            ],
            page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
        )

    @strawberry.field
    async def tags(self, info: Info) -> list[Annotated[Tag, strawberry.lazy("schema.tag")]]:
        from resolvers.domain.tags import content_tags
        from schema.tag import Tag

        return [Tag(item=t, content_item=self.item) for t in await content_tags(info.context, self.item)]


@strawberry.type
class ContentEdge(Edge):
    node: Content


@strawberry.type
class ContentConnection:
    edges: list[ContentEdge]
    page_info: PageInfo


@strawberry.type(
    description="one part of an upload in parts: an HTTP PUT to url of exactly sizeBytes bytes, "
    "those of the file from byte (number - 1) * partSizeBytes"
)
class UploadPart:
    number: int
    url: str
    size_bytes: int


@strawberry.type
class Upload:
    content: Content
    upload_url: str = strawberry.field(
        description="where the client sends the bytes: an HTTP PUT of the file body; for an upload "
        "in parts (partSizeBytes set), part 1's URL: use parts"
    )
    expires_at: datetime
    part_size_bytes: int | None = strawberry.field(
        default=None,
        description="set when the upload goes in parts (above the server's threshold): the size "
        "of every part but the last; null for one PUT",
    )
    parts: list[UploadPart] | None = strawberry.field(
        default=None,
        description="the parts still to send, each with a fresh URL; null for one PUT",
    )
    received_parts: list[int] | None = strawberry.field(
        default=None,
        description="the numbers of the parts that have arrived whole; null for one PUT",
    )

    @classmethod
    def of(cls, target: content_resolvers.UploadTarget) -> Upload:
        parts = None
        if target.parts is not None:
            parts = [UploadPart(number=p.number, url=p.url, size_bytes=p.size_bytes) for p in target.parts]
        return cls(
            content=Content(item=target.content),
            upload_url=target.url,
            expires_at=target.expires_at,
            part_size_bytes=target.part_size_bytes,
            parts=parts,
            received_parts=list(target.received_parts) if target.received_parts is not None else None,
        )


async def search_connection(
    info: Info, family_id: str, text: str, first: int | None, after: str | None
) -> ContentConnection:
    page, found = await search_resolvers.search_content(
        info.context, family_id, text, page_size(first, 20), after
    )
    return ContentConnection(
        edges=[
            ContentEdge(position=cursor, node=Content(item=content))
            for content, cursor in zip(found, page.cursors, strict=True)
        ],
        page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
    )


async def feed_connection(
    info: Info, family_id: str, first: int | None, after: str | None
) -> ContentConnection:
    page = await content_resolvers.feed_page(info.context, family_id, page_size(first, 20), after)
    return ContentConnection(
        edges=[
            ContentEdge(position=cursor, node=Content(item=items.Content.from_item(item)))
            for item, cursor in zip(page.items, page.cursors, strict=True)
        ],
        page_info=PageInfo(has_next_page=page.has_next, end=page.end_cursor),
    )
