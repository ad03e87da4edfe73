"""Content end to end: real bytes through the returned URL, the real pipeline,
the feed, reactions, comments, paging, deletion; and every refusal."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.adapters.media import probe
from store import keys
from tests import media_factory
from tests.api.conftest import Api, running_api
from tests.factories import (
    COMPLETE,
    family_with_members,
    put_bytes,
    settle,
    start_upload,
    upload,
)
from tests.servers import until

CONTENT = """query($id: ID!) { content(id: $id) {
  id type status title mediaUrl thumbnailUrl transcription failureReason commentCount
  author { id } family { id } reactions { emoji count } viewerReactions } }"""
FEED = """query($id: ID!, $first: Int, $after: String) { family(id: $id) { feed(first: $first, after: $after) {
  edges { cursor node { id title status author { givenName } commentCount reactions { emoji count } viewerReactions } }
  pageInfo { hasNextPage endCursor } } } }"""
REACT = "mutation($id: ID!, $e: String!) { addReaction(contentId: $id, emoji: $e) { reactions { emoji count } viewerReactions } }"
UNREACT = "mutation($id: ID!, $e: String!) { removeReaction(contentId: $id, emoji: $e) { reactions { emoji count } viewerReactions } }"
COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id body author { id } } }"
UNCOMMENT = "mutation($id: ID!, $c: ID!) { deleteComment(contentId: $id, commentId: $c) }"
COMMENTS = """query($id: ID!, $after: String) { content(id: $id) { commentCount
  comments(first: 2, after: $after) { edges { node { id body } } pageInfo { hasNextPage endCursor } } } }"""
DELETE = "mutation($id: ID!) { deleteContent(contentId: $id) }"


async def fetch(api: Api, url: str) -> bytes:
    if url.startswith("http://127.0.0.1:8000/"):
        response = await api.client.get(url.removeprefix("http://127.0.0.1:8000"))
    else:
        async with httpx.AsyncClient() as client:
            response = await client.get(url)
    assert response.status_code == 200, response.text
    return response.content


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("media")
    return {
        "video": media_factory.make_video_with_tone(folder),
        "silent": media_factory.make_silent_video(folder),
        "audio": media_factory.make_audio_clip(folder),
        "photo": media_factory.make_png(folder),
    }


async def test_each_type_walks_to_ready_with_real_outputs(
    media_api: Api, media: dict[str, Path], tmp_path: Path
) -> None:
    api = media_api
    family_id = await family_with_members(api, "ana", ["ben"])
    cases = [
        ("VIDEO", media["video"], "video/mp4", True, True),
        ("VIDEO", media["silent"], "video/mp4", True, False),
        ("AUDIO", media["audio"], "audio/wav", False, True),
        ("PHOTO", media["photo"], "image/png", True, False),
        ("TEXT", None, "text/plain", False, False),
    ]
    for kind, path, mime, has_thumb, has_audio in cases:
        body = path.read_bytes() if path else "Querida familia: ¡hola! 👋".encode()
        content_id = await upload(api, "ana", family_id, kind, body, mime, title=f"a {kind.lower()}")
        await settle(api)
        content = (await api.ok(CONTENT, {"id": content_id}, as_="ben"))["content"]
        assert content["status"] == "READY", content
        assert content["transcription"] is None  # a tone: no speech
        assert (content["thumbnailUrl"] is not None) == has_thumb
        data = await fetch(api, content["mediaUrl"])
        if kind == "TEXT":
            assert data == body
            continue
        out = tmp_path / f"{content_id}.out"
        out.write_bytes(data)
        if kind == "PHOTO":
            from PIL import Image

            with Image.open(out) as image:
                assert image.format == "JPEG" and image.size == (800, 600)
        else:
            probed = await probe(out)
            assert probed.has_audio == has_audio
            assert probed.audio_codec == ("aac" if has_audio else None)
            if kind == "VIDEO":
                assert probed.video_codec == "h264"
        if has_thumb:
            thumb = tmp_path / f"{content_id}.jpg"
            thumb.write_bytes(await fetch(api, content["thumbnailUrl"]))
            from PIL import Image

            with Image.open(thumb) as image:
                assert image.format == "JPEG" and image.size == (320, 240)


PHOTO = "query($id: ID!) { content(id: $id) { status failureReason capturedAt mediaUrl thumbnailUrl } }"
FEED_CAPTURED = "query($id: ID!) { family(id: $id) { feed(first: 5) { edges { node { id capturedAt } } } } }"


def _is_red(pixel: Any) -> bool:
    r, g, b = pixel[:3]
    return bool(r > 180 and g < 90 and b < 90)


def _has_gps(image: Any) -> bool:
    exif = image.getexif()
    return 0x8825 in exif or bool(exif.get_ifd(0x8825))


@pytest.mark.parametrize("keep", [False, True], ids=["stripped", "kept"])
@pytest.mark.parametrize(
    ("engine", "blobs"), [("sqlite", "local"), ("dynamodb", "s3")], ids=["sqlite-files", "dynamodb-s3"]
)
async def test_iphone_photos_are_upright_dated_and_without_location(
    request: pytest.FixtureRequest, tmp_path: Path, engine: str, blobs: str, keep: bool
) -> None:
    """A HEIC and a JPEG with a GPS block, orientation 6 and a capture time: READY, their
    derivatives upright and without EXIF, the stored original without GPS (but nothing
    else lost) unless MIFAMILIAS_KEEP_ORIGINAL_METADATA is on, capturedAt from EXIF."""
    import pillow_heif
    from PIL import Image

    pillow_heif.register_heif_opener()
    sources = [
        (media_factory.make_photo_with_location(tmp_path, "HEIF"), "image/heic"),
        (media_factory.make_photo_with_location(tmp_path, "JPEG"), "image/jpeg"),
    ]
    async with running_api(engine, blobs, tmp_path, request, keep_original_metadata=keep) as api:
        family_id = await family_with_members(api, "ana", ["ben"])
        for path, mime in sources:
            body = path.read_bytes()
            with Image.open(path) as source:
                assert _has_gps(source)  # the upload really carries a location
                source_format = source.format
                source_pixels = source.convert("RGB").tobytes()
            content_id = await upload(api, "ana", family_id, "PHOTO", body, mime)
            await settle(api)
            content = (await api.ok(PHOTO, {"id": content_id}, as_="ben"))["content"]
            assert content["status"] == "READY", content
            assert content["capturedAt"] == "2024-05-17T14:03:22+02:00"

            for url, size in ((content["mediaUrl"], (300, 400)), (content["thumbnailUrl"], (240, 320))):
                derived = tmp_path / f"{content_id}-{size[0]}.jpg"
                derived.write_bytes(await fetch(api, url))
                with Image.open(derived) as image:
                    assert image.format == "JPEG" and image.size == size  # portrait: turned upright
                    assert "exif" not in image.info and not image.getexif() and not _has_gps(image)
                    w, h = image.size
                    rgb = image.convert("RGB")
                    # The marker stored top-left is top-right once turned 90° clockwise.
                    assert _is_red(rgb.getpixel((w - 6, 6))), rgb.getpixel((w - 6, 6))
                    assert not _is_red(rgb.getpixel((5, 5))) and not _is_red(rgb.getpixel((w - 6, h - 6)))

            stored = tmp_path / f"{content_id}.original"
            await api.services.blobs.fetch_to_file(f"content/{content_id}/original", stored)
            if keep:
                assert stored.read_bytes() == body
                continue
            with Image.open(stored) as original:
                assert original.format == source_format
                assert not _has_gps(original)
                exif = original.getexif()
                assert exif[0x0110] == "iPhone 15"  # only the location goes
                assert exif.get_ifd(0x8769)[0x9003] == media_factory.TAKEN
                assert original.convert("RGB").tobytes() == source_pixels  # not encoded again
            assert len(stored.read_bytes()) == len(body)

        feed = (await api.ok(FEED_CAPTURED, {"id": family_id}, as_="ben"))["family"]["feed"]["edges"]
        assert [edge["node"]["capturedAt"] for edge in feed] == ["2024-05-17T14:03:22+02:00"] * 2


@pytest.mark.parametrize(
    ("kind", "walk"),
    [
        ("PHOTO", ["PROCESSING", "TRANSCODING", "READY"]),
        ("TEXT", ["PROCESSING", "READY"]),
        ("AUDIO", ["PROCESSING", "TRANSCODING", "TRANSCRIBING", "READY"]),
    ],
)
async def test_each_kind_passes_only_through_states_that_do_work_for_it(
    api: Api, media: dict[str, Path], kind: str, walk: list[str]
) -> None:
    from resolvers.adapters.broker import content_channel

    family_id = await family_with_members(api, "ana", [])
    body, mime = {
        "PHOTO": (media["photo"].read_bytes(), "image/png"),
        "TEXT": (b"hola", "text/plain"),
        "AUDIO": (media["audio"].read_bytes(), "audio/wav"),
    }[kind]
    started = await start_upload(api, "ana", family_id, kind, mime, len(body), None, None)
    content_id = str(started["content"]["id"])
    assert await put_bytes(api, started["uploadUrl"], body, mime) == 200
    async with api.services.broker.subscribe(content_channel(content_id)) as events:
        await api.ok(COMPLETE, {"id": content_id}, as_="ana")
        await settle(api)
        seen: list[str] = []
        async with asyncio.timeout(30):
            async for event in events:
                seen.append(event["status"])
                if event["status"] in ("READY", "FAILED"):
                    break
    assert seen == walk


async def test_a_late_announcement_of_a_move_still_comes_before_the_next(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request that hands a note to the pipeline announces PROCESSING, and
    the pipeline announces READY. However late the first leaves (a loaded
    process, a new connection to Redis), the channel hears them in that order:
    a stream that heard READY first could only report the status as it is now,
    and would skip PROCESSING."""
    from resolvers.adapters.broker import content_channel

    family_id = await family_with_members(api, "ana", [])
    started = await start_upload(api, "ana", family_id, "TEXT", "text/plain", 4)
    content_id = str(started["content"]["id"])
    assert await put_bytes(api, started["uploadUrl"], b"hola", "text/plain") == 200
    broker = api.services.broker
    publish_many = broker.publish_many
    released = asyncio.Event()

    async def processing_held(events: Any) -> None:
        if any(event.get("status") == "PROCESSING" for _, event in events):
            await released.wait()
        await publish_many(events)

    async def ready_in_the_table() -> bool:
        item = await api.table.get(keys.content(content_id))
        return item is not None and item["status"] == "READY"

    monkeypatch.setattr(broker, "publish_many", processing_held)
    async with broker.subscribe(content_channel(content_id)) as events:
        completing = asyncio.create_task(api.ok(COMPLETE, {"id": content_id}, as_="ana"))
        # The pipeline has walked the note to READY while PROCESSING is still unsent.
        await until(ready_in_the_table, "the note READY in the table", interval=0.01)
        released.set()
        assert (await completing)["completeUpload"]["status"] == "PROCESSING"
        await settle(api)
        seen: list[str] = []
        async with asyncio.timeout(30):
            async for event in events:
                seen.append(event["status"])
                if event["status"] == "READY":
                    break
    assert seen == ["PROCESSING", "READY"]


async def test_a_file_that_is_not_what_it_claims_fails_and_can_be_retried(
    api: Api, media: dict[str, Path]
) -> None:
    family_id = await family_with_members(api, "ana", [])
    content_id = await upload(api, "ana", family_id, "VIDEO", media["audio"].read_bytes(), "video/mp4")
    await settle(api)
    content = (await api.ok(CONTENT, {"id": content_id}, as_="ana"))["content"]
    assert content["status"] == "FAILED"
    assert "not a video" in content["failureReason"]
    assert content["mediaUrl"] is None
    retried = await api.ok(
        "mutation($id: ID!) { retryContent(contentId: $id) { status } }", {"id": content_id}, as_="ana"
    )
    assert retried["retryContent"]["status"] == "PROCESSING"
    await settle(api)
    assert (await api.ok(CONTENT, {"id": content_id}, as_="ana"))["content"]["status"] == "FAILED"


async def test_upload_refusals_write_nothing(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    await api.sign_in("zoe")
    before = await api.snapshot()
    create = """mutation($input: CreateUploadInput!) { createUpload(input: $input) { uploadUrl } }"""
    base = {"familyId": family_id, "type": "VIDEO", "mimeType": "video/mp4", "sizeBytes": 10}
    changes: list[tuple[dict[str, Any], str]] = [
        ({"mimeType": "image/png"}, "BAD_USER_INPUT"),
        ({"sizeBytes": 0}, "BAD_USER_INPUT"),
        ({"sizeBytes": 10**12}, "BAD_USER_INPUT"),
        ({"type": "HOLOGRAM"}, "BAD_USER_INPUT"),
        ({"title": "x" * 201}, "BAD_USER_INPUT"),
        ({"familyId": "nope"}, "NOT_FOUND"),
    ]
    for change, code in changes:
        assert (await api.error(create, {"input": {**base, **change}}, as_="ana"))[0] == code, change
    assert (await api.error(create, {"input": base}, as_="zoe"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before


async def test_complete_upload_checks_the_bytes_and_runs_once(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben"])
    started = await start_upload(api, "ana", family_id, "TEXT", "text/plain", 5)
    content_id = started["content"]["id"]
    before = await api.snapshot()
    code, message = await api.error(COMPLETE, {"id": content_id}, as_="ana")
    assert code == "BAD_USER_INPUT" and "not arrived" in message
    assert (await api.error(COMPLETE, {"id": content_id}, as_="ben"))[0] == "FORBIDDEN"
    assert await api.snapshot() == before
    # A body of the wrong size is refused at once, and the URL then takes the right one.
    assert await put_bytes(api, started["uploadUrl"], b"hey", "text/plain") == 400
    code, message = await api.error(COMPLETE, {"id": content_id}, as_="ana")
    assert code == "BAD_USER_INPUT" and "not arrived" in message
    assert await put_bytes(api, started["uploadUrl"], b"hello", "text/plain") == 200
    # The URL is single-use once a body is stored.
    assert await put_bytes(api, started["uploadUrl"], b"hello", "text/plain") == 403
    await api.ok(COMPLETE, {"id": started["content"]["id"]}, as_="ana")
    await settle(api)
    before = await api.snapshot()
    assert (await api.error(COMPLETE, {"id": started["content"]["id"]}, as_="ana"))[0] == "CONFLICT"
    restore = "mutation($id: ID!) { restoreContent(contentId: $id) { status } }"
    assert (await api.error(restore, {"id": started["content"]["id"]}, as_="ana"))[0] == "CONFLICT"
    assert await api.snapshot() == before


async def test_forged_and_expired_upload_urls_are_refused(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    started = await start_upload(api, "ana", family_id, "TEXT", "text/plain", 5)
    url = started["uploadUrl"]
    forged = url.replace("sig=", "sig=0")
    assert await put_bytes(api, forged, b"hello", "text/plain") == 403
    other_key = url.replace(started["content"]["id"], "f" * 32)
    assert await put_bytes(api, other_key, b"hello", "text/plain") == 403
    expired = (
        url.split("expires=")[0]
        + "expires=1"
        + url.split("expires=")[1][url.split("expires=")[1].index("&") :]
    )
    assert await put_bytes(api, expired, b"hello", "text/plain") == 403
    assert (await api.error(COMPLETE, {"id": started["content"]["id"]}, as_="ana"))[0] == "BAD_USER_INPUT"


async def test_feed_reactions_comments_paging_and_delete(api: Api) -> None:
    family_id = await family_with_members(api, "ana", ["ben", "cy"])
    ids = []
    for n in range(5):
        ids.append(
            await upload(
                api,
                "ana" if n % 2 else "ben",
                family_id,
                "TEXT",
                f"note {n}".encode(),
                "text/plain",
                title=f"note {n}",
            )
        )
    await settle(api)
    # Newest first, in pages, every content once.
    seen, after = [], None
    while True:
        page = (await api.ok(FEED, {"id": family_id, "first": 2, "after": after}, as_="cy"))["family"]["feed"]
        seen += [edge["node"]["title"] for edge in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == [f"note {n}" for n in reversed(range(5))]

    target = ids[0]
    assert (await api.ok(REACT, {"id": target, "e": "❤️"}, as_="cy"))["addReaction"] == {
        "reactions": [{"emoji": "❤️", "count": 1}],
        "viewerReactions": ["❤️"],
    }
    again = await api.ok(REACT, {"id": target, "e": "❤️"}, as_="cy")
    assert again["addReaction"]["reactions"] == [{"emoji": "❤️", "count": 1}]  # idempotent
    await api.ok(REACT, {"id": target, "e": "👍🏽"}, as_="ana")
    await api.ok(REACT, {"id": target, "e": "❤️"}, as_="ana")
    first = (await api.ok(FEED, {"id": family_id, "first": 5}, as_="cy"))["family"]["feed"]["edges"][-1][
        "node"
    ]
    assert first["reactions"] == [{"emoji": "❤️", "count": 2}, {"emoji": "👍🏽", "count": 1}]
    assert first["viewerReactions"] == ["❤️"]
    removed = await api.ok(UNREACT, {"id": target, "e": "❤️"}, as_="cy")
    assert removed["removeReaction"] == {
        "reactions": [{"emoji": "❤️", "count": 1}, {"emoji": "👍🏽", "count": 1}],
        "viewerReactions": [],
    }
    before = await api.snapshot()
    # Arrows, shapes and the diameter sign are symbols, not emoji; two thumbs
    # joined by a ZWJ are no sequence Unicode defines.
    for bad in ("", "a", "❤️❤️", "hello", "👍 👍", "→", "■", "⌀", "👍\u200d👍"):
        assert (await api.error(REACT, {"id": target, "e": bad}, as_="cy"))[0] == "BAD_USER_INPUT", bad
    assert await api.snapshot() == before
    for flag in ("🇪🇸", "👨‍👩‍👧", "1️⃣"):
        await api.ok(REACT, {"id": target, "e": flag}, as_="cy")

    comments = []
    for n in range(3):
        comments.append(
            (await api.ok(COMMENT, {"id": target, "b": f"¡qué bien {n}!"}, as_="cy"))["addComment"]
        )
    page = (await api.ok(COMMENTS, {"id": target}, as_="ana"))["content"]
    assert page["commentCount"] == 3
    assert [e["node"]["body"] for e in page["comments"]["edges"]] == ["¡qué bien 0!", "¡qué bien 1!"]
    rest = (
        await api.ok(COMMENTS, {"id": target, "after": page["comments"]["pageInfo"]["endCursor"]}, as_="ana")
    )["content"]["comments"]
    assert [e["node"]["body"] for e in rest["edges"]] == ["¡qué bien 2!"]
    assert rest["pageInfo"]["hasNextPage"] is False
    notes = await api.ok("{ notifications { edges { node { type content { id } } } } }", as_="ben")
    assert [e["node"]["type"] for e in notes["notifications"]["edges"]].count("NEW_COMMENT") == 3
    before = await api.snapshot()
    assert (await api.error(COMMENT, {"id": target, "b": "x" * 2001}, as_="cy"))[0] == "BAD_USER_INPUT"
    assert (await api.error(COMMENT, {"id": target, "b": "  "}, as_="cy"))[0] == "BAD_USER_INPUT"
    assert (await api.error(UNCOMMENT, {"id": target, "c": comments[0]["id"]}, as_="ben"))[0] == "FORBIDDEN"
    assert (await api.error(UNCOMMENT, {"id": target, "c": "nope"}, as_="cy"))[0] == "NOT_FOUND"
    assert await api.snapshot() == before
    assert (await api.ok(UNCOMMENT, {"id": target, "c": comments[0]["id"]}, as_="cy"))[
        "deleteComment"
    ] is True
    assert (await api.ok(UNCOMMENT, {"id": target, "c": comments[1]["id"]}, as_="ana"))[
        "deleteComment"
    ] is True
    assert (await api.ok(COMMENTS, {"id": target}, as_="ana"))["content"]["commentCount"] == 1

    # ben wrote ids[0]; cy may not delete it, the ADMIN may.
    assert (await api.error(DELETE, {"id": target}, as_="cy"))[0] == "FORBIDDEN"
    blobs = api.services.blobs
    assert await blobs.head(f"content/{target}/original") is not None
    assert (await api.ok(DELETE, {"id": target}, as_="ana"))["deleteContent"] is True
    assert await blobs.head(f"content/{target}/original") is None
    assert (await api.error(CONTENT, {"id": target}, as_="ana"))[0] == "NOT_FOUND"
    left = [key for key in await api.snapshot() if key[0] == f"CONTENT#{target}"]
    assert left == []
    feed = (await api.ok(FEED, {"id": family_id, "first": 10}, as_="cy"))["family"]["feed"]["edges"]
    assert target not in [edge["node"]["id"] for edge in feed]


async def test_outsiders_get_not_found_and_pending_members_are_told_they_wait(api: Api) -> None:
    from tests.factories import join, make_family

    family = await make_family(api, "ana", trust="CLOSED")
    await join(api, "pat", family["inviteCode"])
    content_id = await upload(api, "ana", family["id"], "TEXT", b"hola", "text/plain")
    await settle(api)
    await api.sign_in("zoe")
    for who, code in (("zoe", "NOT_FOUND"), ("pat", "FORBIDDEN")):
        for document, variables in (
            (CONTENT, {"id": content_id}),
            (FEED, {"id": family["id"]}),
            (REACT, {"id": content_id, "e": "👍"}),
            (COMMENT, {"id": content_id, "b": "hi"}),
        ):
            before = await api.snapshot()
            found, message = await api.error(document, variables, as_=who)
            assert found == code
            if who == "pat":
                assert message == "your membership is waiting for approval"
            assert await api.snapshot() == before
    # The family itself stays readable to the person who waits.
    waiting = await api.ok(
        "query($id: ID!) { family(id: $id) { name members { edges { node { role } } } } }",
        {"id": family["id"]},
        as_="pat",
    )
    assert waiting["family"]["members"]["edges"] == [{"node": {"role": "PENDING"}}]


async def test_tampered_feed_cursor_is_bad_input(api: Api) -> None:
    family_id = await family_with_members(api, "ana", [])
    for n in range(3):
        await upload(api, "ana", family_id, "TEXT", b"x", "text/plain", title=str(n))
    page = (await api.ok(FEED, {"id": family_id, "first": 1}, as_="ana"))["family"]["feed"]
    cursor = page["pageInfo"]["endCursor"]
    tampered = cursor[:5] + ("A" if cursor[5] != "A" else "B") + cursor[6:]
    assert (await api.error(FEED, {"id": family_id, "first": 1, "after": tampered}, as_="ana"))[
        0
    ] == "BAD_USER_INPUT"
    # A cursor of another list is refused too.
    other = await family_with_members(api, "ana", [], name="Otra")
    assert (await api.error(FEED, {"id": other, "first": 1, "after": cursor}, as_="ana"))[
        0
    ] == "BAD_USER_INPUT"


async def test_viewing_archiving_and_restoring(media_api: Api) -> None:
    api = media_api
    family_id = await family_with_members(api, "ana", ["ben"])
    content_id = await upload(api, "ana", family_id, "TEXT", b"hola", "text/plain")
    await settle(api)
    view = "mutation($id: ID!) { markContentViewed(contentId: $id) { status } }"
    assert (await api.ok(view, {"id": content_id}, as_="ana"))["markContentViewed"]["status"] == "READY"
    assert (await api.ok(view, {"id": content_id}, as_="ben"))["markContentViewed"]["status"] == "DELIVERED"
    pipeline = api.services.pipeline
    assert await pipeline.archive_due(90) == 0
    api.clock.advance(days=91)
    assert await pipeline.archive_due(90) == 1
    content = (await api.ok(CONTENT, {"id": content_id}, as_="ben"))["content"]
    assert content["status"] == "ARCHIVED" and content["mediaUrl"] is None
    blobs = api.services.blobs
    assert await blobs.storage_class(f"content/{content_id}/original") == "GLACIER_IR"
    restore = "mutation($id: ID!) { restoreContent(contentId: $id) { status mediaUrl } }"
    restored = (await api.ok(restore, {"id": content_id}, as_="ben"))["restoreContent"]
    assert restored["status"] == "READY" and restored["mediaUrl"]
    assert await blobs.storage_class(f"content/{content_id}/original") == "STANDARD"


async def test_content_left_mid_pipeline_is_picked_up_again(api: Api) -> None:
    """As after a crash: the bytes are in, the content is PROCESSING, and no
    worker has it queued. The recovery pass the worker runs at start-up finds it."""
    from store import keys
    from store.items import Content as ContentItem

    family_id = await family_with_members(api, "ana", [])
    started = await start_upload(api, "ana", family_id, "TEXT", "text/plain", 4)
    content_id = started["content"]["id"]
    assert await put_bytes(api, started["uploadUrl"], b"hola", "text/plain") == 200
    item = await api.table.get(keys.content(content_id))
    assert item is not None
    await api.table.update(ContentItem.from_item(item).transition("PROCESSING", api.services.now_iso()))
    await settle(api)
    assert (await api.ok(CONTENT, {"id": content_id}, as_="ana"))["content"]["status"] == "PROCESSING"
    assert await api.services.pipeline.recover() == 1
    await settle(api)
    assert (await api.ok(CONTENT, {"id": content_id}, as_="ana"))["content"]["status"] == "READY"


async def test_one_persons_many_uploads_delay_another_familys_by_one_job_at_most(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ben's eight uploads are queued before Cy's one, with two pipeline
    workers: Ben's hold one worker at a time, so Cy's is processed first or
    second, not ninth."""
    assert api.services.settings.pipeline_workers == 2
    busy = await family_with_members(api, "ben", [])
    other = await family_with_members(api, "cy", [], name="Los Ruiz")
    pipeline = api.services.pipeline
    submitted: list[tuple[str, str | None]] = []
    # Held back while everything is uploaded, then queued at once, in upload order.
    with monkeypatch.context() as patch:
        patch.setattr(
            pipeline, "submit", lambda content_id, author_id=None: submitted.append((content_id, author_id))
        )
        bens = [await upload(api, "ben", busy, "TEXT", f"nota {n}".encode(), "text/plain") for n in range(8)]
        cys = await upload(api, "cy", other, "TEXT", b"hola", "text/plain")
    assert [content_id for content_id, _ in submitted] == [*bens, cys]
    # The order the workers take them in (how long each then takes is the
    # machine's: a loaded one may finish a quick job after a later one).
    started: list[str] = []
    process = pipeline._process

    async def recorded(claimed: Any) -> None:
        started.append(claimed["id"])
        await process(claimed)

    monkeypatch.setattr(pipeline, "_process", recorded)
    for content_id, author_id in submitted:
        pipeline.submit(content_id, author_id)
    await settle(api)
    for content_id in [*bens, cys]:
        item = await api.table.get(keys.content(content_id))
        assert item is not None and item["status"] == "READY"
    assert sorted(started) == sorted([*bens, cys])
    assert started.index(cys) <= 1, started
