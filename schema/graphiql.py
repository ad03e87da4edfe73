"""The self-hosted GraphiQL page (no CDN): its HTML, the example operations it opens with,
and the folder holding its vendored assets.

app.py serves ``GRAPHIQL_HTML`` for ``GET /graphql`` (by overriding ``graphql_ide_html`` on its
``strawberry.asgi.GraphQL`` subclass) and mounts ``STATIC_DIR`` at ``/static/graphiql``.

``EXAMPLES`` is the one list of example operations: the page opens them as tabs (GraphiQL's
``defaultTabs``), and ``tests/test_graphiql.py`` checks that each validates against the schema and
that the README's ```graphql examples are the same operations, in the same order.
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
# The other tabs hold the README's example operations.

query Me {
  me { id givenName }
  myFamilies { role family { id name } }
}
"""

DEFAULT_HEADERS = '{\n  "Authorization": "Bearer <token>"\n}'

# The README's "Example operations", named so each tab has a title. "…" marks an id to fill in.
EXAMPLES: tuple[Example, ...] = (
    Example("""\
# Create a family: you become its ADMIN.
# Relatives join with its inviteCode.
mutation CreateFamily { createFamily(input: {name: "Los García", trustLevel: VOUCHED, vouchThreshold: 2}) {
  id inviteCode } }
"""),
    Example("""\
# Join a family with the code its ADMIN shares.
# VOUCHED and CLOSED families admit you as PENDING.
mutation JoinFamily { joinFamily(inviteCode: "K7M2Q-XW9PA") { role } }
"""),
    Example("""\
# Share a video: a family id (from myFamilies)
# in place of "…".
mutation CreateUpload { createUpload(input: {familyId: "…", type: VIDEO, mimeType: "video/mp4",
  sizeBytes: 1048576, title: "Primeros pasos"}) { uploadUrl content { id status } } }
# PUT the file to uploadUrl with the same Content-Type, then:
mutation CompleteUpload { completeUpload(contentId: "…") { status } }
"""),
    Example("""\
# Watch a content walk through the pipeline (its id
# in place of "…"); the first event is its status now.
subscription ContentStatus { contentStatusChanged(contentId: "…") { status mediaUrl thumbnailUrl } }
"""),
    Example("""\
# A family's feed, newest first (its id in place of "…").
query Feed { family(id: "…") { name feed(first: 20) { edges { node {
  title author { givenName } reactions { emoji count } viewerReactions commentCount tags { value } } }
  pageInfo { hasNextPage endCursor } } } }
"""),
    Example("""\
# Seal a time capsule for relatives: recipientIds are
# MEMBERs or ADMINs of the family.
mutation CreateCapsule { createCapsule(input: {familyId: "…", title: "Para tus 18",
  unlockDate: "2040-05-01T09:00:00Z", recipientIds: ["ben"]}) { id status } }
mutation ScheduleCapsule { scheduleCapsule(capsuleId: "…") { status } }
# then createUpload with capsuleId, PUT, completeUpload: the capsule is LOCKED until its date.
"""),
    Example("""\
# Every capsule you created or receive, as it opens.
subscription CapsuleUnlocked { capsuleUnlocked { unlockedAt capsule { title content { mediaUrl } } } }
"""),
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
