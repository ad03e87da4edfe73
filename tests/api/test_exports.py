"""Exporting one's data through the API, on both engines and both blob
stores: the zip opened and checked against what the person made, the owner
alone reading it, expiry, the rate limit, and one build per export."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from resolvers.core.leases import Lease
from resolvers.domain import exports
from resolvers.processes.exports import ExportBuilder
from store import keys
from store.port import SortKey
from tests import media_factory
from tests.api.conftest import Api
from tests.factories import join, make_family, settle, upload
from tests.push_service import PushService
from tests.typical_calls import PUSH_ORIGIN

REQUEST = "mutation { requestDataExport { id status downloadUrl expiresAt } }"
READ = "query($id: ID!) { dataExport(id: $id) { id status downloadUrl expiresAt } }"
COMMENT = "mutation($c: ID!, $b: String!) { addComment(contentId: $c, body: $b) { id } }"
REACT = "mutation($c: ID!, $e: String!) { addReaction(contentId: $c, emoji: $e) { id } }"
TAG = """mutation($c: ID!, $v: [String!]!, $s: String, $p: Boolean) {
  setTags(contentId: $c, values: $v, setName: $s, private: $p) { value } }"""
CREATE_CAPSULE = "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"
SCHEDULE = "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }"


async def fetch(api: Api, url: str) -> bytes:
    if url.startswith("http://127.0.0.1:8000/"):
        response = await api.client.get(url.removeprefix("http://127.0.0.1:8000"))
    else:
        async with httpx.AsyncClient() as client:
            response = await client.get(url)
    assert response.status_code == 200, response.text
    return response.content


async def capsule(api: Api, creator: str, family: str, recipients: list[str], **due: float) -> str:
    variables = {
        "i": {
            "familyId": family,
            "title": f"de {creator}",
            "unlockDate": (api.clock.moment + timedelta(**due)).isoformat(),
            "recipientIds": recipients,
        }
    }
    made = str((await api.ok(CREATE_CAPSULE, variables, as_=creator))["createCapsule"]["id"])
    await api.ok(SCHEDULE, {"id": made}, as_=creator)
    return made


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_an_export_holds_what_the_person_made(media_api: Api, tmp_path: Path) -> None:
    api = media_api
    await api.sign_in("ana", "ben")
    family = await make_family(api, "ben", "Los García")
    await join(api, "ana", family["inviteCode"])
    photo = media_factory.make_png(tmp_path, (64, 48)).read_bytes()
    note = await upload(api, "ana", family["id"], "TEXT", "hola, abuela 👋".encode(), "text/plain", "nota")
    picture = await upload(api, "ana", family["id"], "PHOTO", photo, "image/png", "foto")
    theirs = await upload(api, "ben", family["id"], "TEXT", b"de ben", "text/plain", "de ben")
    await settle(api)
    await api.ok(COMMENT, {"c": theirs, "b": "¡qué bien!"}, as_="ana")
    await api.ok(COMMENT, {"c": theirs, "b": "not mine"}, as_="ben")
    await api.ok(REACT, {"c": theirs, "e": "👍"}, as_="ana")
    await api.ok(TAG, {"c": theirs, "v": ["abuela"], "s": "S"}, as_="ana")
    await api.ok(TAG, {"c": note, "v": ["secreto"], "p": True}, as_="ana")
    mine = await capsule(api, "ana", family["id"], ["ben"], days=30)
    opened = await capsule(api, "ben", family["id"], ["ana"], hours=1)
    await upload(api, "ben", family["id"], "TEXT", b"sorpresa", "text/plain", "sorpresa", opened)
    closed = await capsule(api, "ben", family["id"], ["ana"], days=30)
    await settle(api)
    api.clock.advance(hours=2)
    assert (await api.services.scheduler.run_once()).unlocked == 1

    phone = PushService(origin=PUSH_ORIGIN).browser("phone")
    registered = {"i": phone.input("Ana's phone")}
    await api.ok(
        "mutation($i: RegisterPushDeviceInput!) { registerPushDevice(input: $i) { id } }",
        registered,
        as_="ana",
    )

    asked = (await api.ok(REQUEST, as_="ana"))["requestDataExport"]
    assert asked["status"] == "PENDING" and asked["downloadUrl"] is None and asked["expiresAt"] is None
    start = api.clock.moment
    await api.services.exports.queue.join()  # the build, in the background
    end = api.clock.moment
    ready = (await api.ok(READ, {"id": asked["id"]}, as_="ana"))["dataExport"]
    assert ready["status"] == "READY" and ready["downloadUrl"]
    assert start + timedelta(days=7) <= when(ready["expiresAt"]) <= end + timedelta(days=7)

    zipped = zipfile.ZipFile(io.BytesIO(await fetch(api, ready["downloadUrl"])))
    assert sorted(zipped.namelist()) == sorted(
        ["mifamilias.json", f"media/{note}/original.txt", f"media/{picture}/original.png"]
    )
    assert zipped.read(f"media/{note}/original.txt") == "hola, abuela 👋".encode()
    assert zipped.read(f"media/{picture}/original.png") == photo
    document: dict[str, Any] = json.loads(zipped.read("mifamilias.json"))
    assert document["format"] == "mifamilias-export/1"
    assert document["user"]["id"] == "ana" and document["user"]["email"] == "ana@example.org"
    assert [(m["familyId"], m["familyName"], m["role"]) for m in document["memberships"]] == [
        (family["id"], "Los García", "MEMBER")
    ]
    contents = {c["id"]: c for c in document["content"]}
    assert set(contents) == {note, picture}
    assert contents[note]["title"] == "nota" and contents[note]["file"] == f"media/{note}/original.txt"
    assert contents[picture]["type"] == "PHOTO" and contents[picture]["status"] == "READY"
    assert [(c["contentId"], c["body"]) for c in document["comments"]] == [(theirs, "¡qué bien!")]
    assert [(r["contentId"], r["emoji"]) for r in document["reactions"]] == [(theirs, "👍")]
    assert all(r["createdAt"] for r in document["reactions"])
    assert sorted((t["value"], t["private"]) for t in document["tags"]) == [
        ("abuela", False),
        ("secreto", True),
    ]
    assert [c["id"] for c in document["capsulesCreated"]] == [mine]
    assert [c["id"] for c in document["capsulesReceived"]] == [opened]  # not `closed`: still sealed
    assert closed not in json.dumps(document)
    assert {"NEW_CONTENT", "CAPSULE_UNLOCKED"} <= {n["type"] for n in document["notifications"]}
    # The devices pushed to, by name and push service: not the endpoint or keys.
    (device,) = document["pushDevices"]
    assert (device["platform"], device["name"]) == ("WEB", "Ana's phone")
    assert device["pushService"] == urlsplit(PUSH_ORIGIN).hostname
    assert phone.endpoint not in json.dumps(document) and phone.p256dh not in json.dumps(document)

    # The owner's alone: anyone else is told it does not exist.
    code, _ = await api.error(READ, {"id": asked["id"]}, as_="ben")
    assert code == "NOT_FOUND"

    # Expired: gone at once for readers, then the sweep deletes the file and the record.
    record = await api.table.get(keys.data_export("ana", asked["id"]))
    assert record is not None
    blobs = api.services.blobs
    assert await blobs.head(record["blobKey"]) is not None
    api.clock.advance(days=7, minutes=1)
    code, _ = await api.error(READ, {"id": asked["id"]}, as_="ana")
    assert code == "NOT_FOUND"
    assert await api.services.exports.sweep() == 1
    assert await blobs.head(record["blobKey"]) is None
    assert await api.table.get(keys.data_export("ana", asked["id"])) is None


async def test_three_exports_a_day(api: Api) -> None:
    await api.sign_in("ana")
    for _ in range(3):
        await api.ok(REQUEST, as_="ana")
    code, _ = await api.error(REQUEST, as_="ana")
    assert code == "RATE_LIMITED"
    await api.services.exports.queue.join()
    api.clock.advance(days=1)
    await api.ok(REQUEST, as_="ana")


async def test_an_ex_members_export_holds_no_capsule_of_the_family_they_left(api: Api) -> None:
    """The export holds what the person may read now: a capsule that opened
    after they left (title, creator, date) is not theirs to read any more."""
    await api.sign_in("ana", "ben")
    family = await make_family(api, "ana", "Los García")
    await join(api, "ben", family["inviteCode"])
    sealed = await capsule(api, "ana", family["id"], ["ben"], hours=1)
    await upload(api, "ana", family["id"], "TEXT", b"sorpresa", "text/plain", "sorpresa", sealed)
    await settle(api)
    await api.ok("mutation($f: ID!) { leaveFamily(familyId: $f) }", {"f": family["id"]}, as_="ben")
    api.clock.advance(hours=2)
    assert (await api.services.scheduler.run_once()).unlocked == 1
    asked = (await api.ok(REQUEST, as_="ben"))["requestDataExport"]
    await api.services.exports.queue.join()
    ready = (await api.ok(READ, {"id": asked["id"]}, as_="ben"))["dataExport"]
    zipped = zipfile.ZipFile(io.BytesIO(await fetch(api, ready["downloadUrl"])))
    document = json.loads(zipped.read("mifamilias.json"))
    assert document["capsulesReceived"] == [] and document["memberships"] == []
    assert "de ana" not in zipped.read("mifamilias.json").decode()


async def test_fifty_concurrent_requests_get_exactly_three(api: Api) -> None:
    """The limit is counted in each request's own write, under the condition
    that the day still has room: a burst cannot pass the check together."""
    await api.sign_in("ana")
    answers = await asyncio.gather(*(api.post(REQUEST, as_="ana") for _ in range(50)))
    accepted = [a for a in answers if not a.get("errors")]
    refused = [a["errors"][0]["extensions"] for a in answers if a.get("errors")]
    assert len(accepted) == 3
    assert len(refused) == 47 and all(e["code"] == "RATE_LIMITED" and e["retryAfter"] > 0 for e in refused)
    await api.services.exports.queue.join()
    stored = await api.table.query(keys.user_pk("ana"), SortKey.begins_with("EXPORT#"))
    assert len(stored.items) == 3


async def test_one_build_per_export_at_a_time(api: Api) -> None:
    await api.sign_in("ana")
    services = api.services
    await services.exports.stop()  # this test drives the builds itself
    export_id = (await api.ok(REQUEST, as_="ana"))["requestDataExport"]["id"]
    other = ExportBuilder(table=api.table, blobs=services.blobs, settings=services.settings, clock=api.clock)
    lease = timedelta(seconds=services.settings.pipeline_lease_seconds)
    someone_else = Lease("someone-else", lease)
    export_key = keys.data_export("ana", export_id)
    held = await someone_else.claim(api.table, export_key, api.clock(), when=exports.BUILDING)
    assert held is not None
    assert await other.build("ana", export_id) is False  # held: not built twice
    assert await other.recover() == 0
    api.clock.advance(seconds=lease.total_seconds() + 1)
    # The holder died: its lease runs out, recovery finds the export and another process builds it.
    assert await other.recover() == 1
    assert await other.build("ana", export_id) is True
    found = (await api.ok(READ, {"id": export_id}, as_="ana"))["dataExport"]
    assert found["status"] == "READY"
    # The first holder, come back late, cannot finish it any more.
    assert await someone_else.claim(api.table, export_key, api.clock(), when=exports.BUILDING) is None
    assert await someone_else.renew(api.table, export_key, api.clock()) is False
