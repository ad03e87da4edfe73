"""The self-hosted GraphiQL page (no CDN): its HTML and the folder holding its vendored assets.

app.py serves ``GRAPHIQL_HTML`` for ``GET /graphql`` (by overriding ``graphql_ide_html`` on its
``strawberry.asgi.GraphQL`` subclass) and mounts ``STATIC_DIR`` at ``/static/graphiql``.
"""

from pathlib import Path

STATIC_DIR: Path = Path(__file__).resolve().parent.parent / "static" / "graphiql"
GRAPHIQL_HTML: str = (STATIC_DIR / "index.html").read_text(encoding="utf-8")

__all__ = ["GRAPHIQL_HTML", "STATIC_DIR"]
