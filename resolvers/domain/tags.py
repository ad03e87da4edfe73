"""Tags: `setTags`, `searchTags`, `myTags`, `tagStatus`, `Content.tags`, and what
deleting content does to tags.

Normalization (one rule for stored values and for search prefixes)
------------------------------------------------------------------
A value is matched on its *search form*:

1. NFKC (full-width and half-width forms, ligatures, compatibility characters
   become their plain letters: "ﬁ" -> "fi", "ｶﾞ" -> "ガ");
2. casefold ("Straße" -> "strasse", "ΆΝΝΑ" -> "άννα", "İ" -> "i̇");
3. NFKD, then every combining mark of the general diacritic blocks
   (U+0300-036F, U+1AB0-1AFF, U+1DC0-1DFF, U+FE20-FE2F) is dropped, then NFKC
   again: "Ábuela" -> "abuela", "Việt" -> "viet", "Ελένη" -> "ελενη",
   "Йогурт" -> "иогурт". Marks outside those blocks stay, so Japanese voicing
   marks (が is not か), Indic vowel signs and the emoji keycap are kept, and
   letters that are not a base plus a mark (ø, đ, ł) stay themselves;
4. every run of white space becomes one space.

So "abu" and "ÁB" both find "Ábuela", "ss" and "ß" are the same, and case never
matters. The rule is idempotent. Prefixes go through the very same function
(`search_form`); only leading white space of a prefix is dropped (values are
trimmed, so none starts with a space), trailing space is kept ("abuela " finds
"abuela rosa" and not "abuelas").

Keys and the '#' separator
--------------------------
Sort keys are `<normalized>#<contentId>#<author>` (GSI1) and
`<normalized>#<contentId>` (GSI2). Values may contain '#', so the stored
`normalized` is the search form *escaped* (`key_form`): the five characters that
sort at or below '$' and may occur (space ! " # $) become "$0".."$4". After that
every character of a normalized value sorts above '#', which gives three things:
a normalized value never contains the separator, so `begins_with` on an escaped
prefix can only match inside the value part (never across '#'); the escape is
prefix-free and order-preserving, so "v starts with p" exactly when
"key(v) starts with key(p)"; and a shorter value sorts before its extensions
("a" < "a b" < "ab"), which is value order. Control characters and lone
surrogates are refused in values, set names and prefixes.

Values, sets and privacy
------------------------
`setTags` replaces the viewer's tags on one content: values are trimmed (NFC),
1 to 50 characters, duplicates (same normalized form) fold to the first
spelling, at most 10 remain; an empty list removes the viewer's tags. A value
that already was one of the viewer's tags keeps its `createdAt`. `setName` is
optional, trimmed (NFC), 1 to 64 characters, matched exactly (it names a set,
it is not searched). Private tags have no GSI1 keys, so family search never sees
them; `myTags` (GSI2) and `Content.tags` show them to their author only.

Tag-set markers
---------------
`TAGSET#<family>#<set>` / `ANY` counts the family's *public* tags in the set;
`USER#<user>` counts that user's tags in the set, private ones included (only
that user reads their marker). A marker is deleted when its count reaches zero.
`tagStatus` reads the two markers of the viewer in one batch get:
`taggedByViewer` = own count > 0; `taggedByAnyone` = public count > 0 or
`taggedByViewer`. A private tag therefore never makes `taggedByAnyone` true for
anyone but its author.

Consistency
-----------
Per content, a summary item (`CONTENT#<id>` / `TAGS`) lists every tag on it and
carries a `version`. `setTags` reads the summary (its old tags come from there:
one read, one consistent snapshot) and the markers it will touch, then writes
one transaction: old tag items deleted, new ones put, the summary put on
`version = <read>` (or absent), each marker put/deleted on `count = <read>` (or
absent), and a check that the content still exists. A cancelled transaction is
retried from fresh reads a few times, so concurrent `setTags` calls cannot
corrupt counts. Deleting content uses `cleanup_ops` in the content's own
transaction; the summary stays (with an empty list) when the last tag goes, so
its version only ever grows.
"""

from __future__ import annotations

import asyncio
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from resolvers.core.context import Context
from resolvers.core.cursors import Cursor
from resolvers.core.errors import BadInput, Conflict, not_found
from resolvers.core.pagination import filtered_page
from resolvers.core.validation import check_display
from resolvers.domain import access, families
from resolvers.domain.access import load_content, readable_content
from store import keys
from store.items import Content, Tag
from store.port import (
    MAX_TRANSACTION_ITEMS,
    Check,
    Condition,
    Delete,
    Exists,
    Index,
    Item,
    Key,
    NotExists,
    Put,
    SortKey,
    Table,
    TransactionCancelled,
    WriteOp,
    all_of,
    eq,
)

MAX_TAGS = 10  # per author per content
MAX_VALUE = 50
MAX_PREFIX = 100  # a search prefix; longer ones could never match a value
MAX_SET_NAME = 64
MAX_VALUES_SENT = 100  # more than this is refused before any work
MAX_KEY_BYTES = 512  # a normalized value in a sort key (DynamoDB allows 1024 bytes per key)
WRITE_ATTEMPTS = 8
SEARCH_READS = 5  # store queries one search page may make while filtering
# The content's own delete is the last op of delete_content's transaction.
CLEANUP_BUDGET = MAX_TRANSACTION_ITEMS - 1
SUMMARY_TYPE = "ContentTags"
MARKER_TYPE = "TagSetMarker"


# Normalization ------------------------------------------------------------------

_DIACRITIC_BLOCKS = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0xFE20, 0xFE2F))
_WHITESPACE = re.compile(r"\s+")
_ESCAPES = {" ": "$0", "!": "$1", '"': "$2", "#": "$3", "$": "$4"}


def _is_diacritic(ch: str) -> bool:
    cp = ord(ch)
    return any(low <= cp <= high for low, high in _DIACRITIC_BLOCKS)


def search_form(text: str) -> str:
    """NFKC, casefold, diacritics dropped, white space runs made one space."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    bare = "".join(ch for ch in unicodedata.normalize("NFKD", folded) if not _is_diacritic(ch))
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", bare))


def key_form(searchable: str) -> str:
    """The search form escaped so that no character sorts at or below '#'."""
    return "".join(_ESCAPES.get(ch, ch) for ch in searchable)


def normalize(text: str) -> str:
    """What `Tag.normalized` and the tag sort keys hold (for a trimmed value)."""
    return key_form(search_form(text).strip())


def _refuse_controls(text: str, field: str) -> None:
    # Search prefixes are never shown to anyone: only what breaks keys is refused.
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        raise BadInput(f"{field} must not contain control characters")


def clean_value(raw: str) -> tuple[str, str]:
    """(the value as shown, its normalized form)."""
    value = unicodedata.normalize("NFC", raw.strip())
    if not value:
        raise BadInput("a tag value must not be empty")
    if len(value) > MAX_VALUE:
        raise BadInput(f"a tag value must be at most {MAX_VALUE} characters")
    check_display(value, "a tag value")
    normalized = normalize(value)
    if not normalized:
        raise BadInput(f"the tag value {value!r} has nothing left once normalized")
    if len(normalized.encode()) > MAX_KEY_BYTES:
        raise BadInput(f"the tag value {value!r} is too long once normalized")
    return value, normalized


def clean_values(values: Sequence[str]) -> list[tuple[str, str]]:
    if len(values) > MAX_VALUES_SENT:
        raise BadInput(f"at most {MAX_TAGS} tag values per content")
    wanted: dict[str, str] = {}
    for raw in values:
        value, normalized = clean_value(raw)
        wanted.setdefault(normalized, value)  # the first spelling wins
    if len(wanted) > MAX_TAGS:
        raise BadInput(f"at most {MAX_TAGS} tag values per content")
    return [(value, normalized) for normalized, value in wanted.items()]


def clean_set_name(raw: str) -> str:
    name = unicodedata.normalize("NFC", raw.strip())
    if not name:
        raise BadInput("setName must not be empty")
    if len(name) > MAX_SET_NAME:
        raise BadInput(f"setName must be at most {MAX_SET_NAME} characters")
    check_display(name, "setName")
    return name


def clean_prefix(raw: str) -> str:
    """The escaped search form of a prefix; "" when nothing is left."""
    if len(raw) > MAX_PREFIX:
        raise BadInput(f"prefix must be at most {MAX_PREFIX} characters")
    _refuse_controls(raw, "prefix")
    return key_form(search_form(raw).lstrip())


# The per-content summary ------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    content_id: str
    family_id: str
    version: int | None  # None: no summary item yet
    tags: tuple[Tag, ...]


def _entry(tag: Tag) -> Item:
    return {
        "value": tag.value,
        "normalized": tag.normalized,
        "authorId": tag.author_id,
        "private": tag.private,
        "setName": tag.set_name,
        "mimeType": tag.mime_type,
        "createdAt": tag.created_at,
    }


def _from_entry(entry: Item, content_id: str, family_id: str) -> Tag:
    return Tag(
        author_id=entry["authorId"],
        content_id=content_id,
        family_id=family_id,
        value=entry["value"],
        normalized=entry["normalized"],
        created_at=entry["createdAt"],
        private=bool(entry.get("private", False)),
        set_name=entry.get("setName"),
        mime_type=entry.get("mimeType"),
    )


def summary_of(item: Item | None, content: Content) -> Summary:
    if item is None:
        return Summary(content.id, content.family_id, None, ())
    tags = tuple(_from_entry(entry, content.id, content.family_id) for entry in item.get("tags") or ())
    return Summary(content.id, content.family_id, int(item["version"]), tags)


def _summary_item(content: Content, version: int, tags: Iterable[Tag]) -> Item:
    pk, sk = keys.content_tags(content.id)
    ordered = sorted(tags, key=lambda t: (t.normalized, t.author_id))
    return {
        "PK": pk,
        "SK": sk,
        "type": SUMMARY_TYPE,
        "contentId": content.id,
        "familyId": content.family_id,
        "version": version,
        "tags": [_entry(tag) for tag in ordered],
    }


def _summary_guard(summary: Summary) -> Condition:
    return NotExists() if summary.version is None else eq("version", summary.version)


# Tag-set markers ------------------------------------------------------------------


@dataclass
class _MarkerChange:
    family_id: str
    set_name: str
    user_id: str | None  # None: the ANY marker
    delta: int = 0


def _marker_changes(
    tags: Iterable[Tag], sign: int, into: dict[Key, _MarkerChange], *, sealed: bool, own: bool = True
) -> None:
    """Tags on sealed content count for their author only, as in search: the
    ANY marker must not reveal that sealed content exists. `unseal_ops` counts
    them there when the capsule opens."""
    for tag in tags:
        if tag.set_name is None:
            continue
        if own:
            mine = keys.tagset_user(tag.family_id, tag.set_name, tag.author_id)
            into.setdefault(mine, _MarkerChange(tag.family_id, tag.set_name, tag.author_id)).delta += sign
        if not tag.private and not sealed:
            anyone = keys.tagset_any(tag.family_id, tag.set_name)
            into.setdefault(anyone, _MarkerChange(tag.family_id, tag.set_name, None)).delta += sign


def _count(item: Item | None) -> int:
    return int(item.get("count", 0)) if item else 0


def _marker_ops(changes: dict[Key, _MarkerChange], found: dict[Key, Item]) -> list[WriteOp]:
    """Each write is conditioned on the count read, so a concurrent change
    cancels the transaction instead of being lost."""
    ops: list[WriteOp] = []
    for key, change in changes.items():
        if change.delta == 0:
            continue
        item = found.get(key)
        guard = NotExists() if item is None else eq("count", item.get("count"))
        count = max(0, _count(item) + change.delta)
        if count == 0:
            if item is not None:
                ops.append(Delete(key, guard))
            continue
        marker: Item = {
            "PK": key[0],
            "SK": key[1],
            "type": MARKER_TYPE,
            "familyId": change.family_id,
            "setName": change.set_name,
            "count": count,
        }
        if change.user_id is not None:
            marker["userId"] = change.user_id
        ops.append(Put(marker, guard))
    return ops


async def _batch_get(ctx: Context, wanted: Sequence[Key]) -> dict[Key, Item]:
    return await ctx.table.batch_get(list(wanted)) if wanted else {}


# setTags ------------------------------------------------------------------------------


async def set_tags(
    ctx: Context, content_id: str, values: Sequence[str], set_name: str | None, private: bool
) -> tuple[Content, list[Tag]]:
    """The viewer's new tags on the content, in the order given."""
    viewer = await ctx.viewer_id()
    wanted = clean_values(values)
    name = None if set_name is None else clean_set_name(set_name)
    found = await load_content(ctx, content_id)
    if found is not None:
        # What the write reads first (the summary, the markers the new tags
        # touch), asked for beside the viewer's membership: it is wanted only
        # if the rule allows, and then costs no round trip of its own.
        now = ctx.services.now_iso()
        ctx.loaders.ask(*_first_reads(found, _fresh(found, viewer, wanted, name, private, now)))
    content, _ = await readable_content(ctx, content_id)
    return content, await _replace(ctx, content, viewer, wanted, name, private, asked=True)


def _fresh(
    content: Content,
    author_id: str,
    wanted: list[tuple[str, str]],
    set_name: str | None,
    private: bool,
    now: str,
) -> list[Tag]:
    return [
        Tag(author_id, content.id, content.family_id, v, n, now, private, set_name, content.mime_type)
        for v, n in wanted
    ]


def _first_reads(content: Content, fresh: list[Tag]) -> list[Key]:
    changes: dict[Key, _MarkerChange] = {}
    _marker_changes(fresh, +1, changes, sealed=access.is_sealed(content))
    return [keys.content_tags(content.id), *changes]


async def _replace(
    ctx: Context,
    content: Content,
    author_id: str,
    wanted: list[tuple[str, str]],
    set_name: str | None,
    private: bool,
    *,
    asked: bool = False,
) -> list[Tag]:
    """`asked`: the caller asked the loaders for the first attempt's first reads
    in this operation, and nothing has written them since."""
    summary_key = keys.content_tags(content.id)
    for attempt in range(WRITE_ATTEMPTS):
        now = ctx.services.now_iso()
        fresh = _fresh(content, author_id, wanted, set_name, private, now)
        # The summary and the markers the new tags touch leave together; markers
        # of an older set (known only from the summary) follow when there are any.
        changes: dict[Key, _MarkerChange] = {}
        sealed = access.is_sealed(content)
        _marker_changes(fresh, +1, changes, sealed=sealed)
        first = [summary_key, *changes]
        if asked and attempt == 0:
            found = {k: i for k, i in zip(first, await ctx.loaders.many(first), strict=True) if i is not None}
        else:  # a retry reads what changed meanwhile
            found = await _batch_get(ctx, first)
        summary = summary_of(found.get(summary_key), content)
        old = [tag for tag in summary.tags if tag.author_id == author_id]
        since = {tag.normalized: tag.created_at for tag in old}
        new = [replace(tag, created_at=since.get(tag.normalized, tag.created_at)) for tag in fresh]
        _marker_changes(old, -1, changes, sealed=sealed)
        # Only markers not read above: one found missing there is missing still.
        found.update(await _batch_get(ctx, [key for key in changes if key not in first]))

        kept = [tag for tag in summary.tags if tag.author_id != author_id]
        item = _summary_item(content, (summary.version or 0) + 1, [*kept, *new])
        new_keys = {tag.key for tag in new}
        # Sealed content must still be sealed when the counts above are written.
        still = all_of(Exists(), NotExists("GSI1PK")) if sealed else Exists()
        ops: list[WriteOp] = [Check(content.key, still)]
        ops += [Delete(tag.key) for tag in old if tag.key not in new_keys]
        ops += [Put(tag.to_item()) for tag in new]
        ops.append(Put(item, _summary_guard(summary)))
        ops += _marker_ops(changes, found)
        try:
            await ctx.table.transact(ops)
        except TransactionCancelled as error:
            if any(r.key == content.key and r.reason == "ConditionalCheckFailed" for r in error.reasons):
                # Gone, or its capsule opened meanwhile: read it again.
                fresh_item = await ctx.table.get(content.key)
                if fresh_item is None:
                    raise not_found("content") from error
                content = Content.from_item(fresh_item)
                continue
            await asyncio.sleep(random.uniform(0, min(0.5, 0.01 * 2**attempt)))
            continue
        ctx.loaders.remember(item)
        return new
    raise Conflict("the tags of this content changed meanwhile; try again")


# Deleting content ---------------------------------------------------------------------


async def remove_author(ctx: Context, content: Content, author_id: str) -> bool:
    """Removes one author's tags from the content, summary and markers kept in
    step as `setTags` with no values keeps them; False when they had none there."""
    summary = summary_of(await ctx.table.get(keys.content_tags(content.id)), content)
    if not any(tag.author_id == author_id for tag in summary.tags):
        return False
    await _replace(ctx, content, author_id, [], None, False)
    return True


async def cleanup_ops(
    ctx: Context, content: Content, summary_item: Item | Literal["unread"] | None = "unread"
) -> list[WriteOp]:
    """The ops that remove the content's tags and keep the markers in step, for
    the content's own delete transaction. They are conditioned on the summary's
    version, so a `setTags` racing the delete cancels it rather than leaving
    tags behind. When one transaction could not hold them all, whole authors'
    tags are removed first, each in a transaction of its own that leaves tags,
    summary and markers consistent (as `setTags` with no values would).
    `summary_item`: the summary as the caller just read it (None when it found
    none), for the first pass; read here when the caller has not."""
    summary_key = keys.content_tags(content.id)
    for attempt in range(MAX_TRANSACTION_ITEMS):
        if attempt == 0 and summary_item != "unread":
            read = summary_item
        else:
            read = await ctx.table.get(summary_key)
        summary = summary_of(read, content)
        if summary.version is None:
            return [Check(summary_key, NotExists())]
        changes: dict[Key, _MarkerChange] = {}
        _marker_changes(summary.tags, -1, changes, sealed=access.is_sealed(content))
        found = await _batch_get(ctx, list(changes))
        ops: list[WriteOp] = [Delete(tag.key) for tag in summary.tags]
        ops += _marker_ops(changes, found)
        ops.append(Delete(summary_key, eq("version", summary.version)))
        if len(ops) <= CLEANUP_BUDGET:
            return ops
        author, _ = Counter(tag.author_id for tag in summary.tags).most_common(1)[0]
        await _replace(ctx, content, author, [], None, False)
    raise Conflict("the tags of this content keep changing; try again")


# A capsule opening -------------------------------------------------------------------


async def unseal_ops(table: Table, content: Content, summary_item: Item | None) -> list[WriteOp]:
    """The ops that count the content's public set tags in their ANY markers,
    for the unlock's own transaction. They are conditioned on the summary's
    version and on the counts read, so a `setTags` racing the unlock cancels it
    and the next pass tries again with fresh reads."""
    summary_key = keys.content_tags(content.id)
    summary = summary_of(summary_item, content)  # read by the caller, in its batch
    if summary.version is None:
        return [Check(summary_key, NotExists())]
    changes: dict[Key, _MarkerChange] = {}
    _marker_changes(summary.tags, +1, changes, sealed=False, own=False)
    found = await table.batch_get(list(changes)) if changes else {}
    return [Check(summary_key, eq("version", summary.version)), *_marker_ops(changes, found)]


# Reading --------------------------------------------------------------------------------


async def content_tags(ctx: Context, content: Content) -> list[Tag]:
    """Every tag on the content the viewer may see, from the summary item (one
    point read that joins the batch of its resolver level)."""
    item = await ctx.loaders.item.load(keys.content_tags(content.id))
    # The rule decides each (private tags are their author's; a departing
    # author's are nobody's): nothing it needs is not loaded with the content.
    return await access.readable(ctx, summary_of(item, content).tags)


async def tag_status(ctx: Context, family_id: str, set_name: str) -> tuple[bool, bool]:
    """(taggedByAnyone, taggedByViewer), from the markers and the viewer's
    membership in one batch get."""
    name = clean_set_name(set_name)
    if not keys.usable_id(family_id):
        raise not_found("family")
    viewer = await ctx.viewer_id()
    family, member, anyone, own = await ctx.loaders.many(
        [
            keys.family(family_id),
            keys.member(family_id, viewer),
            keys.tagset_any(family_id, name),
            keys.tagset_user(family_id, name, viewer),
        ]
    )
    if family is None or member is None or member.get("role") not in access.READERS:
        raise not_found("family")
    by_viewer = _count(own) > 0
    return _count(anyone) > 0 or by_viewer, by_viewer


@dataclass(frozen=True)
class TagPage:
    tags: list[Tag]
    contents: list[Content]  # the content of each tag, already checked readable
    cursors: list[Cursor]
    has_next: bool
    end_cursor: Cursor | str | None


async def search_tags(ctx: Context, family_id: str, prefix: str, first: int, after: str | None) -> TagPage:
    start = clean_prefix(prefix)
    if not start:
        raise BadInput("prefix must not be empty")
    if not keys.usable_id(family_id):
        raise not_found("family")
    await families.readable_family(ctx, family_id)
    viewer = await ctx.viewer_id()
    return await _tag_page(
        ctx,
        scope=f"tags:{family_id}:{viewer}:{start}",
        pk=keys.tag_search_pk(family_id),
        sk=SortKey.begins_with(start),
        index="GSI1",
        first=first,
        after=after,
    )


async def my_tags(ctx: Context, prefix: str, first: int, after: str | None) -> TagPage:
    start = clean_prefix(prefix)
    viewer = await ctx.viewer_id()
    return await _tag_page(
        ctx,
        scope=f"mytags:{viewer}:{start}",
        pk=keys.my_tags_pk(viewer),
        sk=SortKey.begins_with(start) if start else None,
        index="GSI2",
        first=first,
        after=after,
    )


async def _tag_page(
    ctx: Context, *, scope: str, pk: str, sk: SortKey | None, index: Index, first: int, after: str | None
) -> TagPage:
    """A page of the tags the viewer may see, in value order."""
    seen: dict[Key, tuple[Tag, Content]] = {}

    async def keep(found: list[Item]) -> list[bool]:
        visible = await _visible(ctx, found)
        seen.update({(i["PK"], i["SK"]): v for i, v in zip(found, visible, strict=True) if v is not None})
        return [v is not None for v in visible]

    page = await filtered_page(
        ctx,
        scope=scope,
        pk=pk,
        sk=sk,
        index=index,
        first=first,
        after=after,
        keep=keep,
        max_reads=SEARCH_READS,
    )
    pairs = [seen[(item["PK"], item["SK"])] for item in page.items]
    return TagPage(
        [tag for tag, _ in pairs],
        [content for _, content in pairs],
        page.cursors,
        page.has_next,
        page.end_cursor,
    )


async def _visible(ctx: Context, found: list[Item]) -> list[tuple[Tag, Content] | None]:
    """Each tag with its content, or None when the viewer may not see it: a
    private tag of someone else, content deleted, content the viewer cannot
    read (sealed capsule content of another author, a family they left)."""
    viewer = await ctx.viewer_id()
    tags = [Tag.from_item(item) for item in found]
    content_items = await ctx.loaders.many([keys.content(tag.content_id) for tag in tags])
    contents = [Content.from_item(item) if item else None for item in content_items]
    # Memberships and families of every family involved in one batch; the rule then hits the cache.
    family_ids = sorted({c.family_id for c in contents if c is not None})
    await ctx.loaders.many(
        [keys.member(family_id, viewer) for family_id in family_ids]
        + [keys.family(family_id) for family_id in family_ids]
    )
    verdicts = await access.verdicts(ctx, tags)
    return [
        (tag, content) if allowed and content is not None else None
        for tag, content, allowed in zip(tags, contents, verdicts, strict=True)
    ]
