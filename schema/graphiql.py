"""The self-hosted GraphiQL page (no CDN): its HTML, the example operations it opens with,
and the folder holding its vendored assets.

app.py serves ``GRAPHIQL_HTML`` for ``GET /graphql`` (by overriding ``graphql_ide_html`` on its
``strawberry.asgi.GraphQL`` subclass) and mounts ``STATIC_DIR`` at ``/static/graphiql``.

``EXAMPLES`` is the one list of example operations: the page opens them as tabs (GraphiQL's
``defaultTabs``), and ``tests/test_graphiql.py`` checks that each validates against the schema and
that the API guide's (docs/guide.md) ```graphql examples are the same operations, in the same order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STATIC_DIR: Path = Path(__file__).resolve().parent.parent / "static" / "graphiql"


@dataclass(frozen=True)
class Example:
    """One tab: a document of named operations, with comments saying what to fill in."""

    query: str
    variables: str | None = None


# What the first tab holds when the page has no `query` parameter and the browser no saved tabs.
DEFAULT_QUERY = """\
# Welcome to the MiFamilias API.
#
# Every operation needs a token. Open the Headers tab
# below and put in it:
#   {"Authorization": "Bearer <token>"}
# Mint a token with  ./dev app token <id>
# or run  ./dev demo : it seeds a family and prints,
# for each member, a link that opens this page with
# their token already in the Headers tab.
#
# Then press the run button (or Ctrl-Enter).
# The other tabs hold the API guide's example operations.

query Me {
  me { id givenName }
  myFamilies { role family { id name } }
}
"""

DEFAULT_HEADERS = '{\n  "Authorization": "Bearer <token>"\n}'

# The API guide's "Example operations" (docs/guide.md), in order, grouped into tabs and named
# so each tab has a title; tests/test_graphiql.py checks they are the guide's blocks.
EXAMPLES: tuple[Example, ...] = (
    Example(
        """\
# Family: create, join, vouch, approve. Each operation says whose token it needs;
# a value in <angle brackets> comes from an earlier answer.

# as ana
mutation CreateFamily { createFamily(input: {name: "Los García", trustLevel: VOUCHED, vouchThreshold: 1}) {
  id inviteCode } }

# as ben
mutation JoinFamilyBen { joinFamily(inviteCode: "<invite code>") { role } }

# as ana
mutation Vouch { vouch(familyId: "<family id>", userId: "ben") { role vouchScore } }

# as cy
mutation JoinFamilyCy { joinFamily(inviteCode: "<invite code>") { role } }

# as ana
mutation ApproveMember { approveMember(familyId: "<family id>", userId: "cy") { role } }
"""
    ),
    Example(
        """\
# Upload a note and watch it. Each operation says whose token it needs;
# a value in <angle brackets> comes from an earlier answer.

# as ana
mutation CreateUploadNote { createUpload(input: {familyId: "<family id>", type: TEXT, mimeType: "text/plain",
  sizeBytes: 24, title: "Primeras palabras"}) { uploadUrl content { id status } } }

# as ana
mutation CompleteUploadNote { completeUpload(contentId: "<content id>") { status } }

# as ben
subscription ContentStatusChanged { contentStatusChanged(contentId: "<content id>") { status mediaUrl } }
"""
    ),
    Example(
        """\
# React, comment, tag, read the feed. Each operation says whose token it needs;
# a value in <angle brackets> comes from an earlier answer.

# as ben
mutation AddReaction { addReaction(contentId: "<content id>", emoji: "❤️") { reactions { emoji count } } }

# as cy
mutation AddComment { addComment(contentId: "<content id>", body: "¡Qué bonito!") { id body } }

# as ben
mutation SetTags { setTags(contentId: "<content id>", values: ["abuela", "verano"]) { value } }

# as ben
query Family { family(id: "<family id>") { name feed(first: 20) { edges { node {
  title author { givenName } reactions { emoji count } viewerReactions commentCount
  comments(first: 3) { edges { node { body author { givenName } } } } tags { value } } }
  pageInfo { hasNextPage endCursor } } } }
"""
    ),
    Example(
        """\
# Search and captions: content found by its title or by what is said in it, and
# what was said, with its language and WebVTT captions (null where nothing is
# spoken). The video and voice message of ./dev demo speak: search "steps" or "vamos".

# as ben
query SearchContent { searchContent(familyId: "<family id>", text: "primeras") { edges { node {
  id title type } } } }

# as ben
query Captions { content(id: "<content id>") { title transcription transcriptLanguage captionsUrl } }
"""
    ),
    Example(
        """\
# A time capsule. Each operation says whose token it needs;
# a value in <angle brackets> comes from an earlier answer.

# as ana
mutation CreateCapsule { createCapsule(input: {familyId: "<family id>", title: "Para tus 18",
  unlockDate: "2040-05-01T09:00:00Z", recipientIds: ["ben"]}) { id status } }

# as ana
mutation ScheduleCapsule { scheduleCapsule(capsuleId: "<capsule id>") { status } }

# as ana
mutation CreateUploadCapsule { createUpload(input: {familyId: "<family id>", type: TEXT,
  mimeType: "text/plain", sizeBytes: 24, capsuleId: "<capsule id>"}) { uploadUrl content { id status } } }

# as ana
mutation CompleteUploadCapsule { completeUpload(contentId: "<content id>") { status } }

# as ben
subscription CapsuleUnlocked { capsuleUnlocked { unlockedAt
  capsule { title status content { title mediaUrl } } } }
"""
    ),
)

# index.html holds this element; the page's configuration replaces its `{}`.
CONFIG_ELEMENT = '<script id="graphiql-config" type="application/json">{}</script>'


def page_config() -> dict[str, object]:
    return {
        "defaultQuery": DEFAULT_QUERY,
        "defaultHeaders": DEFAULT_HEADERS,
        "examples": [{"query": e.query, "variables": e.variables} for e in EXAMPLES],
    }


def render_page(template: str) -> str:
    """The page with its configuration inside; "<" escaped so no text can close the script element."""
    if CONFIG_ELEMENT not in template:
        raise RuntimeError(f"static/graphiql/index.html lost its {CONFIG_ELEMENT!r}")
    config = json.dumps(page_config(), ensure_ascii=False).replace("<", "\\u003c")
    return template.replace(CONFIG_ELEMENT, CONFIG_ELEMENT.replace("{}", config))


GRAPHIQL_HTML: str = render_page((STATIC_DIR / "index.html").read_text(encoding="utf-8"))

__all__ = ["DEFAULT_QUERY", "EXAMPLES", "GRAPHIQL_HTML", "STATIC_DIR", "Example"]
