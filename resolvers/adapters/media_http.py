"""The app's own media endpoints, for the local blob store (`store.blobs.local.LocalBlobStore`).

`PUT /media/{key}` stores a raw body, `GET /media/{key}` (and HEAD) serves it;
both only with a URL signed by the store (`upload_url` / `download_url`).

PUT, step by step, each refusal leaving nothing on disk:

1. `verify`: signature, method, key, expiry, nonce not yet used -> else 403.
2. The request's `Content-Type` must equal the one the URL was signed for
   (as S3 does with a presigned PUT) -> else 403. The URL is not consumed.
3. `claim` consumes the URL's nonce atomically (an O_EXCL marker file), before
   any byte is read: of two requests racing with one URL exactly one goes on,
   the other gets 403. A URL carries at most one stored body, ever, so a
   leaked URL cannot be replayed. A body that did not land gives the URL
   back (`release`), so the client sends it again with the same URL: a
   dropped connection (400), a full disk (507, with Retry-After), another
   disk error (503), or a body of the wrong size (below).
4. The body must be exactly the announced size (a part: at most its size).
   A `Content-Length` over it -> 413, under it -> 400, both before the URL is
   claimed; otherwise the body is streamed to a temp file and refused with
   413 as soon as it goes over the size, or 400 when it ends short. Each
   answer names both sizes. Only a body of the right size is renamed into
   place (200).

A part of a multipart upload goes through the same steps with a part URL
(`upload` and `part` in its query): no Content-Type is checked (S3 binds none
to a part; the type was given when the upload started), and the body streams
into the upload's folder as `part-<n>`, replacing an earlier copy. An upload
that is no longer open (completed, dropped, swept) answers 404.

GET streams the file with a content type guessed from the key's extension,
404 if there is none, and headers that stop a browser from running uploaded
HTML or SVG in the app's origin.
"""

from __future__ import annotations

import asyncio
import errno
import logging

from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route

from store.blobs import BlobAccessDenied, BlobNotFound, BlobTooLarge, BlobTooSmall, LocalBlobStore

log = logging.getLogger("mifamilias.media")

_SAFE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "private",
}


# What to do next, for the refusals a client can mend by itself.
NEXT_STEP = {
    "url already used": "a body is already stored with this url; resumeUpload gives a fresh one",
    "url expired": "resumeUpload gives a fresh url",
}


def _denied(exc: BlobAccessDenied) -> Response:
    hint = NEXT_STEP.get(exc.reason)
    return PlainTextResponse(f"{exc.reason}: {hint}" if hint else exc.reason, status_code=403)


def _wrong_size(received: int | None, announced: int, is_part: bool) -> Response:
    """413 for a body over the announced size, 400 for one under it; the URL stays usable."""
    what = f"the part may have at most {announced}" if is_part else f"{announced} were announced"
    if received is None:
        return PlainTextResponse(f"the body is larger than announced: {what}; send it again to this url", 413)
    status = 413 if received > announced else 400
    return PlainTextResponse(f"the body has {received} bytes, but {what}; send it again to this url", status)


def _disk_error(error: OSError) -> Response:
    """The body did not land through no fault of the client's: it may send it
    again, with the same URL, later."""
    log.warning("a media PUT did not land: %s", error)
    if error.errno == errno.ENOSPC:
        return PlainTextResponse(
            "the server's disk is full; send the same request again later",
            status_code=507,
            headers={"Retry-After": "60"},
        )
    return PlainTextResponse(
        "the server could not store the body; send the same request again later",
        status_code=503,
        headers={"Retry-After": "10"},
    )


def media_routes(blobs: LocalBlobStore) -> list[Route]:
    async def put_media(request: Request) -> Response:
        key: str = request.path_params["key"]
        try:
            verified = blobs.verify("PUT", key, request.query_params)
        except BlobAccessDenied as exc:
            return _denied(exc)
        is_part = verified.part is not None
        if verified.size is None or (
            not is_part and request.headers.get("content-type") != verified.content_type
        ):
            return PlainTextResponse("content type does not match the url", status_code=403)
        declared = request.headers.get("content-length")
        if declared is not None and not declared.isdigit():
            return PlainTextResponse("bad content-length", status_code=400)
        # A body whose announced length is wrong is refused before the URL is
        # spent: the client sends the right one to the same URL.
        if declared is not None and (
            int(declared) > verified.size or (not is_part and int(declared) < verified.size)
        ):
            return _wrong_size(int(declared), verified.size, is_part)
        try:
            blobs.claim(verified)
        except BlobAccessDenied as exc:
            return _denied(exc)
        except OSError as error:
            return _disk_error(error)
        try:
            if is_part:
                await blobs.receive_part(verified, request.stream())
            else:
                await blobs.receive(key, request.stream(), verified.size, min_bytes=verified.size)
        except BlobTooLarge:
            blobs.release(verified)
            return _wrong_size(None, verified.size, is_part)
        except BlobTooSmall as short:
            blobs.release(verified)
            return _wrong_size(short.received, verified.size, is_part)
        except BlobNotFound:
            return PlainTextResponse("the upload is no longer open", status_code=404)
        except ClientDisconnect:
            blobs.release(verified)
            return PlainTextResponse("client disconnected", status_code=400)
        except OSError as error:
            blobs.release(verified)
            return _disk_error(error)
        return Response(status_code=200)

    async def get_media(request: Request) -> Response:
        key: str = request.path_params["key"]
        try:
            blobs.verify("GET", key, request.query_params)
        except BlobAccessDenied as exc:
            return _denied(exc)
        path = blobs.path_for(key)
        if not await asyncio.to_thread(path.is_file):
            return PlainTextResponse("not found", status_code=404)
        # FileResponse guesses the media type from the file name.
        return FileResponse(path, headers=_SAFE_HEADERS)

    return [
        Route("/media/{key:path}", put_media, methods=["PUT"]),
        Route("/media/{key:path}", get_media, methods=["GET"]),
    ]
