"""`./dev demo` end to end: `python app.py demo` on a fresh data directory, in a
server process; the world it printed and seeded, checked over HTTP, over a
WebSocket and in headless Chromium with the links it printed."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from gql import Client, GraphQLRequest
from gql.transport.websockets import WebsocketsTransport

from resolvers.adapters import media
from tests.browser import (
    HEADERS_EDITOR,
    QUERY_EDITOR,
    editor_text,
    graphiql_page,
    open_graphiql,
    run_and_read,
)
from tests.servers import ROOT, ServerProcess, until

# Long enough for the test to subscribe after the server answers; the default is 120.
UNLOCK_SECONDS = 25
EXPECTED = [
    ("ana", "Ana García", "ADMIN"),
    ("ben", "Ben García", "MEMBER"),
    ("carla", "Carla Ruiz", "MEMBER"),
    ("diego", "Diego García", "MEMBER"),
    ("elena", "Elena Ruiz", "PENDING"),
]
MEMBER_LINES = re.compile(
    r"^  (?P<name>.+) \((?P<role>[A-Z]+), id (?P<id>\S+)\)\n"
    r"    token:    (?P<token>\S+)\n"
    r"    GraphiQL: (?P<link>\S+)$",
    re.MULTILINE,
)
MAGIC: dict[str, Callable[[bytes], bool]] = {
    "VIDEO": lambda body: body[4:8] == b"ftyp",
    "AUDIO": lambda body: body[4:8] == b"ftyp",
    "PHOTO": lambda body: body[:3] == b"\xff\xd8\xff",
    "TEXT": lambda body: len(body.decode("utf-8").strip()) > 0,
}


@dataclass(frozen=True)
class Printed:
    id: str
    name: str
    role: str
    token: str
    link: str


def start_demo(data_dir: Path, **env: str) -> ServerProcess:
    server = ServerProcess(
        data_dir,
        {
            # The embedded store, and tokens from the data directory's own secret.
            "MIFAMILIAS_AUTH_SECRET": "",
            "MIFAMILIAS_DYNAMODB_ENDPOINT": "",
            "MIFAMILIAS_AWS_REGION": "",
            "MIFAMILIAS_S3_BUCKET": "",
            "MIFAMILIAS_JWKS_URL": "",
            "MIFAMILIAS_UNLOCK_POLL_SECONDS": "0.5",
            **env,
        },
        argv=[sys.executable, str(ROOT / "app.py"), "demo"],
        name="demo",
    )
    return server.start(timeout=240)  # it answers once the world is seeded


def printed(server: ServerProcess) -> list[Printed]:
    return [
        Printed(m["id"], m["name"], m["role"], m["token"], m["link"])
        for m in MEMBER_LINES.finditer(server.log())
    ]


class Api:
    def __init__(self, server: ServerProcess, people: list[Printed]) -> None:
        self.server = server
        self.tokens = {person.id: person.token for person in people}

    async def post(self, user: str, query: str, **variables: Any) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{self.server.url}/graphql",
                json={"query": query, "variables": variables},
                headers={"Authorization": f"Bearer {self.tokens[user]}"},
            )
        body: dict[str, Any] = response.json()
        return body

    async def ok(self, user: str, query: str, **variables: Any) -> Any:
        body = await self.post(user, query, **variables)
        assert "errors" not in body, body
        return body["data"]


FEED = """query($f: ID!) { family(id: $f) { name feed(first: 20) { edges { node {
  id type status title mediaUrl thumbnailUrl author { id }
  reactions { emoji count } commentCount comments { edges { node { body author { id } } } }
  tags { value author { id } } } } } } }"""
CAPSULES = "{ receivedCapsules { edges { node { id title status content { type status mediaUrl } } } } }"


async def check_media(node: dict[str, Any], folder: Path) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        body = (await client.get(node["mediaUrl"])).content
        assert MAGIC[node["type"]](body), (node["type"], body[:16])
        if node["type"] in ("VIDEO", "AUDIO"):
            path = folder / node["id"]
            path.write_bytes(body)
            found = await media.probe(path)
            assert found.has_audio and found.has_video == (node["type"] == "VIDEO"), found
        if node["type"] in ("VIDEO", "PHOTO"):
            thumbnail = (await client.get(node["thumbnailUrl"])).content
            assert thumbnail[:3] == b"\xff\xd8\xff"


async def check_world(api: Api, people: list[Printed], folder: Path) -> None:
    """Everything the demo says it seeded, as its members see it (but the capsule still to open)."""
    mine = (await api.ok("ana", "{ myFamilies { role family { id name } } }"))["myFamilies"]
    assert [(m["role"], m["family"]["name"]) for m in mine] == [("ADMIN", "Los García")]
    family_id = mine[0]["family"]["id"]
    for person in people:
        theirs = (await api.ok(person.id, "{ me { id } myFamilies { role family { id } } }"))["myFamilies"]
        assert theirs == [{"role": person.role, "family": {"id": family_id}}]

    feed = (await api.ok("ana", FEED, f=family_id))["family"]["feed"]["edges"]
    # The other capsule's photo joins the feed when it opens, maybe while this runs.
    nodes = [edge["node"] for edge in feed if edge["node"]["title"] != "Una postal para el futuro"]
    assert sorted(node["type"] for node in nodes) == ["AUDIO", "PHOTO", "TEXT", "TEXT", "VIDEO"]
    assert all(node["status"] == "READY" for node in nodes), nodes
    for node in nodes:
        await check_media(node, folder)
    by_title = {node["title"]: node for node in nodes}
    video = by_title["Primeros pasos"]
    assert sorted((r["emoji"], r["count"]) for r in video["reactions"]) == [("❤️", 2), ("👏", 1)]
    assert video["commentCount"] == 2
    assert sorted(c["node"]["author"]["id"] for c in video["comments"]["edges"]) == ["ben", "carla"]
    assert sum(node["commentCount"] for node in nodes) == 5
    assert sum(r["count"] for node in nodes for r in node["reactions"]) == 6

    # The video and the voice message speak (English, Spanish): transcribed, captioned and found.
    spoken = "query($id: ID!) { content(id: $id) { transcription transcriptLanguage captionsUrl } }"
    for title, language, word in (("Primeros pasos", "en", "steps"), ("Canción de cuna", "es", "vamos")):
        heard = (await api.ok("ana", spoken, id=by_title[title]["id"]))["content"]
        assert heard["transcriptLanguage"] == language and heard["captionsUrl"], heard
        assert word in heard["transcription"].lower(), heard
        search = "query($f: ID!, $t: String!) { searchContent(familyId: $f, text: $t) { edges { node { title } } } }"
        found = (await api.ok("ana", search, f=family_id, t=word))["searchContent"]["edges"]
        assert [edge["node"]["title"] for edge in found] == [title]

    # Public tags for everyone in the family; a private one for its author alone.
    ana_sees = {(t["value"], t["author"]["id"]) for t in by_title["La playa"]["tags"]}
    assert ana_sees == {("playa", "ben"), ("verano", "ben"), ("favoritas", "ana")}
    ben_feed = (await api.ok("ben", FEED, f=family_id))["family"]["feed"]["edges"]
    ben_sees = {
        (t["value"], t["author"]["id"])
        for e in ben_feed
        if e["node"]["title"] == "La playa"
        for t in e["node"]["tags"]
    }
    assert ben_sees == {("playa", "ben"), ("verano", "ben")}
    assert (await api.ok("ana", '{ myTags(prefix: "fav") { edges { node { value } } } }'))["myTags"][
        "edges"
    ] == [{"node": {"value": "favoritas"}}]

    # The PENDING member sees the family, not its feed.
    refused = await api.post("elena", FEED, f=family_id)
    assert refused["errors"][0]["extensions"]["code"] == "FORBIDDEN"

    capsules = {
        e["node"]["title"]: e["node"] for e in (await api.ok("ben", CAPSULES))["receivedCapsules"]["edges"]
    }
    opened = capsules["La receta de la abuela"]
    assert opened["status"] == "AVAILABLE"
    assert opened["content"]["type"] == "TEXT" and opened["content"]["status"] == "READY"


async def test_the_demo_seeds_a_world_prints_its_links_and_opens_a_capsule_live(tmp_path: Path) -> None:
    server = start_demo(tmp_path / "data", MIFAMILIAS_DEMO_UNLOCK_SECONDS=str(UNLOCK_SECONDS))
    try:
        people = printed(server)
        assert [(p.id, p.name, p.role) for p in people] == EXPECTED, server.log()
        assert "valid for 30 days" in server.log()
        api = Api(server, people)
        transport = WebsocketsTransport(
            url=server.ws_url,
            init_payload={"Authorization": f"Bearer {api.tokens['ben']}"},
            subprotocols=[WebsocketsTransport.GRAPHQLWS_SUBPROTOCOL],
        )
        unlocked: list[dict[str, Any]] = []
        async with Client(transport=transport) as session:

            async def listen() -> None:
                request = GraphQLRequest(
                    "subscription { capsuleUnlocked { capsule { id title status content { type status } } } }"
                )
                async for event in session.subscribe(request):
                    unlocked.append(event["capsuleUnlocked"])

            listener = asyncio.create_task(listen())
            # A subscription sent after it answers at once: by then the first is registered.
            note = await api.ok(
                "ben", "{ myFamilies { family { feed(first: 1) { edges { node { id } } } } } }"
            )
            status = GraphQLRequest(
                "subscription($id: ID!) { contentStatusChanged(contentId: $id) { status } }",
                variable_values={"id": note["myFamilies"][0]["family"]["feed"]["edges"][0]["node"]["id"]},
            )
            stream = session.subscribe(status)
            await asyncio.wait_for(anext(stream), 30)
            await stream.aclose()

            received = (await api.ok("ben", CAPSULES))["receivedCapsules"]["edges"]
            live = next(
                e["node"] for e in received if e["node"]["title"] == "Un mensaje para dentro de un rato"
            )
            # Sealed until its date: a recipient sees it, not what it holds.
            assert live["content"] is None
            assert live["status"] == "LOCKED", (
                f"it opened before the test could watch: raise {UNLOCK_SECONDS=}"
            )
            live_id = live["id"]

            await check_world(api, people, tmp_path)

            async with graphiql_page(server.url) as page:
                for person in people:
                    await open_graphiql(page, person.link)
                    headers = json.loads(await editor_text(page, HEADERS_EDITOR))
                    assert headers == {"Authorization": f"Bearer {person.token}"}
                    assert "me { id givenName }" in await editor_text(page, QUERY_EDITOR)
                    answer = json.loads(await run_and_read(page))
                    await page.screenshot(path=str(tmp_path / f"graphiql-{person.id}.png"))
                    assert answer["data"]["me"] == {"id": person.id, "givenName": person.name.split()[0]}
                    assert [m["role"] for m in answer["data"]["myFamilies"]] == [person.role]

            await until(lambda: unlocked, "a capsuleUnlocked event", UNLOCK_SECONDS + 60)
            listener.cancel()
        assert unlocked == [
            {
                "capsule": {
                    "id": live_id,
                    "title": "Un mensaje para dentro de un rato",
                    "status": "AVAILABLE",
                    "content": {"type": "PHOTO", "status": "READY"},
                }
            }
        ]
    finally:
        server.stop()


async def snapshot(api: Api) -> dict[str, Any]:
    mine = await api.ok("ana", "{ myFamilies { family { id } } myCapsules { edges { node { id status } } } }")
    family_id = mine["myFamilies"][0]["family"]["id"]
    family = await api.ok(
        "ana",
        """query($f: ID!) { family(id: $f) { members { edges { node { role user { id } } } }
        feed(first: 50) { edges { node { id commentCount reactions { emoji count } tags { value } } } } } }""",
        f=family_id,
    )
    return {"families": mine["myFamilies"], "capsules": mine["myCapsules"], "family": family}


async def test_a_second_run_serves_the_same_world_without_seeding_again(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = start_demo(data, MIFAMILIAS_DEMO_UNLOCK_SECONDS="3600")  # nothing opens between the runs
    try:
        people = printed(first)
        api = Api(first, people)
        # A member made a co-admin between the runs: the next run prints them as one.
        promoted = next(p for p in people if p.role == "MEMBER")
        family_id = (await api.ok("ana", "{ myFamilies { family { id } } }"))["myFamilies"][0]["family"]["id"]
        await api.ok(
            "ana",
            "mutation($f: ID!, $u: ID!) { setMemberRole(familyId: $f, userId: $u, role: ADMIN) { role } }",
            f=family_id,
            u=promoted.id,
        )
        before = await snapshot(api)
        world_file = (data / "demo-world.json").read_bytes()
    finally:
        first.stop()
    assert "Seeded a demo world" in first.log()

    second = start_demo(data, MIFAMILIAS_DEMO_UNLOCK_SECONDS="3600")
    try:
        again = printed(second)
        now = [(p.id, "ADMIN" if p.id == promoted.id else p.role) for p in people]
        assert [(p.id, p.role) for p in again] == now
        assert "nothing seeded" in second.log() and "Seeding" not in second.log()
        assert await snapshot(Api(second, again)) == before
        assert (data / "demo-world.json").read_bytes() == world_file
        assert all(p.link.startswith(f"{second.url}/graphql?") for p in again)
    finally:
        second.stop()
