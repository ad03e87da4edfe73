"""A server leaves no process behind. Its photo and probe processes come from a
forkserver, which is not their parent's parent in the kernel's eyes: whether the
server is stopped (SIGTERM) or SIGKILLed, the forkserver, the resource tracker and
the photo processes end with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from resolvers.core.auth import mint_token
from tests import media_factory as mf
from tests.leftovers import Process, descendants, gone
from tests.servers import SECRET, ServerProcess, graphql_data, until, upload_to

ANA = mint_token(SECRET, "ana", given_name="Ana")


async def _photo_made(server: ServerProcess, photo: Path) -> None:
    """Uploads a photo and waits until it is READY: made in a photo process."""
    body = await asyncio.to_thread(photo.read_bytes)
    content_id = await upload_to(server, ANA, "PHOTO", "image/png", body)

    async def ready() -> bool:
        query = "query($id: ID!) { content(id: $id) { status } }"
        content = await graphql_data(server, ANA, query, {"id": content_id})
        assert content["content"]["status"] != "FAILED", content
        return bool(content["content"]["status"] == "READY")

    await until(ready, "the photo to be made")


async def _all_ended(below: list[Process]) -> None:
    await until(
        lambda: all(gone(process.pid) for process in below),
        lambda: f"the server's processes to end: {[str(p) for p in below if not gone(p.pid)]}",
        seconds=60,
    )


@pytest.mark.parametrize("ending", ["SIGKILL", "SIGTERM"])
async def test_a_server_takes_its_processes_with_it(ending: str, tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", {"MIFAMILIAS_AUTH_SECRET": SECRET}).start()
    try:
        await _photo_made(server, mf.make_png(tmp_path))
        assert server.process is not None
        below = descendants(server.process.pid)
        commands = " ".join(process.command for process in below)
        # What is to end: the forkserver (and the photo processes it forked) and the tracker.
        assert "multiprocessing.forkserver" in commands and "resource_tracker" in commands, commands
        if ending == "SIGKILL":
            server.kill()
        else:
            server.stop()
        assert server.process.returncode is not None
    finally:
        server.stop()
    await _all_ended(below)


async def test_a_server_killed_while_it_transcribes_takes_its_speech_worker_with_it(tmp_path: Path) -> None:
    """A voice message has started the speech worker (and ffmpeg's pieces): a
    SIGKILL of the server's main process leaves none of them."""
    speech = mf.make_speech_wav(tmp_path, mf.SPANISH_SPEECH * 3, "es")
    server = ServerProcess(tmp_path / "data", {"MIFAMILIAS_AUTH_SECRET": SECRET}).start()
    try:
        body = await asyncio.to_thread(speech.read_bytes)
        await upload_to(server, ANA, "AUDIO", "audio/wav", body)
        assert server.process is not None
        pid = server.process.pid

        def speech_worker() -> list[str]:
            return [p.command for p in descendants(pid) if "speech.py" in p.command]

        await until(lambda: bool(speech_worker()), "the speech worker to start", seconds=120)
        below = descendants(pid)
        server.kill()
    finally:
        server.stop()
    await _all_ended(below)
