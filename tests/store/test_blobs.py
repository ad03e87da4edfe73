"""The blob-store contract (`store.blobs.port`) on both adapters (`store.blobs.s3`,
`store.blobs.local`), and what only one adapter does: S3's signed headers and
bucket rule, the local store's signed-URL refusals.

Local: URLs are exercised through `media_routes` in a tiny Starlette app over
httpx's ASGITransport. S3: real HTTP to the session's moto server
(`moto_server` in tests/conftest.py; credentials from its autouse `aws_env`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from starlette.applications import Starlette

from resolvers.adapters.media_http import media_routes
from store.blobs import (
    ABANDONED_UPLOAD_DAYS,
    ABANDONED_UPLOAD_SECONDS,
    GLACIER_IR,
    STANDARD,
    BlobAccessDenied,
    BlobNotFound,
    BlobStore,
    InvalidBlobKey,
    LocalBlobStore,
    Part,
    PartsChanged,
    open_s3_blob_store,
)

SECRET = b"test-secret-test-secret-test-secret"
KEY = "families/f1/media/m1/original.jpg"
BODY = b"\xff\xd8\xff" + os.urandom(4000)


# Harness ------------------------------------------------------------------


@dataclass
class Harness:
    kind: str
    blobs: BlobStore
    http: httpx.AsyncClient  # talks to the URLs the store hands out

    async def upload(self, key: str, body: bytes, content_type: str = "image/jpeg") -> None:
        url = await self.blobs.upload_url(
            key, content_type=content_type, size_bytes=len(body), expires_in=300
        )
        response = await self.http.put(url, content=body, headers={"Content-Type": content_type})
        assert response.status_code in (200, 201), response.text

    async def download(self, key: str) -> httpx.Response:
        url = await self.blobs.download_url(key, expires_in=300)
        return await self.http.get(url)


def _local_client(blobs: LocalBlobStore) -> httpx.AsyncClient:
    app = Starlette(routes=media_routes(blobs))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


@pytest.fixture(params=["local", "s3"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    if request.param == "local":
        blobs = LocalBlobStore(tmp_path / "blobs", "http://testserver", SECRET)
        async with _local_client(blobs) as http:
            yield Harness("local", blobs, http)
        return
    endpoint: str = request.getfixturevalue("moto_server")
    bucket = f"blobs-{uuid.uuid4().hex[:16]}"
    async with open_s3_blob_store(bucket, endpoint, "eu-west-1") as s3, httpx.AsyncClient() as http:
        yield Harness("s3", s3, http)


# Both adapters --------------------------------------------------------------


async def test_upload_head_download(harness: Harness) -> None:
    assert await harness.blobs.head(KEY) is None
    await harness.upload(KEY, BODY)
    assert await harness.blobs.head(KEY) == len(BODY)
    response = await harness.download(KEY)
    assert response.status_code == 200
    assert response.content == BODY
    assert response.headers["content-type"].startswith("image/jpeg")


async def test_upload_overwrites(harness: Harness) -> None:
    await harness.upload(KEY, b"first")
    await harness.upload(KEY, b"second body")
    assert await harness.blobs.head(KEY) == len(b"second body")
    assert (await harness.download(KEY)).content == b"second body"


async def test_empty_body(harness: Harness) -> None:
    await harness.upload("families/f1/empty.txt", b"", "text/plain")
    assert await harness.blobs.head("families/f1/empty.txt") == 0


async def test_delete(harness: Harness) -> None:
    keys = [f"families/f1/media/m{i}/thumb.webp" for i in range(3)]
    for key in keys:
        await harness.upload(key, b"x" * 10, "image/webp")
    await harness.blobs.delete([*keys[:2], "families/f1/never-there.jpg"])
    assert [await harness.blobs.head(key) for key in keys] == [None, None, 10]
    await harness.blobs.delete([])
    await harness.blobs.delete(keys)
    assert await harness.blobs.head(keys[2]) is None


async def test_archive_and_restore(harness: Harness) -> None:
    await harness.upload(KEY, BODY)
    assert await harness.blobs.storage_class(KEY) == STANDARD
    await harness.blobs.archive(KEY)
    assert await harness.blobs.storage_class(KEY) == GLACIER_IR
    await harness.blobs.archive(KEY)  # idempotent
    assert await harness.blobs.storage_class(KEY) == GLACIER_IR
    # Instant retrieval: still there, same bytes and type.
    assert await harness.blobs.head(KEY) == len(BODY)
    response = await harness.download(KEY)
    assert response.content == BODY
    assert response.headers["content-type"].startswith("image/jpeg")
    await harness.blobs.restore(KEY)
    assert await harness.blobs.storage_class(KEY) == STANDARD
    await harness.blobs.restore(KEY)  # idempotent
    assert await harness.blobs.storage_class(KEY) == STANDARD
    assert (await harness.download(KEY)).content == BODY


async def test_rewrite_makes_archived_object_standard(harness: Harness) -> None:
    await harness.upload(KEY, BODY)
    await harness.blobs.archive(KEY)
    await harness.upload(KEY, b"new")
    assert await harness.blobs.storage_class(KEY) == STANDARD


async def test_missing_object(harness: Harness, tmp_path: Path) -> None:
    missing = "families/f1/missing.jpg"
    with pytest.raises(BlobNotFound):
        await harness.blobs.storage_class(missing)
    with pytest.raises(BlobNotFound):
        await harness.blobs.archive(missing)
    with pytest.raises(BlobNotFound):
        await harness.blobs.restore(missing)
    target = tmp_path / "out" / "missing.jpg"
    target.parent.mkdir()
    with pytest.raises(BlobNotFound):
        await harness.blobs.fetch_to_file(missing, target)
    assert list(target.parent.iterdir()) == []


async def test_put_file_and_fetch_to_file(harness: Harness, tmp_path: Path) -> None:
    source = tmp_path / "poster.png"
    data = os.urandom(300_000)
    source.write_bytes(data)
    key = "families/f1/media/m1/poster.png"
    await harness.blobs.put_file(key, source, "image/png")
    assert await harness.blobs.head(key) == len(data)
    target = tmp_path / "work" / "copy.png"
    target.parent.mkdir()
    await harness.blobs.fetch_to_file(key, target)
    assert target.read_bytes() == data
    assert [p.name for p in target.parent.iterdir()] == ["copy.png"]  # no temp left
    response = await harness.download(key)
    assert response.content == data
    assert response.headers["content-type"].startswith("image/png")


@pytest.mark.parametrize(
    "key", ["", "/abs/key.jpg", "a/../b.jpg", "..", "a//b", "a/./b", ".used/x", "a/.hidden", "a\\b", "a\nb"]
)
async def test_invalid_keys(harness: Harness, key: str) -> None:
    with pytest.raises(InvalidBlobKey):
        await harness.blobs.upload_url(key, content_type="image/jpeg", size_bytes=1, expires_in=60)
    with pytest.raises(InvalidBlobKey):
        await harness.blobs.download_url(key, expires_in=60)
    with pytest.raises(InvalidBlobKey):
        await harness.blobs.head(key)


async def test_s3_presigned_put_binds_type_and_length(
    moto_server: str,
) -> None:
    # moto does not check presigned signatures, so pin the contract on the URL:
    # real S3 refuses a PUT whose Content-Type or Content-Length differ.
    async with open_s3_blob_store(f"blobs-{uuid.uuid4().hex[:16]}", moto_server, "eu-west-1") as s3:
        url = await s3.upload_url(KEY, content_type="image/jpeg", size_bytes=42, expires_in=60)
    signed = parse_qs(urlsplit(url).query)["X-Amz-SignedHeaders"][0].split(";")
    assert {"content-length", "content-type", "host"} <= set(signed)


# Local refusals -------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def local(tmp_path: Path, clock: Clock) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs", "http://testserver", SECRET, clock=clock)


@pytest.fixture
async def client(local: LocalBlobStore) -> AsyncIterator[httpx.AsyncClient]:
    async with _local_client(local) as http:
        yield http


def _stored_files(root: Path) -> list[Path]:
    """Every file under root except consumed-nonce markers."""
    return sorted(p for p in root.rglob("*") if p.is_file() and ".used" not in p.relative_to(root).parts)


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update(changes)
    return urlunsplit(parts._replace(query=urlencode(query)))


def _with_path(url: str, path: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=path))


async def _put_url(local: LocalBlobStore, key: str = KEY, size: int = len(BODY)) -> str:
    return await local.upload_url(key, content_type="image/jpeg", size_bytes=size, expires_in=300)


JPEG = {"Content-Type": "image/jpeg"}


async def test_url_shape(local: LocalBlobStore, clock: Clock) -> None:
    url = await _put_url(local, "families/f1/a b.jpg", 12)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "testserver", "/media/families/f1/a%20b.jpg")
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert query["method"] == "PUT"
    assert query["size"] == "12"
    assert query["expires"] == str(int(clock.now) + 300)
    assert len(query["nonce"]) == 32 and len(query["sig"]) == 43  # SHA-256, URL-safe base64
    get = urlsplit(await local.download_url("families/f1/a b.jpg", expires_in=60))
    assert "size" not in parse_qs(get.query)


async def test_key_with_space_roundtrips(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    key = "families/f1/a b.jpg"
    response = await client.put(await _put_url(local, key, 3), content=b"abc", headers=JPEG)
    assert response.status_code == 200
    assert (local.root / "families/f1/a b.jpg").read_bytes() == b"abc"
    assert (await client.get(await local.download_url(key, expires_in=60))).content == b"abc"


async def test_tampered_signature(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    url = await _put_url(local)
    sig = parse_qs(urlsplit(url).query)["sig"][0]
    bad = _with_query(url, sig=("0" if sig[0] != "0" else "1") + sig[1:])
    response = await client.put(bad, content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text == "bad signature"
    assert _stored_files(local.root) == []
    # Other signed fields count too: a bigger size, a later expiry.
    for changes in ({"size": str(len(BODY) * 2)}, {"expires": "9999999999"}, {"content_type": "text/html"}):
        response = await client.put(_with_query(url, **changes), content=BODY, headers=JPEG)
        assert response.status_code == 403
        assert response.text == "bad signature"
    assert _stored_files(local.root) == []
    # The untouched URL still works: refusals did not consume it.
    assert (await client.put(url, content=BODY, headers=JPEG)).status_code == 200


async def test_missing_params(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    url = await _put_url(local)
    response = await client.put(url.split("?")[0], content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text == "malformed url"
    assert _stored_files(local.root) == []


async def test_expired(local: LocalBlobStore, client: httpx.AsyncClient, clock: Clock) -> None:
    put = await _put_url(local)
    get = await local.download_url(KEY, expires_in=60)
    clock.now += 61
    response = await client.get(get)
    assert response.status_code == 403
    assert response.text.startswith("url expired")
    clock.now += 300
    response = await client.put(put, content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text.startswith("url expired")
    assert _stored_files(local.root) == []


async def test_put_url_is_single_use(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    url = await _put_url(local)
    assert (await client.put(url, content=BODY, headers=JPEG)).status_code == 200
    response = await client.put(url, content=b"\xff\xd8\xffother", headers=JPEG)
    assert response.status_code == 403
    assert response.text.startswith("url already used")
    assert (local.root / KEY).read_bytes() == BODY


async def test_used_nonce_is_durable(tmp_path: Path, local: LocalBlobStore, clock: Clock) -> None:
    url = await _put_url(local)
    async with _local_client(local) as http:
        assert (await http.put(url, content=BODY, headers=JPEG)).status_code == 200
    # Another process (a fresh store on the same root) refuses it too.
    again = LocalBlobStore(local.root, "http://testserver", SECRET, clock=clock)
    async with _local_client(again) as http:
        response = await http.put(url, content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text.startswith("url already used")


async def test_claim_is_atomic(local: LocalBlobStore) -> None:
    url = await _put_url(local)
    verified = local.verify("PUT", KEY, {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()})
    local.claim(verified)
    with pytest.raises(BlobAccessDenied, match="already used"):
        local.claim(verified)


async def test_get_url_cannot_put(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    get = await local.download_url(KEY, expires_in=300)
    response = await client.put(get, content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text == "url is for GET"
    assert _stored_files(local.root) == []
    # Relabelling it as a PUT breaks the signature.
    response = await client.put(
        _with_query(get, method="PUT", size="99999", content_type="image/jpeg"), content=BODY, headers=JPEG
    )
    assert response.status_code == 403
    assert response.text == "bad signature"
    assert _stored_files(local.root) == []


async def test_put_url_cannot_get(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    await local.put_file(KEY, _write(local.root.parent / "src.jpg", BODY), "image/jpeg")
    response = await client.get(await _put_url(local))
    assert response.status_code == 403
    assert response.text == "url is for PUT"


async def test_url_bound_to_its_key(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    url = await _put_url(local)
    other = _with_path(url, "/media/families/f2/media/m9/original.jpg")
    response = await client.put(other, content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text == "bad signature"
    assert _stored_files(local.root) == []
    # GET likewise.
    await local.put_file(
        "families/f2/secret.jpg", _write(local.root.parent / "s.jpg", b"secret"), "image/jpeg"
    )
    get = await local.download_url(KEY, expires_in=60)
    response = await client.get(_with_path(get, "/media/families/f2/secret.jpg"))
    assert response.status_code == 403


async def test_traversal_refused(local: LocalBlobStore) -> None:
    url = await _put_url(local)
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    for key in ("../outside.jpg", "families/../../x", "/etc/passwd", ".used/" + query["nonce"]):
        with pytest.raises(BlobAccessDenied, match="invalid key"):
            local.verify("PUT", key, query)


async def test_wrong_content_type(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    url = await _put_url(local)
    for headers in ({"Content-Type": "text/html"}, {}):
        response = await client.put(url, content=BODY, headers=headers)
        assert response.status_code == 403
        assert response.text == "content type does not match the url"
    assert _stored_files(local.root) == []
    # Not consumed: the right request still goes through.
    assert (await client.put(url, content=BODY, headers=JPEG)).status_code == 200


async def test_body_over_announced_size(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    url = await _put_url(local, size=10)
    response = await client.put(url, content=b"x" * 11, headers=JPEG)
    assert response.status_code == 413
    assert response.text.startswith("the body has 11 bytes, but 10 were announced")
    assert _stored_files(local.root) == []
    # Refused before the URL was spent: the right body goes to the same URL.
    response = await client.put(url, content=b"x" * 10, headers=JPEG)
    assert response.status_code == 200
    assert await local.head(KEY) == 10


async def test_streamed_body_over_announced_size(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    # No Content-Length (chunked): refused while streaming, temp file removed.
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"y" * 4
        raise AssertionError("should have stopped reading")  # pragma: no cover

    url = await _put_url(local, size=10)
    response = await client.put(url, content=chunks(), headers=JPEG)
    assert response.status_code == 413
    assert _stored_files(local.root) == []


async def test_receive_refuses_without_leftovers(local: LocalBlobStore) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"a" * 8
        yield b"b" * 8

    from store.blobs import BlobTooLarge

    with pytest.raises(BlobTooLarge):
        await local.receive(KEY, chunks(), max_bytes=10)
    assert _stored_files(local.root) == []
    assert await local.receive(KEY, chunks(), max_bytes=16) == 16
    assert (local.root / KEY).read_bytes() == b"a" * 8 + b"b" * 8


async def test_a_shorter_body_is_refused_and_the_url_stays_usable(
    local: LocalBlobStore, client: httpx.AsyncClient
) -> None:
    url = await _put_url(local, size=100)
    # As announced by Content-Length, before a byte is read.
    refused = await client.put(url, content=b"short", headers=JPEG)
    assert refused.status_code == 400
    assert refused.text.startswith("the body has 5 bytes, but 100 were announced")

    # And as streamed (chunked), when the body ends.
    async def chunks() -> AsyncIterator[bytes]:
        yield b"short"

    refused = await client.put(url, content=chunks(), headers=JPEG)
    assert refused.status_code == 400 and "100 were announced" in refused.text
    assert _stored_files(local.root) == []
    assert (await client.put(url, content=b"x" * 100, headers=JPEG)).status_code == 200
    assert await local.head(KEY) == 100
    used = await client.put(url, content=b"x" * 100, headers=JPEG)
    assert used.status_code == 403 and "resumeUpload" in used.text


async def test_get_missing_is_404(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    response = await client.get(await local.download_url(KEY, expires_in=60))
    assert response.status_code == 404


async def test_get_headers(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    key = "families/f1/page.html"
    await local.put_file(key, _write(local.root.parent / "p.html", b"<script>1</script>"), "text/html")
    response = await client.get(await local.download_url(key, expires_in=60))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in response.headers["content-security-policy"]
    head = await client.head(await local.download_url(key, expires_in=60))
    assert head.status_code == 200
    assert head.headers["content-length"] == str(len(b"<script>1</script>"))


async def test_prune_used(local: LocalBlobStore, client: httpx.AsyncClient, clock: Clock) -> None:
    url = await _put_url(local)
    assert (await client.put(url, content=BODY, headers=JPEG)).status_code == 200
    assert local.prune_used() == 0  # still verifiable: must stay
    clock.now += 301
    assert local.prune_used() == 1
    response = await client.put(url, content=BODY, headers=JPEG)
    assert response.status_code == 403
    assert response.text.startswith("url expired")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# Multipart uploads ------------------------------------------------------------

MIB = 1024 * 1024
BIG = os.urandom(5 * MIB) + b"tail of the file"  # S3's smallest part, then a last one
MP4 = "video/mp4"


async def _send_part(harness: Harness, upload_id: str, number: int, body: bytes, key: str = KEY) -> int:
    url = await harness.blobs.part_url(key, upload_id, number, size_bytes=len(body), expires_in=300)
    return (await harness.http.put(url, content=body)).status_code


async def test_multipart_upload(harness: Harness) -> None:
    upload_id = await harness.blobs.start_multipart(KEY, content_type=MP4)
    assert await harness.blobs.uploaded_parts(KEY, upload_id) == []
    first, last = BIG[: 5 * MIB], BIG[5 * MIB :]
    assert await _send_part(harness, upload_id, 2, last) == 200  # any order
    assert await _send_part(harness, upload_id, 1, b"an early, wrong first part") == 200
    assert await _send_part(harness, upload_id, 1, first) == 200  # sending again replaces it
    parts = await harness.blobs.uploaded_parts(KEY, upload_id)
    assert parts is not None
    assert [(p.number, p.size) for p in parts] == [(1, len(first)), (2, len(last))]
    assert await harness.blobs.head(KEY) is None  # nothing is the object before completion

    await harness.blobs.complete_multipart(KEY, upload_id, parts)
    assert await harness.blobs.head(KEY) == len(BIG)
    assert (await harness.download(KEY)).content == BIG
    assert await harness.blobs.uploaded_parts(KEY, upload_id) is None  # closed
    await harness.blobs.abort_multipart(KEY, upload_id)  # a closed upload: ignored
    assert await harness.blobs.head(KEY) == len(BIG)


async def test_abort_multipart(harness: Harness) -> None:
    upload_id = await harness.blobs.start_multipart(KEY, content_type=MP4)
    assert await _send_part(harness, upload_id, 1, b"some bytes") == 200
    await harness.blobs.abort_multipart(KEY, upload_id)
    assert await harness.blobs.uploaded_parts(KEY, upload_id) is None
    if harness.kind == "local":  # S3 answers NoSuchUpload, which moto answers with a 500
        with pytest.raises(BlobNotFound):
            await harness.blobs.complete_multipart(KEY, upload_id, [Part(1, 10)])
    assert await harness.blobs.head(KEY) is None


async def test_s3_part_url_binds_length(moto_server: str) -> None:
    # As for a whole PUT, pin the contract on the URL (moto checks no signature).
    async with open_s3_blob_store(f"blobs-{uuid.uuid4().hex[:16]}", moto_server, "eu-west-1") as s3:
        upload_id = await s3.start_multipart(KEY, content_type=MP4)
        url = await s3.part_url(KEY, upload_id, 3, size_bytes=42, expires_in=60)
        await s3.abort_multipart(KEY, upload_id)
    query = parse_qs(urlsplit(url).query)
    assert query["partNumber"] == ["3"] and query["uploadId"] == [upload_id]
    assert set(query["X-Amz-SignedHeaders"][0].split(";")) == {"content-length", "host"}


async def test_s3_bucket_made_here_drops_abandoned_uploads(moto_server: str) -> None:
    import aioboto3

    made, existing = f"blobs-{uuid.uuid4().hex[:16]}", f"blobs-{uuid.uuid4().hex[:16]}"
    theirs = {"ID": "theirs", "Status": "Enabled", "Filter": {"Prefix": "x/"}, "Expiration": {"Days": 9}}
    async with aioboto3.Session().client("s3", endpoint_url=moto_server, region_name="us-east-1") as client:
        await client.create_bucket(Bucket=existing)
        await client.put_bucket_lifecycle_configuration(
            Bucket=existing, LifecycleConfiguration={"Rules": [theirs]}
        )
        for bucket in (made, existing):
            async with open_s3_blob_store(bucket, moto_server, "us-east-1"):
                pass
        rules = (await client.get_bucket_lifecycle_configuration(Bucket=made))["Rules"]
        assert [r["AbortIncompleteMultipartUpload"] for r in rules] == [
            {"DaysAfterInitiation": ABANDONED_UPLOAD_DAYS}
        ]
        # A bucket that was there keeps its owner's rules.
        rules = (await client.get_bucket_lifecycle_configuration(Bucket=existing))["Rules"]
        assert [r["ID"] for r in rules] == ["theirs"]


def test_a_temp_file_whose_writer_is_gone_is_swept_at_once(local: LocalBlobStore, clock: Clock) -> None:
    import socket
    import subprocess

    ended = subprocess.Popen(["true"])
    ended.wait()
    host = socket.gethostname().replace(".", "_")
    tmp = local.root / ".tmp"
    names = {
        "dead": f"{host}.{ended.pid}.abc.part",  # a process of this host that was killed
        "alive": f"{host}.{os.getpid()}.abc.part",  # this one, still writing
        "elsewhere": f"other_host.{ended.pid}.abc.part",  # another host's: only age tells
    }
    for name in names.values():
        (tmp / name).write_bytes(b"x")
    (tmp / f"{host}.{ended.pid}.upload-abc").mkdir()
    for path in tmp.iterdir():
        os.utime(path, (clock.now, clock.now))  # all written just now
    assert local.sweep_abandoned() == 2
    assert sorted(p.name for p in tmp.iterdir()) == sorted([names["alive"], names["elsewhere"]])


async def test_local_part_urls(local: LocalBlobStore, client: httpx.AsyncClient) -> None:
    upload_id = await local.start_multipart(KEY, content_type=MP4)
    url = await local.part_url(KEY, upload_id, 1, size_bytes=10, expires_in=300)
    # No Content-Type is bound to a part (as on S3).
    other = await local.part_url(KEY, upload_id, 2, size_bytes=10, expires_in=300)
    # The part number and the upload are signed.
    assert (await client.put(_with_query(url, part="2"), content=b"x")).status_code == 403
    assert (await client.put(_with_query(url, upload="0" * 32), content=b"x")).status_code == 403
    # Over the part's size: 413, and the URL is not spent.
    assert (await client.put(url, content=b"x" * 11)).status_code == 413
    # A part may be shorter (the last one is), and the refusal left its URL usable.
    assert (await client.put(url, content=b"x")).status_code == 200
    assert (await client.put(url, content=b"x")).text.startswith("url already used")
    assert (await client.put(other, content=b"0123456789", headers=JPEG)).status_code == 200
    assert await local.uploaded_parts(KEY, upload_id) == [Part(1, 1), Part(2, 10)]

    # A part streams to disk: refused as soon as it goes over, nothing kept.
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"y" * 4
        raise AssertionError("should have stopped reading")  # pragma: no cover

    third = await local.part_url(KEY, upload_id, 3, size_bytes=10, expires_in=300)
    assert (await client.put(third, content=chunks())).status_code == 413
    assert await local.uploaded_parts(KEY, upload_id) == [Part(1, 1), Part(2, 10)]
    assert list((local.root / ".tmp").iterdir()) == []
    # Once the upload is closed, a part has nowhere to go.
    await local.abort_multipart(KEY, upload_id)
    late = await local.part_url(KEY, upload_id, 1, size_bytes=10, expires_in=300)
    response = await client.put(late, content=b"x")
    assert (response.status_code, response.text) == (404, "the upload is no longer open")
    assert _stored_files(local.root) == []


async def test_local_completion_refuses_a_part_that_changed(
    local: LocalBlobStore, client: httpx.AsyncClient
) -> None:
    upload_id = await local.start_multipart(KEY, content_type=MP4)
    for number, body in ((1, b"first "), (2, b"second")):
        url = await local.part_url(KEY, upload_id, number, size_bytes=10, expires_in=300)
        assert (await client.put(url, content=body)).status_code == 200
    listed = await local.uploaded_parts(KEY, upload_id)
    assert listed == [Part(1, 6), Part(2, 6)]
    url = await local.part_url(KEY, upload_id, 2, size_bytes=10, expires_in=300)
    assert (await client.put(url, content=b"second!")).status_code == 200
    with pytest.raises(PartsChanged):
        await local.complete_multipart(KEY, upload_id, listed)
    # Still open, as it was, and nothing written.
    assert await local.uploaded_parts(KEY, upload_id) == [Part(1, 6), Part(2, 7)]
    assert await local.head(KEY) is None
    await local.complete_multipart(KEY, upload_id, [Part(1, 6), Part(2, 7)])
    assert (local.root / KEY).read_bytes() == b"first second!"
    assert list((local.root / ".tmp").iterdir()) == []
    assert list((local.root / ".multipart").iterdir()) == []


async def test_local_sweep_drops_abandoned_uploads(
    local: LocalBlobStore, client: httpx.AsyncClient, clock: Clock
) -> None:
    old = await local.start_multipart(KEY, content_type=MP4)
    url = await local.part_url(KEY, old, 1, size_bytes=4, expires_in=300)
    assert (await client.put(url, content=b"part")).status_code == 200
    clock.now += ABANDONED_UPLOAD_SECONDS / 2
    recent = await local.start_multipart("families/f1/other.mp4", content_type=MP4)
    # A temp file a crash left behind long ago, and one being written now.
    stale, fresh = local.root / ".tmp" / "stale.part", local.root / ".tmp" / "fresh.part"
    for path, when in ((stale, clock.now - ABANDONED_UPLOAD_SECONDS - 1), (fresh, clock.now)):
        path.write_bytes(b"x")
        os.utime(path, (when, when))
    assert local.sweep_abandoned() == 1  # the stale temp file; both uploads are younger
    clock.now += ABANDONED_UPLOAD_SECONDS / 2 + 1
    os.utime(fresh, (clock.now, clock.now))
    assert local.sweep_abandoned() == 1  # the upload started two days and a second ago
    assert not (local.root / ".multipart" / old).exists()
    assert await local.uploaded_parts(KEY, old) is None
    assert await local.uploaded_parts("families/f1/other.mp4", recent) == []
    assert sorted(p.name for p in (local.root / ".tmp").iterdir()) == ["fresh.part"]
    late = await local.part_url(KEY, old, 2, size_bytes=4, expires_in=300)
    assert (await client.put(late, content=b"more")).status_code == 404
