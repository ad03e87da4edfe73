"""Transcription across a crash, with real server processes on each engine: a server
SIGKILLed while its speech worker decodes takes that worker with it, and the next process
resumes the content from TRANSCRIBING to READY with its transcript."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jiwer
import pytest

from resolvers.core.auth import mint_token
from tests import media_factory as mf
from tests.leftovers import gone
from tests.servers import SECRET, ServerProcess, engine_env, graphql_data, pipeline_env, until, upload_to

ANA = mint_token(SECRET, "ana", given_name="Ana")


@pytest.fixture(params=["sqlite", "dynamodb"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    async with engine_env(request.param, request) as env:
        yield env


async def _upload_video(server: ServerProcess, video: Path) -> str:
    return await upload_to(server, ANA, "VIDEO", "video/mp4", await asyncio.to_thread(video.read_bytes))


async def _content(server: ServerProcess, content_id: str) -> dict[str, Any]:
    query = "query($id: ID!) { content(id: $id) { status transcription transcriptLanguage captionsUrl } }"
    content: dict[str, Any] = (await graphql_data(server, ANA, query, {"id": content_id}))["content"]
    return content


def _speech_workers(parent: int) -> list[int]:
    """The pids of `parent`'s speech workers (children running speech.py)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"speech.py" in cmdline:
            found.append(int(entry.name))
    return found


async def test_a_server_killed_mid_transcription_is_resumed_by_the_next(
    engine: dict[str, str], tmp_path: Path
) -> None:
    english = mf.make_speech_wav(tmp_path, f"{mf.ENGLISH_SPEECH} {mf.ENGLISH_SPEECH}", "en")
    video = mf.make_video_with_speech(tmp_path, english)
    first = ServerProcess(tmp_path / "data", pipeline_env(engine), name="first").start()
    try:
        content_id = await _upload_video(first, video)
        assert first.process is not None
        server_pid = first.process.pid
        workers: list[int] = []

        async def decoding() -> bool:
            status = (await _content(first, content_id))["status"]
            assert status in ("PROCESSING", "TRANSCODING", "TRANSCRIBING"), (
                status
            )  # not READY before the kill
            workers[:] = _speech_workers(server_pid) if status == "TRANSCRIBING" else []
            return bool(workers)

        await until(decoding, "the speech worker to start on the content")
        first.kill()
    finally:
        first.stop()
    # The worker dies with its server: nobody is left decoding for a content the next resumes.
    await until(lambda: all(gone(pid) for pid in workers), "the killed server's speech worker to exit")

    second = ServerProcess(tmp_path / "data", pipeline_env(engine), name="second").start()
    try:
        seen: list[str] = []

        async def ready() -> bool:
            content = await _content(second, content_id)
            seen.append(content["status"])
            return bool(content["status"] == "READY")

        await until(ready, "the next process to finish the transcription", seconds=300)
        assert set(seen) <= {"TRANSCRIBING", "READY"}, seen
        content = await _content(second, content_id)
        heard = " ".join(content["transcription"].lower().replace(".", " ").replace(",", " ").split())
        said = " ".join(f"{mf.ENGLISH_SPEECH} {mf.ENGLISH_SPEECH}".lower().replace(".", " ").split())
        assert jiwer.wer(said, heard) <= 0.35, heard
        assert content["transcriptLanguage"] == "en" and content["captionsUrl"]
    finally:
        second.stop()
