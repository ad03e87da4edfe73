"""Uploads in parts: above MIFAMILIAS_MULTIPART_THRESHOLD_BYTES the
bytes go in parts, a dropped connection costs only the part it cut, and the
client resumes with `resumeUpload`; on moto's S3 and on the local store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resolvers.adapters.media import probe
from store import keys
from tests import media_factory
from tests.api.conftest import Api
from tests.api.test_content import CONTENT, fetch
from tests.factories import COMPLETE, family_with_members, put_bytes, put_then_drop, settle

MIB = 1024 * 1024
PART = 8 * MIB  # the default part size
UPLOAD_FIELDS = "uploadUrl expiresAt partSizeBytes parts { number url sizeBytes } receivedParts"
CREATE = (
    "mutation($i: CreateUploadInput!) { createUpload(input: $i) { "
    + UPLOAD_FIELDS
    + " content { id status } } }"
)
RESUME = "mutation($id: ID!) { resumeUpload(contentId: $id) { " + UPLOAD_FIELDS + " content { id status } } }"


@pytest.fixture(scope="module")
def large_video(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return media_factory.make_large_video(tmp_path_factory.mktemp("large")).read_bytes()


async def create(api: Api, user: str, family_id: str, kind: str, mime: str, size: int) -> dict[str, Any]:
    variables = {"i": {"familyId": family_id, "type": kind, "mimeType": mime, "sizeBytes": size}}
    created: dict[str, Any] = (await api.ok(CREATE, variables, as_=user))["createUpload"]
    return created


async def resume(api: Api, user: str, content_id: str) -> dict[str, Any]:
    resumed: dict[str, Any] = (await api.ok(RESUME, {"id": content_id}, as_=user))["resumeUpload"]
    return resumed


def part_of(body: bytes, number: int) -> bytes:
    return body[(number - 1) * PART : number * PART]


async def test_a_large_video_survives_a_dropped_connection_and_reaches_ready(
    media_api: Api, large_video: bytes, tmp_path: Path
) -> None:
    api = media_api
    body = large_video
    assert 36 * MIB < len(body) < 48 * MIB, len(body)  # about 40 MiB: five or six parts
    count = -(-len(body) // PART)
    family_id = await family_with_members(api, "ana", ["ben"])

    started = await create(api, "ana", family_id, "VIDEO", "video/mp4", len(body))
    content_id = started["content"]["id"]
    assert started["partSizeBytes"] == PART
    assert started["receivedParts"] == []
    assert [p["number"] for p in started["parts"]] == list(range(1, count + 1))
    assert [p["sizeBytes"] for p in started["parts"]] == [len(part_of(body, n)) for n in range(1, count + 1)]
    assert started["uploadUrl"] == started["parts"][0]["url"]
    urls = {p["number"]: p["url"] for p in started["parts"]}

    # Two parts arrive; the connection drops halfway through the third.
    for number in (1, 2):
        assert await put_bytes(api, urls[number], part_of(body, number), "video/mp4") == 200
    assert await put_then_drop(api, urls[3], part_of(body, 3), PART // 2) == 400

    resumed = await resume(api, "ana", content_id)
    assert resumed["content"]["status"] == "UPLOADING"
    assert resumed["receivedParts"] == [1, 2]
    assert [p["number"] for p in resumed["parts"]] == list(range(3, count + 1))
    # Fresh URLs (valid for a new period; S3 signs to the second, so one signed in
    # the same second as the first reads the same): they take the rest.
    fresh = {p["number"]: p["url"] for p in resumed["parts"]}
    for number in range(3, count + 1):
        assert await put_bytes(api, fresh[number], part_of(body, number), "video/mp4") == 200

    done = await api.ok(COMPLETE, {"id": content_id}, as_="ana")
    assert done["completeUpload"]["status"] == "PROCESSING"
    await settle(api)
    content = (await api.ok(CONTENT, {"id": content_id}, as_="ben"))["content"]
    assert content["status"] == "READY", content
    out = tmp_path / "converted.mp4"
    out.write_bytes(await fetch(api, content["mediaUrl"]))
    assert (await probe(out)).video_codec == "h264"
    # The original is the upload, byte for byte.
    original = tmp_path / "original.mp4"
    await api.services.blobs.fetch_to_file(f"content/{content_id}/original", original)
    assert original.read_bytes() == body


async def test_a_missing_part_or_a_wrong_size_is_refused_and_changes_nothing(media_api: Api) -> None:
    api = media_api
    family_id = await family_with_members(api, "ana", [])
    size = 2 * PART + 1  # parts of 8 MiB, 8 MiB and 1 byte
    body = bytes(range(97, 123)) * (size // 26) + b"z" * (size % 26)
    started = await create(api, "ana", family_id, "TEXT", "text/plain", size)
    content_id = started["content"]["id"]
    urls = {p["number"]: p["url"] for p in started["parts"]}
    assert await put_bytes(api, urls[3], part_of(body, 3), "text/plain") == 200

    before = await api.snapshot()
    code, message = await api.error(COMPLETE, {"id": content_id}, as_="ana")
    assert code == "BAD_USER_INPUT"
    assert message == "part(s) 1-2 of 3 have not arrived; resumeUpload gives fresh URLs for them"
    assert await api.snapshot() == before

    # Parts 1 and 2 arrive short (S3 itself refuses a body shorter than the
    # length its URL signed; moto and the local store take it).
    assert await put_bytes(api, urls[1], b"x", "text/plain") == 200
    assert await put_bytes(api, urls[2], b"y", "text/plain") == 200
    code, message = await api.error(COMPLETE, {"id": content_id}, as_="ana")
    assert code == "BAD_USER_INPUT"
    assert message.startswith(f"the parts hold 3 bytes, but {size} were announced: part 1 has 1 bytes")
    assert "send part(s) 1-2 again" in message
    assert await api.snapshot() == before

    # Nothing was lost: resuming asks for the two short parts again, and then it completes.
    resumed = await resume(api, "ana", content_id)
    assert resumed["receivedParts"] == [3]
    assert [p["number"] for p in resumed["parts"]] == [1, 2]
    for part in resumed["parts"]:
        assert await put_bytes(api, part["url"], part_of(body, part["number"]), "text/plain") == 200
    assert (await api.ok(COMPLETE, {"id": content_id}, as_="ana"))["completeUpload"]["status"] == "PROCESSING"
    await settle(api)
    content = (await api.ok(CONTENT, {"id": content_id}, as_="ana"))["content"]
    assert content["status"] == "READY", content
    assert await api.services.blobs.head(f"content/{content_id}/original") == size


async def test_only_the_author_resumes_and_only_while_uploading(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    await family_with_members(api, "cy", [], name="Otra")
    started = await create(api, "ana", family_id, "VIDEO", "video/mp4", 2 * PART + 5)
    content_id = started["content"]["id"]

    before = await api.snapshot()
    assert (await api.error(RESUME, {"id": content_id}, as_="ben"))[0] == "FORBIDDEN"
    assert (await api.error(RESUME, {"id": content_id}, as_="cy"))[0] == "NOT_FOUND"
    assert (await api.error(RESUME, {"id": content_id}, as_=None))[0] == "UNAUTHENTICATED"
    assert await api.snapshot() == before
    assert (await resume(api, "ana", content_id))["receivedParts"] == []

    # A small upload is one PUT: resuming hands out a fresh URL, and no parts.
    small = await create(api, "ana", family_id, "TEXT", "text/plain", 4)
    assert small["partSizeBytes"] is None and small["parts"] is None and small["receivedParts"] is None
    again = await resume(api, "ana", small["content"]["id"])
    assert again["parts"] is None and again["uploadUrl"]
    assert await put_bytes(api, again["uploadUrl"], b"hola", "text/plain") == 200
    await api.ok(COMPLETE, {"id": small["content"]["id"]}, as_="ana")
    code, message = await api.error(RESUME, {"id": small["content"]["id"]}, as_="ana")
    assert code == "CONFLICT"
    assert message.startswith("the upload is already complete")
    await settle(api)


async def test_an_upload_whose_parts_were_dropped_starts_again(media_api: Api) -> None:
    """S3's lifecycle rule and the local sweep drop an abandoned upload's parts
    (dropped here directly); the content stays UPLOADING and resuming starts over."""
    api = media_api
    family_id = await family_with_members(api, "ana", [])
    size = 2 * PART + 3
    body = b"a" * 2 * PART + b"bcd"
    started = await create(api, "ana", family_id, "TEXT", "text/plain", size)
    content_id = started["content"]["id"]
    urls = {p["number"]: p["url"] for p in started["parts"]}
    assert await put_bytes(api, urls[3], b"bcd", "text/plain") == 200
    item = await api.table.get(keys.content(content_id))
    assert item is not None
    await api.services.blobs.abort_multipart(f"content/{content_id}/original", item["uploadId"])

    code, message = await api.error(COMPLETE, {"id": content_id}, as_="ana")
    assert code == "BAD_USER_INPUT"
    assert "resumeUpload starts it again" in message
    # Local: 404; S3: NoSuchUpload (404), which moto answers with a 500.
    assert await put_bytes(api, urls[1], body[:PART], "text/plain") in (404, 500)

    resumed = await resume(api, "ana", content_id)
    assert resumed["receivedParts"] == []
    assert [p["number"] for p in resumed["parts"]] == [1, 2, 3]
    for part in resumed["parts"]:
        assert await put_bytes(api, part["url"], part_of(body, part["number"]), "text/plain") == 200
    assert (await api.ok(COMPLETE, {"id": content_id}, as_="ana"))["completeUpload"]["status"] == "PROCESSING"
    await settle(api)


async def test_a_dropped_put_leaves_its_url_usable(media_api: Api) -> None:
    """A body that did not land through no fault of the client's (the
    connection dropped) gives its URL back: the same URL takes it after."""
    api = media_api
    family_id = await family_with_members(api, "ana", [])
    note = b"una nota que llega en dos intentos " * 100
    created = await create(api, "ana", family_id, "TEXT", "text/plain", len(note))
    url = created["uploadUrl"]
    assert await put_then_drop(api, url, note, len(note) // 2, "text/plain") == 400
    assert await put_bytes(api, url, note, "text/plain") == 200
    done = await api.ok(COMPLETE, {"id": created["content"]["id"]}, as_="ana")
    assert done["completeUpload"]["status"] == "PROCESSING"
    # Once stored, the URL is spent.
    if url.startswith("http://127.0.0.1:8000/"):  # the local store's URLs are single-use
        assert await put_bytes(api, url, note, "text/plain") == 403
