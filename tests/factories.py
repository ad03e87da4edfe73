"""Plain functions that build what a test needs through the public API."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from store import items

CREATE_FAMILY = """
mutation($input: CreateFamilyInput!) {
  createFamily(input: $input) { id name inviteCode trustLevel vouchThreshold }
}"""

JOIN = "mutation($code: String!) { joinFamily(inviteCode: $code) { role vouchScore user { id } } }"


async def make_family(
    api: Any, admin: str, name: str = "Los García", trust: str = "OPEN", threshold: int = 2
) -> dict[str, Any]:
    data = await api.ok(
        CREATE_FAMILY, {"input": {"name": name, "trustLevel": trust, "vouchThreshold": threshold}}, as_=admin
    )
    family: dict[str, Any] = data["createFamily"]
    return family


async def join(api: Any, user: str, code: str) -> dict[str, Any]:
    data = await api.ok(JOIN, {"code": code}, as_=user)
    member: dict[str, Any] = data["joinFamily"]
    return member


async def family_with_members(api: Any, admin: str, members: list[str], name: str = "Los García") -> str:
    family = await make_family(api, admin, name)
    for user in members:
        await join(api, user, family["inviteCode"])
    return str(family["id"])


CREATE_UPLOAD = """mutation($input: CreateUploadInput!) {
  createUpload(input: $input) { uploadUrl expiresAt content { id status type } } }"""
COMPLETE = "mutation($id: ID!) { completeUpload(contentId: $id) { id status } }"


async def put_bytes(api: Any, url: str, body: bytes, mime: str) -> int:
    """PUTs through the app for local URLs, over the network for S3's."""
    headers = {"Content-Type": mime}
    if url.startswith("http://127.0.0.1:8000/"):
        response = await api.client.put(
            url.removeprefix("http://127.0.0.1:8000"), content=body, headers=headers
        )
    else:
        import httpx

        async with httpx.AsyncClient() as client:
            response = await client.put(url, content=body, headers=headers)
    return int(response.status_code)


async def put_then_drop(api: Any, url: str, body: bytes, sent: int, mime: str | None = None) -> int:
    """Starts a PUT of `body` and loses the connection after `sent` bytes.

    Local URLs: the app gets the first bytes, then `http.disconnect`, as
    uvicorn delivers a dropped connection. S3's: a socket that announces the
    whole length, writes `sent` bytes and shuts its sending side; the answer
    (moto's 400) is read, so the server is done with the request when this
    returns. Returns the HTTP status the server gave.
    """
    parts = urlsplit(url)
    headers = [(b"content-length", str(len(body)).encode()), (b"host", parts.netloc.encode())]
    if mime is not None:  # a whole object's URL is signed for its type; a part's for none
        headers.append((b"content-type", mime.encode()))
    if url.startswith("http://127.0.0.1:8000/"):
        chunks = [body[i : min(i + (1 << 20), sent)] for i in range(0, sent, 1 << 20)]
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            if chunks:
                return {"type": "http.request", "body": chunks.pop(0), "more_body": True}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "PUT",
            "scheme": "http",
            "path": unquote(parts.path),
            "raw_path": parts.path.encode(),
            "query_string": parts.query.encode(),
            "headers": headers,
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 40000),
            "root_path": "",
        }
        await api.app(scope, receive, send)
        return status[0]
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = f"PUT {parts.path}?{parts.query} HTTP/1.1\r\n"
        head += "".join(f"{name.decode()}: {value.decode()}\r\n" for name, value in headers)
        writer.write(head.encode() + b"connection: close\r\n\r\n" + body[:sent])
        await writer.drain()
        writer.write_eof()
        answer = await reader.read()
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1])


async def start_upload(
    api: Any,
    user: str,
    family_id: str,
    kind: str,
    mime: str,
    size: int,
    title: str | None = None,
    capsule_id: str | None = None,
) -> dict[str, Any]:
    variables = {
        "input": {
            "familyId": family_id,
            "type": kind,
            "mimeType": mime,
            "sizeBytes": size,
            "title": title,
            "capsuleId": capsule_id,
        }
    }
    upload: dict[str, Any] = (await api.ok(CREATE_UPLOAD, variables, as_=user))["createUpload"]
    return upload


async def upload(
    api: Any,
    user: str,
    family_id: str,
    kind: str,
    body: bytes,
    mime: str,
    title: str | None = None,
    capsule_id: str | None = None,
) -> str:
    """createUpload, the bytes, completeUpload: the content id, now PROCESSING."""
    started = await start_upload(api, user, family_id, kind, mime, len(body), title, capsule_id)
    assert await put_bytes(api, started["uploadUrl"], body, mime) == 200
    content_id = str(started["content"]["id"])
    await api.ok(COMPLETE, {"id": content_id}, as_=user)
    return content_id


async def settle(api: Any) -> None:
    """Waits until the media pipeline has nothing queued."""
    await api.services.pipeline.queue.join()  # every queued content processed


# Straight into the store, for scale: a family and LOCKED capsules due at a moment,
# as a day of use would leave them (tests of the scheduler, and bench/).


def family_rows(family_id: str, creator: str, people: Sequence[str]) -> list[dict[str, Any]]:
    now = items.iso(datetime.now(UTC))
    rows = [
        items.Family(family_id, "Many capsules", creator, "OPEN", 2, f"CODE{family_id[:6]}", now).to_item()
    ]
    for person in [creator, *people]:
        role = "ADMIN" if person == creator else "MEMBER"
        rows.append(items.Membership(family_id, person, role, now).to_item())
        rows.append(items.UserFamily(person, family_id, now).to_item())
        rows.append(items.User(person, now, given_name=person).to_item())
    return rows


def capsule_rows(
    family_id: str, creator: str, recipients: Sequence[str], unlock: datetime, shards: int, tag: str = ""
) -> tuple[str, list[dict[str, Any]]]:
    """One LOCKED capsule wrapping READY content, due at `unlock`."""
    now = items.iso(datetime.now(UTC))
    when = items.iso(unlock)
    capsule_id = f"cap{tag}{uuid.uuid4().hex[:10]}"
    content_id = f"con{tag}{uuid.uuid4().hex[:10]}"
    rows = [
        items.Content(
            id=content_id,
            family_id=family_id,
            author_id=creator,
            type="TEXT",
            status="READY",
            mime_type="text/plain",
            size_bytes=4,
            created_at=now,
            capsule_id=capsule_id,
            in_feed=False,
            ready_at=now,
            media_key=f"content/{content_id}/original",
        ).to_item(),
        items.Capsule(
            id=capsule_id,
            family_id=family_id,
            creator_id=creator,
            title="capsule",
            unlock_date=when,
            status="LOCKED",
            created_at=now,
            recipient_ids=tuple(recipients),
            content_id=content_id,
        ).to_item(shards),
    ]
    rows += [
        items.Recipient(capsule_id, person, when, family_id, visible=True).to_item() for person in recipients
    ]
    return capsule_id, rows
