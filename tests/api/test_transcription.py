"""Transcription end to end, on each engine and blob store: speech made by espeak-ng in
the test, uploaded through the API, transcribed by the default transcriber (faster-whisper
with the pinned multilingual base model), answered as text, language and WebVTT captions.

One test per engine carries the English video, the Spanish WAV and the silent video through
every check, so each engine transcribes each recording once."""

from __future__ import annotations

import asyncio
import io
import json
import re
import unicodedata
import zipfile
from pathlib import Path
from typing import Any

import httpx
import jiwer
import pytest

from resolvers.adapters.broker import content_channel
from resolvers.adapters.whisper import LocalTranscriber
from store import keys
from tests import media_factory as mf
from tests.api.conftest import Api, running_api
from tests.factories import COMPLETE, family_with_members, put_bytes, settle, start_upload, upload

MAX_WER = 0.35
CONTENT = """query($id: ID!) { content(id: $id) {
  status transcription transcriptLanguage captionsUrl transcriptionFailure mediaUrl } }"""
SEARCH = """query($f: ID!, $t: String!, $n: Int) { searchContent(familyId: $f, text: $t, first: $n) {
  edges { cursor node { id title } } pageInfo { hasNextPage endCursor } } }"""
SEARCH_AFTER = """query($f: ID!, $t: String!, $n: Int, $a: String) {
  searchContent(familyId: $f, text: $t, first: $n, after: $a) { edges { node { id } } } }"""
EXPORT = "mutation { requestDataExport { id } }"
EXPORT_READ = "query($id: ID!) { dataExport(id: $id) { status downloadUrl } }"
SCHEDULE = "mutation($id: ID!) { scheduleCapsule(capsuleId: $id) { status } }"
CAPSULE = "mutation($i: CreateCapsuleInput!) { createCapsule(input: $i) { id } }"
RETRY = "mutation($id: ID!) { retryContent(contentId: $id) { status } }"


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("speech")
    english = mf.make_speech_wav(folder, mf.ENGLISH_SPEECH, "en")
    return {
        "video": mf.make_video_with_speech(folder, english),
        "wav": mf.make_speech_wav(folder, mf.SPANISH_SPEECH, "es"),
        "silent": mf.make_silent_video(folder),
    }


def words(text: str) -> str:
    """Lower case, no punctuation: what WER compares."""
    return " ".join(re.sub(r"[^\w\s']", " ", unicodedata.normalize("NFC", text).lower()).split())


def wer(reference: str, heard: str) -> float:
    return float(jiwer.wer(words(reference), words(heard)))


def _seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def parse_webvtt(text: str) -> list[tuple[float, float, str]]:
    """(start, end, text) of each cue of a WebVTT file; fails on anything else."""
    blocks = text.strip().split("\n\n")
    assert blocks[0].strip() == "WEBVTT", text[:40]
    cues = []
    for block in blocks[1:]:
        lines = block.strip().splitlines()
        timing = next(i for i, line in enumerate(lines) if "-->" in line)
        start, end = (part.strip() for part in lines[timing].split("-->"))
        cues.append((_seconds(start), _seconds(end.split()[0]), " ".join(lines[timing + 1 :])))
    return cues


async def fetch(api: Api, url: str) -> httpx.Response:
    if url.startswith("http://127.0.0.1:8000/"):
        response = await api.client.get(url.removeprefix("http://127.0.0.1:8000"))
    else:
        async with httpx.AsyncClient() as client:
            response = await client.get(url)
    assert response.status_code == 200, response.text
    return response


async def walk(
    api: Api, user: str, family_id: str, kind: str, path: Path, mime: str
) -> tuple[str, list[str]]:
    """Uploads `path` and follows its status events to READY: (content id, statuses)."""
    body = await asyncio.to_thread(path.read_bytes)
    started = await start_upload(api, user, family_id, kind, mime, len(body), f"a {kind.lower()}", None)
    content_id = str(started["content"]["id"])
    assert await put_bytes(api, started["uploadUrl"], body, mime) == 200
    seen: list[str] = []
    async with api.services.broker.subscribe(content_channel(content_id)) as events:
        await api.ok(COMPLETE, {"id": content_id}, as_=user)
        await settle(api)
        async with asyncio.timeout(600):
            async for event in events:
                seen.append(event["status"])
                if event["status"] in ("READY", "FAILED"):
                    break
    return content_id, seen


async def test_speech_is_transcribed_in_its_language_with_captions_in_time_order(
    media_api: Api, speech: dict[str, Path]
) -> None:
    api = media_api
    family_id = await family_with_members(api, "ana", ["ben"])
    cases = [
        ("VIDEO", speech["video"], "video/mp4", mf.ENGLISH_SPEECH, "en"),
        ("AUDIO", speech["wav"], "audio/wav", mf.SPANISH_SPEECH, "es"),
    ]
    found: dict[str, str] = {}
    vtts: dict[str, str] = {}
    for kind, path, mime, said, language in cases:
        content_id, seen = await walk(api, "ana", family_id, kind, path, mime)
        assert seen == ["PROCESSING", "TRANSCODING", "TRANSCRIBING", "READY"]
        content = (await api.ok(CONTENT, {"id": content_id}, as_="ben"))["content"]
        assert content["transcriptionFailure"] is None
        assert wer(said, content["transcription"]) <= MAX_WER, content["transcription"]
        assert content["transcriptLanguage"] == language

        captions = await fetch(api, content["captionsUrl"])
        assert captions.headers["content-type"].startswith("text/vtt")
        cues = parse_webvtt(captions.text)
        starts = [start for start, _, _ in cues]
        assert starts == sorted(starts)
        assert all(0 <= start <= end <= 8.0 for start, end, _ in cues)  # the recordings are ~7 s
        assert wer(said, " ".join(text for _, _, text in cues)) <= MAX_WER
        # Two sentences, two cues at least: the last word is heard in the last cue, the
        # first sentence's last word ("morning", "niños") in an earlier one.
        assert len(cues) >= 2
        vtts[content_id] = captions.text
        assert words(said).split()[-1] in words(cues[-1][2]).split()
        first_sentence_end = words(said.split(".")[0]).split()[-1]
        assert any(first_sentence_end in words(text).split() for _, _, text in cues[:-1])

        found[language] = content_id

    silent_id, seen = await walk(api, "ana", family_id, "VIDEO", speech["silent"], "video/mp4")
    assert seen == ["PROCESSING", "TRANSCODING", "READY"]  # the skip edge: no audio stream
    silent = (await api.ok(CONTENT, {"id": silent_id}, as_="ben"))["content"]
    assert silent["transcription"] is None and silent["captionsUrl"] is None
    assert silent["transcriptLanguage"] is None and silent["mediaUrl"] is not None

    # The author's data export holds the transcripts, their languages and the captions.
    asked = (await api.ok(EXPORT, as_="ana"))["requestDataExport"]
    await api.services.exports.queue.join()  # the build, in the background
    ready = (await api.ok(EXPORT_READ, {"id": asked["id"]}, as_="ana"))["dataExport"]
    zipped = zipfile.ZipFile(io.BytesIO((await fetch(api, ready["downloadUrl"])).content))
    entries = {entry["id"]: entry for entry in json.loads(zipped.read("mifamilias.json"))["content"]}
    for language, content_id in found.items():
        entry = entries[content_id]
        assert entry["transcriptLanguage"] == language and entry["transcription"]
        assert entry["captionsFile"] == f"media/{content_id}/captions.vtt"
        assert zipped.read(entry["captionsFile"]).decode() == vtts[content_id]
    assert entries[silent_id]["captionsFile"] is None and entries[silent_id]["transcription"] is None

    await _search_finds_what_was_said(api, family_id, found["en"], found["es"], silent_id)


async def search(api: Api, family_id: str, text: str, as_: str, first: int = 20) -> list[str]:
    answer = await api.ok(SEARCH, {"f": family_id, "t": text, "n": first}, as_=as_)
    return [edge["node"]["id"] for edge in answer["searchContent"]["edges"]]


async def _search_finds_what_was_said(
    api: Api, family_id: str, video_id: str, audio_id: str, silent_id: str
) -> None:
    # A spoken word, a prefix of one, words of both languages; case and accents do not matter.
    assert await search(api, family_id, "football", "ben") == [video_id]
    assert await search(api, family_id, "FOOTB garden", "ben") == [video_id]
    assert await search(api, family_id, "ninos playa", "ben") == [audio_id]
    assert await search(api, family_id, "hermaná", "ben") == [audio_id]
    assert await search(api, family_id, "football hermana", "ben") == []
    # Titles too ("a video", "an audio"): each content once, however many words match.
    assert sorted(await search(api, family_id, "vid", "ben")) == sorted([video_id, silent_id])

    # Sealed capsule content is found by its author alone.
    capsule = await api.ok(
        CAPSULE,
        {
            "i": {
                "familyId": family_id,
                "title": "later",
                "unlockDate": "2099-01-01T00:00:00Z",
                "recipientIds": ["ben"],
            }
        },
        as_="ana",
    )
    capsule_id = capsule["createCapsule"]["id"]
    await api.ok(SCHEDULE, {"id": capsule_id}, as_="ana")
    sealed = await upload(
        api, "ana", family_id, "TEXT", b"para luego", "text/plain", "football secreto", capsule_id
    )
    await settle(api)
    assert sorted(await search(api, family_id, "football", "ana")) == sorted([video_id, sealed])
    assert await search(api, family_id, "football", "ben") == [video_id]
    assert await search(api, family_id, "secreto", "ben") == []

    # Pages: one at a time, each content once.
    first = await api.ok(SEARCH, {"f": family_id, "t": "a", "n": 1}, as_="ben")
    page = first["searchContent"]
    assert page["pageInfo"]["hasNextPage"]
    rest = await api.ok(
        SEARCH_AFTER, {"f": family_id, "t": "a", "n": 20, "a": page["pageInfo"]["endCursor"]}, as_="ben"
    )
    ids = [page["edges"][0]["node"]["id"]] + [e["node"]["id"] for e in rest["searchContent"]["edges"]]
    assert sorted(ids) == sorted([video_id, audio_id, silent_id])

    # Bad input changes nothing and says why.
    refused = await api.post(SEARCH, {"f": family_id, "t": "  ¿? ", "n": 5}, as_="ben")
    assert refused["errors"][0]["extensions"]["code"] == "BAD_USER_INPUT"

    # Deleted with the content: its words go with it.
    await api.ok("mutation($id: ID!) { deleteContent(contentId: $id) }", {"id": video_id}, as_="ana")
    assert await search(api, family_id, "football", "ben") == []
    left = await api.table.query(keys.content_pk(video_id))
    assert left.items == []


@pytest.mark.parametrize("engine", ["sqlite", "dynamodb"])
async def test_a_failed_transcription_leaves_the_content_ready_and_can_be_retried(
    engine: str, speech: dict[str, Path], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    broken = tmp_path / "no-model"
    broken.mkdir()
    async with running_api(engine, "local", tmp_path, request, whisper_model=broken) as api:
        family_id = await family_with_members(api, "ana", ["ben"])
        content_id, seen = await walk(api, "ana", family_id, "AUDIO", speech["wav"], "audio/wav")
        assert seen == ["PROCESSING", "TRANSCODING", "TRANSCRIBING", "READY"]
        content = (await api.ok(CONTENT, {"id": content_id}, as_="ben"))["content"]
        assert content["status"] == "READY" and content["mediaUrl"] is not None
        assert content["transcription"] is None and content["captionsUrl"] is None
        assert "model" in content["transcriptionFailure"], content["transcriptionFailure"]
        # Nobody but the author retries; the author does once the model is there.
        refused = await api.post(RETRY, {"id": content_id}, as_="ben")
        assert refused["errors"][0]["extensions"]["code"] in ("FORBIDDEN", "NOT_FOUND")

        pipeline = api.services.pipeline
        assert isinstance(pipeline.transcriber, LocalTranscriber)
        await pipeline.transcriber.close()
        pipeline.transcriber = LocalTranscriber(api.services.blobs, cache_dir=pipeline.transcriber.cache_dir)
        try:
            assert (await api.ok(RETRY, {"id": content_id}, as_="ana"))["retryContent"][
                "status"
            ] == "TRANSCRIBING"
            await settle(api)
            again = (await api.ok(CONTENT, {"id": content_id}, as_="ben"))["content"]
            assert again["status"] == "READY" and again["transcriptionFailure"] is None
            assert wer(mf.SPANISH_SPEECH, again["transcription"]) <= MAX_WER
            assert again["transcriptLanguage"] == "es"
            # READY with its transcription: nothing left to retry.
            done: dict[str, Any] = await api.post(RETRY, {"id": content_id}, as_="ana")
            assert done["errors"][0]["extensions"]["code"] == "CONFLICT"
        finally:
            await pipeline.transcriber.close()
