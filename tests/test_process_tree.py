"""A server leaves no process behind. Its photo and probe processes come from a
forkserver, which is not their parent's parent in the kernel's eyes: whether the
server is stopped (SIGTERM) or SIGKILLed, the forkserver, the resource tracker and
the photo processes end with it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.core.auth import mint_token
from tests import media_factory as mf
from tests.leftovers import descendants
from tests.servers import SECRET, ServerProcess, post_graphql, until

ANA = mint_token(SECRET, "ana", given_name="Ana")


async def _gql(server: ServerProcess, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    body = await post_graphql(server, ANA, query, variables)
    assert "errors" not in body, body
    data: dict[str, Any] = body["data"]
    return data


async def _photo_made(server: ServerProcess, photo: Path) -> None:
    """Uploads a photo and waits until it is READY: made in a photo process."""
    family = await _gql(server, 'mutation { createFamily(input: {name: "Los Ruiz"}) { id } }')
    body = await asyncio.to_thread(photo.read_bytes)
    created = await _gql(
        server,
        "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
        {
            "i": {
                "familyId": family["createFamily"]["id"],
                "type": "PHOTO",
                "mimeType": "image/png",
                "sizeBytes": len(body),
            }
        },
    )
    async with httpx.AsyncClient(timeout=60) as client:
        sent = await client.put(
            created["createUpload"]["uploadUrl"], content=body, headers={"Content-Type": "image/png"}
        )
    assert sent.status_code == 200
    content_id = created["createUpload"]["content"]["id"]
    await _gql(server, "mutation($id: ID!) { completeUpload(contentId: $id) { status } }", {"id": content_id})

    async def ready() -> bool:
        content = await _gql(server, "query($id: ID!) { content(id: $id) { status } }", {"id": content_id})
        assert content["content"]["status"] != "FAILED", content
        return bool(content["content"]["status"] == "READY")

    await until(ready, "the photo to be made")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


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
    await until(
        lambda: all(_gone(process.pid) for process in below),
        lambda: f"the server's processes to end: {[str(p) for p in below if not _gone(p.pid)]}",
        seconds=60,
    )
