"""What one person left in the table, found by the keys that lead to it: the
walks the data export reads and the account deletion undoes.

Under the person's own partition: the profile, the family mirrors, the
notifications and the exports. Through the indexes: the capsules they created
(GSI1 `USER#<id>` / `CAPSULE#`), those they receive (GSI1 `RECEIVED#`) and their
tags (GSI2 `TAGUSER#<id>`). Content, comments and reactions have no index by
person: they are found by walking the feed of each family the person belongs
to (the content), with one point read per content for their reactions (the
`REACTOR` item) and one query per content that has comments. What they left in
a family they had already left is not reached (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from resolvers.domain.content import REACTOR_ATTR
from store import keys
from store.items import Capsule, Comment, Content, Notification, Recipient, Tag, UserFamily
from store.port import SortKey, Table, all_items, pages


async def family_ids(table: Table, user_id: str) -> list[str]:
    """The families the person belongs to now, in any role (from their mirrors)."""
    found = await all_items(table, keys.user_pk(user_id), SortKey.begins_with(keys.USER_FAMILY_PREFIX))
    return [UserFamily.from_item(item).family_id for item in found]


async def feed(table: Table, family_id: str) -> AsyncIterator[list[Content]]:
    """The family's content in the feed (everything but sealed capsule content)."""
    async for found in pages(
        table, keys.family_pk(family_id), SortKey.begins_with(keys.FEED_PREFIX), index="GSI1"
    ):
        yield [Content.from_item(item) for item in found]


async def reactors(table: Table, contents: list[Content], user_id: str) -> list[tuple[Content, list[str]]]:
    """The person's emojis on each content they have a `REACTOR` item on (the
    list may be empty: every reaction taken back), from one batch get."""
    if not contents:
        return []
    found = await table.batch_get([keys.reactor(content.id, user_id) for content in contents])
    mine: list[tuple[Content, list[str]]] = []
    for content in contents:
        item = found.get(keys.reactor(content.id, user_id))
        if item is not None:
            emojis = sorted(name[len(REACTOR_ATTR) :] for name in item if name.startswith(REACTOR_ATTR))
            mine.append((content, emojis))
    return mine


async def comments_by(table: Table, content: Content, user_id: str) -> list[Comment]:
    if content.comment_count <= 0:
        return []
    found = await all_items(table, keys.content_pk(content.id), SortKey.begins_with(keys.COMMENT_PREFIX))
    return [Comment.from_item(item) for item in found if item.get("authorId") == user_id]


async def capsules_created(table: Table, user_id: str) -> list[Capsule]:
    found = await all_items(
        table, keys.user_pk(user_id), SortKey.begins_with(keys.CAPSULE_PREFIX), index="GSI1"
    )
    return [Capsule.from_item(item) for item in found]


async def received(table: Table, user_id: str) -> list[Recipient]:
    """Recipient items the person may know of (SCHEDULED or later)."""
    found = await all_items(
        table, keys.user_pk(user_id), SortKey.begins_with(keys.RECEIVED_PREFIX), index="GSI1"
    )
    return [Recipient.from_item(item) for item in found]


async def tags_by(table: Table, user_id: str) -> list[Tag]:
    found = await all_items(table, keys.my_tags_pk(user_id), index="GSI2")
    return [Tag.from_item(item) for item in found]


async def notifications_of(table: Table, user_id: str) -> list[Notification]:
    found = await all_items(table, keys.user_pk(user_id), SortKey.begins_with(keys.NOTIFICATION_PREFIX))
    return [Notification.from_item(item) for item in found]


@dataclass
class FamilyTraces:
    """What the person left in one family's feed."""

    own: list[Content] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)
    reactors: list[tuple[Content, list[str]]] = field(default_factory=list)  # (content, emojis)


async def traces_in(table: Table, user_id: str, contents: list[Content]) -> FamilyTraces:
    """One feed page's share: the person's content, and their comments and
    reactions on everyone else's."""
    others = [content for content in contents if content.author_id != user_id]
    found, comments = await asyncio.gather(
        reactors(table, others, user_id),
        asyncio.gather(*(comments_by(table, content, user_id) for content in others)),
    )
    return FamilyTraces(
        own=[content for content in contents if content.author_id == user_id],
        comments=[comment for per_content in comments for comment in per_content],
        reactors=found,
    )
