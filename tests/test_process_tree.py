"""A server leaves no process behind. Its photo and probe processes come from a
forkserver, which is not their parent's parent in the kernel's eyes: whether the
server is stopped (SIGTERM) or SIGKILLed, the forkserver, the resource tracker and
the photo processes end with it. So does the process that encrypts its pushes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from resolvers.core.auth import mint_token
from tests import media_factory as mf
from tests.leftovers import Process, descendants, gone
from tests.push_service import running_push_service
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


@pytest.mark.parametrize("ending", ["SIGKILL", "SIGTERM"])
async def test_a_server_that_pushed_takes_its_sealing_process_with_it(ending: str, tmp_path: Path) -> None:
    """A push was encrypted in the server's sealing process: however the server
    ends, that process ends with it (a SIGKILL leaves it its stdin's end alone)."""
    with running_push_service() as service:
        env = {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_PUSH_ALLOWED_ORIGINS": service.origin}
        server = ServerProcess(tmp_path / "data", env).start()
        try:
            service.server_key = (await graphql_data(server, ANA, "{ webPushPublicKey }"))["webPushPublicKey"]
            family = await graphql_data(
                server,
                ANA,
                'mutation { createFamily(input: {name: "Los García", trustLevel: VOUCHED}) { inviteCode } }',
            )
            register = "mutation($i: RegisterPushDeviceInput!) { registerPushDevice(input: $i) { id } }"
            await graphql_data(server, ANA, register, {"i": service.browser("phone").input()})
            # cy asks to join: ana's phone is told.
            cy = mint_token(SECRET, "cy", given_name="Cy")
            join = "mutation($c: String!) { joinFamily(inviteCode: $c) { role } }"
            await graphql_data(server, cy, join, {"c": family["createFamily"]["inviteCode"]})
            await until(lambda: len(service.to("phone")) == 1, "the push to ana's phone")
            assert service.problems == []
            assert server.process is not None
            below = descendants(server.process.pid)
            assert any("sealing.py" in process.command for process in below), [p.command for p in below]
            if ending == "SIGKILL":
                server.kill()
            else:
                server.stop()
        finally:
            server.stop()
        await _all_ended(below)
