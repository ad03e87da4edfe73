"""Search by what was said: `searchContent`, and the index it reads.

The index
---------
When content becomes READY, each distinct word of its title and transcription is one
`ContentWord` item in the content's own partition (`CONTENT#<id>` / `WORD#<word>`), so
deleting the content (or purging an account) deletes its words with its other children.
GSI1 (`WORDS#<family>` / `<word>#<contentId>`) lists a family's words in word order, so
"words that begin with p" is one `begins_with` query, as the tag search does. Words are
folded as tags are (`tags.search_form`: NFKC, case folded, accents dropped) and escaped the
same way (`tags.key_form`), so a word never holds the '#' that ends it in the sort key. A word
is a run of letters, digits or underscores; longer than `MAX_WORD` it is not indexed.
Writing the index again (a retried transcription) puts the new words and deletes the gone.

A search
--------
`text` is cut into words the same way (at most `MAX_TERMS`). The longest term reads the index
(the most selective one, as a rule); each hit is kept when

1. it is that content's first word with the term as prefix (one query of the content's own
   words, `begins_with`, limit 1): content that says "abuela" and "abuelo" comes once;
2. for every other term, the content has a word that begins with it (one such query each);
3. the viewer may read the content: the one read rule (`access.content_reader`), so sealed
   capsule content is found by its author alone, and an ex-member finds nothing.

The checks of every hit of a page run at once (the content read through the loader's
batch), so a page costs the family check, the index query and one round of checks.

Results come in the order of the matching word, then of the content id; a page is filled by
reading on, at most `SEARCH_READS` index queries, as tag pages are.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from resolvers.core.context import Context
from resolvers.core.errors import BadInput, not_found
from resolvers.core.pagination import ItemPage, filtered_page
from resolvers.domain import families
from resolvers.domain.access import content_reader as may_read
from resolvers.domain.tags import key_form, search_form
from store import keys
from store.items import Content, ContentWord
from store.port import Item, Key, SortKey, Table

MAX_TEXT = 200
MAX_TERMS = 10
MAX_WORD = 50
MAX_WORDS = 5_000  # per content: an hour of talk holds about 1,500 distinct words
SEARCH_READS = 5

_WORD = re.compile(r"\w+")


def words_of(text: str) -> list[str]:
    """The distinct index words of `text`, in their first order, escaped for keys."""
    seen: dict[str, None] = {}
    for match in _WORD.finditer(search_form(text)):
        word = match.group()
        if len(word) <= MAX_WORD:
            seen.setdefault(key_form(word), None)
    return list(seen)


def content_words(content: Content) -> list[str]:
    """What a content is found by: the words of its title and its transcription."""
    said = " ".join(part for part in (content.title, content.transcription) if part)
    return words_of(said)[:MAX_WORDS]


async def _indexed(table: Table, content_id: str) -> list[Key]:
    found: list[Key] = []
    cursor: str | None = None
    while True:
        page = await table.query(
            keys.content_pk(content_id), SortKey.begins_with(keys.CONTENT_WORD_PREFIX), cursor=cursor
        )
        found += [(item["PK"], item["SK"]) for item in page.items]
        if page.cursor is None:
            return found
        cursor = page.cursor


async def index_content(table: Table, content: Content) -> None:
    """Writes the index items of a READY content, and deletes those of words it no longer has."""
    wanted = {
        word.key: word
        for word in (ContentWord(content.id, content.family_id, w) for w in content_words(content))
    }
    held = set(await _indexed(table, content.id))
    puts = [word.to_item() for key, word in wanted.items() if key not in held]
    deletes = [key for key in held if key not in wanted]
    if puts or deletes:
        await table.batch_write(puts=puts, deletes=deletes)


def clean_text(raw: str) -> list[str]:
    if len(raw) > MAX_TEXT:
        raise BadInput(f"text must be at most {MAX_TEXT} characters")
    terms = words_of(raw)
    if not terms:
        raise BadInput("text must hold at least one word")
    if len(terms) > MAX_TERMS:
        raise BadInput(f"text may hold at most {MAX_TERMS} words")
    return terms


async def _first_with(table: Table, content_id: str, term: str) -> str | None:
    """The content's first index word that begins with `term`, if any."""
    page = await table.query(
        keys.content_pk(content_id), SortKey.begins_with(keys.CONTENT_WORD_PREFIX + term), limit=1
    )
    return page.items[0]["word"] if page.items else None


async def search_content(
    ctx: Context, family_id: str, text: str, first: int, after: str | None
) -> tuple[ItemPage, list[Content]]:
    """A page of the family's content found by `text`: the index items, and their content."""
    terms = clean_text(text)
    if not keys.usable_id(family_id):
        raise not_found("family")
    await families.readable_family(ctx, family_id)
    viewer = await ctx.viewer_id()
    lead = max(terms, key=len)
    others = [term for term in terms if term != lead]
    found: dict[Key, Content] = {}

    async def keep(hits: list[Item]) -> list[bool]:
        # Every hit's checks at once: one more round trip for the page, however many hits.
        return list(await asyncio.gather(*(_matches(ctx, hit, lead, others, found) for hit in hits)))

    page = await filtered_page(
        ctx,
        scope=f"search:{family_id}:{viewer}:{' '.join(terms)}",
        pk=keys.content_search_pk(family_id),
        sk=SortKey.begins_with(lead),
        index="GSI1",
        first=first,
        after=after,
        keep=keep,
        max_reads=SEARCH_READS,
    )
    return page, [found[(item["PK"], item["SK"])] for item in page.items]


async def _matches(
    ctx: Context, hit: Item, lead: str, others: Sequence[str], found: dict[Key, Content]
) -> bool:
    content_id = str(hit["contentId"])
    item, words = await asyncio.gather(
        ctx.loaders.item.load(keys.content(content_id)),
        asyncio.gather(*(_first_with(ctx.table, content_id, term) for term in (lead, *others))),
    )
    first, *rest = words
    if first != hit["word"]:
        return False  # found through an earlier word of the same content
    if item is None or any(word is None for word in rest):
        return False
    content = Content.from_item(item)
    if await may_read(ctx, content) is None:
        return False
    found[(hit["PK"], hit["SK"])] = content
    return True
