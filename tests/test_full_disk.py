"""A full filesystem under the embedded store, as a real server process meets
it: a small tmpfs holds the data directory (the SQLite file and the media).
Filled up, /readyz answers 503, a write answers UNAVAILABLE (no 500, no
traceback), a media PUT answers 507 and keeps its URL; once space returns,
the same URL takes the body and everything works again."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.core.auth import mint_token
from tests.servers import SECRET, ServerProcess

SIZE_MB = 40


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (it needs root with CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path) -> Path:
    """Writes until the filesystem refuses: nothing is left."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        try:
            while True:
                out.write(b"\0" * (1 << 20))
                out.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    with contextlib.suppress(OSError), filler.open("ab") as out:
        while True:  # the last few blocks
            out.write(b"\0" * 4096)
            out.flush()
    return filler


async def gql(client: httpx.AsyncClient, server: ServerProcess, query: str, variables: dict[str, Any]) -> Any:
    response = await client.post(
        f"{server.url}/graphql",
        json={"query": query, "variables": variables},
        headers={"Authorization": f"Bearer {mint_token(SECRET, 'ana', given_name='Ana')}"},
    )
    assert response.status_code in (200, 400), response.text
    return response.json()


async def test_a_full_disk_answers_cleanly_and_recovers(small_disk: Path, tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "logs",  # the log stays off the full disk
        {"MIFAMILIAS_AUTH_SECRET": SECRET, "MIFAMILIAS_DATA_DIR": str(small_disk)},
    ).start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(f"{server.url}/readyz")).status_code == 200
            made = await gql(client, server, 'mutation { createFamily(input: {name: "Llena"}) { id } }', {})
            family_id = made["data"]["createFamily"]["id"]
            note = b"una nota para cuando haya sitio\n" * 2000
            created = await gql(
                client,
                server,
                "mutation($i: CreateUploadInput!) { createUpload(input: $i) { uploadUrl content { id } } }",
                {
                    "i": {
                        "familyId": family_id,
                        "type": "TEXT",
                        "mimeType": "text/plain",
                        "sizeBytes": len(note),
                    }
                },
            )
            url = created["data"]["createUpload"]["uploadUrl"]
            content_id = created["data"]["createUpload"]["content"]["id"]

            filler = fill(small_disk)
            ready = await client.get(f"{server.url}/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.json()["store"] != "ok"
            refused = await gql(client, server, 'mutation { createFamily(input: {name: "Otra"}) { id } }', {})
            error = refused["errors"][0]
            assert error["extensions"]["code"] == "UNAVAILABLE" and error["extensions"]["retryAfter"] > 0
            put = await client.put(url, content=note, headers={"Content-Type": "text/plain"})
            assert put.status_code == 507 and put.headers["Retry-After"], put.text

            filler.unlink()  # space again
            assert (await client.get(f"{server.url}/readyz")).status_code == 200
            put = await client.put(url, content=note, headers={"Content-Type": "text/plain"})
            assert put.status_code == 200, put.text
            done = await gql(
                client,
                server,
                "mutation($id: ID!) { completeUpload(contentId: $id) { status } }",
                {"id": content_id},
            )
            assert done["data"]["completeUpload"]["status"] == "PROCESSING", done
            again = await gql(client, server, 'mutation { createFamily(input: {name: "Otra"}) { id } }', {})
            assert "errors" not in again, again
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
