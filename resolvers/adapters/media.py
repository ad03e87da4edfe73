"""Media checks and conversions for uploaded family content.

Pure async functions: they read a local file and write local files, nothing else (no storage,
no GraphQL). :func:`probe` reads a file's streams with PyAV (libavformat) in a child forked
from a warm forkserver (:mod:`resolvers.adapters.probing`); video and audio are converted by the
ffmpeg binary shipped by ``imageio-ffmpeg``; photos go through Pillow in child processes.

Every probe (a forked child) and every ffmpeg run (a subprocess started with
:func:`asyncio.create_subprocess_exec`) is bounded by a timeout and killed when the timeout passes
or the awaiting task is cancelled.

Errors are :class:`MediaError`: ``str(error)`` is a short sentence fit to show a person,
``error.detail`` carries the PyAV/ffmpeg/Pillow diagnostics (stderr tail) for the logs.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import concurrent.futures.process
import contextlib
import functools
import json
import multiprocessing
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import imageio_ffmpeg
from PIL import Image, ImageOps, UnidentifiedImageError

from resolvers.adapters import photo_metadata, probing
from store.enums import ContentType

T = TypeVar("T")

__all__ = [
    "PHOTO_MAX_SIDE",
    "THUMBNAIL_MAX_SIDE",
    "VIDEO_MAX_SIDE",
    "MediaError",
    "PhotoOriginal",
    "Probe",
    "check_kind",
    "check_photo",
    "check_text",
    "photo_original",
    "probe",
    "transcode_audio",
    "transcode_photo",
    "transcode_video",
]

THUMBNAIL_MAX_SIDE = 320
PHOTO_MAX_SIDE = 2048
VIDEO_MAX_SIDE = 1280

PROBE_TIMEOUT_SECONDS = 30.0
THUMBNAIL_TIMEOUT_SECONDS = 60.0
VIDEO_TIMEOUT_SECONDS = 15 * 60.0
AUDIO_TIMEOUT_SECONDS = 5 * 60.0

# A video thumbnail is taken this far in, unless the clip is shorter than THUMBNAIL_MIN_DURATION,
# in which case the first frame is used.
THUMBNAIL_AT_SECONDS = 1.0
THUMBNAIL_MIN_DURATION = 2.0

VIDEO_CRF = 23
VIDEO_MAXRATE = "4M"
VIDEO_BUFSIZE = "8M"
AUDIO_BITRATE = "128k"
PHOTO_QUALITY = 85
# Larger photos fail before they are decoded: 40 MP is a 7,700 × 5,200 picture,
# more than any phone takes, and decodes in about 160 MB (RGBA).
MAX_PHOTO_PIXELS = 40_000_000
PHOTO_WORKERS = 2
_TEXT_CHUNK_BYTES = 1 << 16
_RESIZABLE_MODES = frozenset({"RGB", "RGBA", "L", "LA", "CMYK"})
THUMBNAIL_QUALITY = 80

_STDERR_HEAD_BYTES = 1 << 20  # output is read from the top
_STDERR_TAIL_BYTES = 16 << 10  # what we keep of the end for error details
_DETAIL_TAIL_CHARS = 4000


class MediaError(Exception):
    """A media file is unusable or could not be processed.

    ``message`` (also ``str(error)``) is short and meant for people; ``detail`` is for logs.
    """

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Probe:
    """What libavformat (through PyAV) found in a file.

    ``has_video`` counts only real picture streams: cover art attached to an audio file
    (``has_cover_art``) is not video. ``width``/``height`` are the display size of the first
    video stream (after any rotation stored in the file); for a still image they are the image
    size. ``format_name`` is libavformat's demuxer name, e.g. ``"mov,mp4,m4a,3gp,3g2,mj2"``,
    ``"png_pipe"``, ``"wav"``.
    """

    has_video: bool
    has_audio: bool
    duration_seconds: float | None
    width: int | None
    height: int | None
    format_name: str | None
    video_codec: str | None = None
    audio_codec: str | None = None
    has_cover_art: bool = False

    @property
    def is_still_image(self) -> bool:
        """True for files libavformat reads with an image demuxer (a single picture, not a clip)."""
        return probing.is_image_format(self.format_name)


# --------------------------------------------------------------------------------------------
# ffmpeg subprocesses


@functools.cache
def _ffmpeg_exe() -> str:
    # imageio-ffmpeg honours IMAGEIO_FFMPEG_EXE, then its bundled binary, then the system one.
    exe: str = imageio_ffmpeg.get_ffmpeg_exe()
    return exe


def _ffmpeg_path(path: Path) -> str:
    # "file:" stops ffmpeg reading a name such as "-x.mp4" as an option or "a:b.mp4" as a protocol.
    return "file:" + str(path)


async def _collect(stream: asyncio.StreamReader) -> str:
    """Read a stream to its end, keeping the head and the tail when it is very long."""
    head = bytearray()
    tail = bytearray()
    dropped = False
    while chunk := await stream.read(65536):
        room = _STDERR_HEAD_BYTES - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            tail += chunk
            if len(tail) > _STDERR_TAIL_BYTES:
                del tail[: len(tail) - _STDERR_TAIL_BYTES]
                dropped = True
    text = bytes(head).decode("utf-8", "replace")
    if dropped:
        text += "\n[...]\n"
    return text + bytes(tail).decode("utf-8", "replace")


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _DETAIL_TAIL_CHARS else "[...]" + text[-_DETAIL_TAIL_CHARS:]


async def _nothing() -> str:
    return ""


async def _run_process(
    argv: Sequence[str], *, timeout_seconds: float, what: str, tool: str, stdout: bool = False
) -> tuple[int, str, str]:
    """Run ``argv``; return (exit code, stdout, stderr). Killed on timeout or cancellation.

    stdout is read only when ``stdout`` is true (else it goes to /dev/null).
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise MediaError(f"{what} failed: the media tools are unavailable", detail=repr(exc)) from exc
    probing.in_background(proc.pid)
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(timeout_seconds):
            out, err = await asyncio.gather(
                _collect(proc.stdout) if proc.stdout is not None else _nothing(), _collect(proc.stderr)
            )
            code = await proc.wait()
    except TimeoutError:
        raise MediaError(
            f"{what} took too long and was stopped",
            detail=f"{tool} timed out after {timeout_seconds:g}s: {' '.join(argv)}",
        ) from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return code, out, err


async def _run_ffmpeg(args: Sequence[str], *, timeout_seconds: float, what: str) -> tuple[int, str]:
    """Run ffmpeg with ``args``; return (exit code, stderr). Killed on timeout or cancellation."""
    argv = [_ffmpeg_exe(), "-hide_banner", "-nostdin", *args]
    code, _, stderr = await _run_process(argv, timeout_seconds=timeout_seconds, what=what, tool="ffmpeg")
    return code, stderr


def _missing_outputs(outputs: Sequence[Path]) -> list[Path]:
    return [p for p in outputs if not p.is_file() or p.stat().st_size == 0]


async def _run_ffmpeg_to(
    args: Sequence[str], outputs: Sequence[Path], *, timeout_seconds: float, what: str, failure: str
) -> None:
    """Run an ffmpeg conversion that must produce ``outputs``; remove them if it does not."""
    try:
        code, stderr = await _run_ffmpeg(args, timeout_seconds=timeout_seconds, what=what)
        missing = _missing_outputs(outputs)
        if code != 0 or missing:
            detail = f"ffmpeg exit code {code}; missing outputs {[str(p) for p in missing]}\n{_tail(stderr)}"
            raise MediaError(failure, detail=detail)
    except BaseException:
        for out in outputs:
            out.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------
# probing (PyAV, in a child process: resolvers/adapters/probing.py)

_PROBE_FIELDS = frozenset(probing.ProbeFields.__annotations__)


# multiprocessing starts each child of the forkserver by running the parent's
# main module again as `__mp_main__` ("safe importing of the main module"). The
# server's main is app.py, whose imports are the whole server, and a photo takes
# two children: 1.5 s of the machine's CPU a photo, 0.06 s once the children
# skip it (2026-12-05, five photos each way). The children need none of it: their
# work is in this module, which the forkserver preloads. CPython's own remedy,
# "__main__" in the preload list, does nothing in 3.11 (the forkserver is never
# given the main module's path). So the forkserver is told the path, in this
# variable, and takes it as its own main module's: a child whose main module
# already has that path does not run it again.
FORKSERVER_MAIN = "MIFAMILIAS_FORKSERVER_MAIN"


def _main_path() -> str | None:
    """The main module's path as multiprocessing sends it to a child."""
    path = getattr(sys.modules["__main__"], "__file__", None)
    if path is None:
        return None
    # Relative to the directory the process started in, as multiprocessing takes it.
    started_in = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or os.getcwd()
    return os.path.normpath(os.path.join(started_in, path))


def _take_the_servers_main() -> None:
    """In the forkserver (whose main module, multiprocessing's `-c` script, has
    no file): the server's main module path becomes its own, for its children."""
    main, path = sys.modules["__main__"], os.environ.get(FORKSERVER_MAIN)
    if path and getattr(main, "__file__", None) is None:
        main.__file__ = path


_take_the_servers_main()


@functools.cache
def _forkserver() -> Any:
    """The process's one forkserver (multiprocessing has one per process), shared by
    probes and photos, with what their children need imported once: a child is a
    fork of a warm interpreter, not a fresh one (nor one that imports the server)."""
    main = _main_path()
    if main is not None:
        os.environ[FORKSERVER_MAIN] = main  # the forkserver starts with this environment
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "pillow_heif", "av"])
    return context


def _probe_target() -> Callable[[str, Any], None]:
    """What the probe's child runs (tests give it another importable function)."""
    return probing.probe_child


def _probe_with_server(server: int, target: Callable[[str, Any], None], path: str, answer: Any) -> None:
    """The probe's child: ends with the server, yields the CPU to it, then probes."""
    probing.die_with(server)
    probing.in_background()
    target(path, answer)


def _start_probe_child(path: Path, answer: Any) -> Any:
    """Starts the probe's child (blocking: it talks to the forkserver); returns it."""
    process = _forkserver().Process(
        target=_probe_with_server, args=(os.getpid(), _probe_target(), str(path), answer), daemon=True
    )
    process.start()
    return process


async def _probe_in_child(path: Path, *, timeout_seconds: float) -> tuple[int, str, str]:
    """Run the probe in a forked child; return (exit code, JSON fields, reason).
    Killed on timeout or cancellation, as `_run_process` kills its commands."""
    receive, answer = _forkserver().Pipe(duplex=False)
    starting = asyncio.ensure_future(asyncio.to_thread(_start_probe_child, path, answer))
    try:
        process = await asyncio.shield(starting)
    except asyncio.CancelledError:
        # Cancelled while the child was starting: it is stopped as soon as it
        # has started, not left running on its own.
        with contextlib.suppress(Exception):
            started = await starting
            with contextlib.suppress(ProcessLookupError):
                started.kill()
            await asyncio.to_thread(started.join)
        receive.close()
        raise
    except OSError as exc:
        receive.close()
        unavailable = "reading the file failed: the media tools are unavailable"
        raise MediaError(unavailable, detail=repr(exc)) from exc
    finally:
        answer.close()
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(process.sentinel, on_exit)
    try:
        async with asyncio.timeout(timeout_seconds):
            await exited
    except TimeoutError:
        raise MediaError(
            "reading the file took too long and was stopped",
            detail=f"probe timed out after {timeout_seconds:g}s: {path}",
        ) from None
    finally:
        loop.remove_reader(process.sentinel)
        if process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await asyncio.to_thread(process.join)
        try:
            outcome = receive.recv() if receive.poll() else None
        except EOFError:  # the child died before it answered
            outcome = None
        receive.close()
    code = process.exitcode
    if code == 0 and isinstance(outcome, tuple) and len(outcome) == 3:
        return outcome[0], outcome[1], outcome[2]
    return (code if code else 1), "", "the probe ended without an answer"


def _probe_from_json(text: str) -> Probe | None:
    try:
        fields = json.loads(text)
    except ValueError:
        return None
    if not isinstance(fields, dict) or fields.keys() != _PROBE_FIELDS:
        return None
    return Probe(**fields)


async def probe(path: Path, *, timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> Probe:
    """Read the streams of ``path`` with PyAV, in a child process killed after ``timeout_seconds``.

    Raises MediaError for missing and unreadable files and for files with nothing to show or play.
    """
    if not await asyncio.to_thread(path.is_file):
        raise MediaError("the file could not be found", detail=str(path))
    code, stdout, stderr = await _probe_in_child(path, timeout_seconds=timeout_seconds)
    result = _probe_from_json(stdout) if code == 0 else None
    if result is None:
        raise MediaError(
            "the file is not a readable audio, video or image file",
            detail=f"probe exit code {code}\n{_tail(stderr)}",
        )
    if not (result.has_video or result.has_audio or result.has_cover_art):
        raise MediaError("the file contains no audio, video or picture", detail=f"probe found {result}")
    if not (result.is_still_image or _is_media_container(result.format_name)):
        raise MediaError(
            "the file is not in an audio or video format we accept", detail=f"format {result.format_name}"
        )
    return result


# The containers a phone or camera writes. Anything else is refused before ffmpeg
# converts it: a playlist (HLS, concat, ...) would make ffmpeg read other files of
# the server's into the output that relatives then download.
MEDIA_CONTAINERS = frozenset(
    {
        "mov", "mp4", "m4a", "3gp", "3g2", "mj2", "matroska", "webm", "avi", "mpegts", "flv",
        "asf", "ogg", "wav", "w64", "mp3", "flac", "aac", "amr", "aiff", "caf", "wv",
    }
)  # fmt: skip


def _is_media_container(format_name: str | None) -> bool:
    return bool(format_name) and all(name in MEDIA_CONTAINERS for name in (format_name or "").split(","))


# --------------------------------------------------------------------------------------------
# kind checks


async def check_kind(probe: Probe, content_type: str) -> None:
    """Check that a probed file fits the declared content type; raise MediaError if not.

    VIDEO needs a real (moving) video stream with a duration: a still image is not a video.
    AUDIO needs an audio stream and no real video (cover art is fine). PHOTO needs a picture
    and no sound; Pillow has the final word in :func:`check_photo` / :func:`transcode_photo`.
    """
    kind = content_type.strip().upper()
    if kind == ContentType.VIDEO:
        if not probe.has_video:
            if probe.has_audio:
                raise MediaError("the file is not a video: it only has sound")
            raise MediaError("the file is not a video: no video stream found")
        if probe.is_still_image and (probe.duration_seconds is None or probe.duration_seconds < 0.1):
            raise MediaError("the file is not a video: it is a still image")
        if probe.duration_seconds is None:
            raise MediaError("the file is not a video: it has no duration")
    elif kind == ContentType.AUDIO:
        if not probe.has_audio:
            raise MediaError("the file is not audio: no audio stream found")
        if probe.has_video:
            raise MediaError("the file is not audio: it contains video, upload it as a video")
    elif kind == ContentType.PHOTO:
        if probe.has_audio:
            raise MediaError("the file is not a photo: it contains sound")
        if not probe.has_video or probe.width is None or probe.height is None:
            raise MediaError("the file is not a photo: no picture found")
        if not probe.is_still_image and probe.duration_seconds is not None:
            raise MediaError("the file is not a photo: it is a video")
    elif kind == ContentType.TEXT:
        raise MediaError("text posts do not carry a media file")
    else:
        raise MediaError(f"unknown content type {content_type!r}")


# --------------------------------------------------------------------------------------------
# video and audio


def _even_fit_filter(max_side: int) -> str:
    """Square the pixels, then fit in max_side x max_side (never upscaling), even dimensions."""
    return (
        "scale=w='trunc(iw*sar/2)*2':h='trunc(ih/2)*2',setsar=1,"
        f"scale=w='min({max_side},iw)':h='min({max_side},ih)'"
        ":force_original_aspect_ratio=decrease:force_divisible_by=2"
    )


def _thumb_fit_filter(max_side: int) -> str:
    return (
        "scale=w='trunc(iw*sar)':h=ih,setsar=1,"
        f"scale=w='min({max_side},iw)':h='min({max_side},ih)':force_original_aspect_ratio=decrease"
    )


async def _video_thumbnail(src: Path, dst_jpg: Path, at_seconds: float) -> None:
    def args(at: float) -> list[str]:
        seek = ["-ss", f"{at:.3f}"] if at > 0 else []
        return [
            "-loglevel", "error", "-nostats", "-y",
            *seek, "-i", _ffmpeg_path(src),
            "-map", "0:V:0", "-an", "-sn", "-dn", "-map_metadata", "-1",
            "-vf", _thumb_fit_filter(THUMBNAIL_MAX_SIDE),
            "-frames:v", "1", "-c:v", "mjpeg", "-q:v", "3", "-f", "image2", "-update", "1",
            _ffmpeg_path(dst_jpg),
        ]  # fmt: skip

    what, failure = "making the thumbnail", "the video thumbnail could not be made"
    try:
        await _run_ffmpeg_to(
            args(at_seconds), [dst_jpg], timeout_seconds=THUMBNAIL_TIMEOUT_SECONDS, what=what, failure=failure
        )
    except MediaError:
        if at_seconds <= 0:
            raise
        # The stated duration can be wrong; the first frame is always there.
        await _run_ffmpeg_to(
            args(0.0), [dst_jpg], timeout_seconds=THUMBNAIL_TIMEOUT_SECONDS, what=what, failure=failure
        )


def _leaf_exceptions(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaf_exceptions(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


async def transcode_video(
    src: Path,
    dst_mp4: Path,
    dst_thumb_jpg: Path,
    *,
    probed: Probe | None = None,
    timeout_seconds: float = VIDEO_TIMEOUT_SECONDS,
) -> None:
    """Convert a video to web MP4 (H.264 yuv420p ≤ VIDEO_MAX_SIDE, AAC, faststart) + JPEG thumbnail.

    The thumbnail is at most THUMBNAIL_MAX_SIDE on its long side, taken THUMBNAIL_AT_SECONDS in
    (first frame for clips shorter than THUMBNAIL_MIN_DURATION). Both run concurrently.
    Pass ``probed`` to skip probing ``src`` again. Metadata (location, device) is not copied.
    """
    info = probed if probed is not None else await probe(src)
    if not info.has_video:
        raise MediaError("the file is not a video: no video stream found")
    audio = (
        ["-map", "0:a:0", "-c:a", "aac", "-b:a", AUDIO_BITRATE]
        if info.has_audio
        else ["-an"]
    )  # fmt: skip
    video_args = [
        "-loglevel", "error", "-nostats", "-y",
        "-i", _ffmpeg_path(src),
        "-map", "0:V:0", *audio, "-sn", "-dn", "-map_metadata", "-1", "-map_chapters", "-1",
        "-vf", _even_fit_filter(VIDEO_MAX_SIDE) + ",format=yuv420p",
        "-c:v", "libx264", "-preset", "veryfast", "-crf", str(VIDEO_CRF),
        "-maxrate", VIDEO_MAXRATE, "-bufsize", VIDEO_BUFSIZE, "-pix_fmt", "yuv420p",
        "-max_muxing_queue_size", "4096",
        "-movflags", "+faststart", "-f", "mp4",
        _ffmpeg_path(dst_mp4),
    ]  # fmt: skip
    duration = info.duration_seconds
    at = THUMBNAIL_AT_SECONDS if duration is not None and duration >= THUMBNAIL_MIN_DURATION else 0.0

    try:
        # A TaskGroup: when one part fails, the other is cancelled (and its ffmpeg killed).
        async with asyncio.TaskGroup() as group:
            group.create_task(
                _run_ffmpeg_to(
                    video_args,
                    [dst_mp4],
                    timeout_seconds=timeout_seconds,
                    what="converting the video",
                    failure="the video could not be converted",
                )
            )
            group.create_task(_video_thumbnail(src, dst_thumb_jpg, at))
    except BaseException as exc:
        for out in (dst_mp4, dst_thumb_jpg):
            out.unlink(missing_ok=True)
        if isinstance(exc, BaseExceptionGroup):
            leaves = _leaf_exceptions(exc)
            raise next((e for e in leaves if isinstance(e, MediaError)), leaves[0]) from None
        raise


async def transcode_audio(
    src: Path,
    dst_m4a: Path,
    *,
    probed: Probe | None = None,
    timeout_seconds: float = AUDIO_TIMEOUT_SECONDS,
) -> None:
    """Convert the first audio stream of ``src`` to AAC in an .m4a (MP4 audio) file, faststart."""
    info = probed if probed is not None else await probe(src)
    if not info.has_audio:
        raise MediaError("the file is not audio: no audio stream found")
    args = [
        "-loglevel", "error", "-nostats", "-y",
        "-i", _ffmpeg_path(src),
        "-map", "0:a:0", "-vn", "-sn", "-dn", "-map_metadata", "-1",
        "-c:a", "aac", "-b:a", AUDIO_BITRATE,
        "-movflags", "+faststart", "-f", "ipod",
        _ffmpeg_path(dst_m4a),
    ]  # fmt: skip
    await _run_ffmpeg_to(
        args,
        [dst_m4a],
        timeout_seconds=timeout_seconds,
        what="converting the audio",
        failure="the audio could not be converted",
    )


# --------------------------------------------------------------------------------------------
# photos


def _open_image(src: Path, *, draft_size: tuple[int, int] | None = None) -> Image.Image:
    """Open and fully decode an image; ``draft_size`` lets JPEG decode at a reduced scale.

    The pixel count is read from the header and checked before anything is
    decoded: a photo over ``MAX_PHOTO_PIXELS`` fails at once, whatever its file size.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(src)
            width, height = img.size
            if width * height > MAX_PHOTO_PIXELS:
                img.close()
                raise MediaError(
                    f"the photo is {width}×{height} pixels; at most "
                    f"{MAX_PHOTO_PIXELS // 1_000_000} megapixels are accepted"
                )
            if draft_size is not None:
                img.draft(None, draft_size)
            img.load()
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaError("the photo is too large", detail=repr(exc)) from exc
    except UnidentifiedImageError as exc:
        raise MediaError("the file is not a photo: the image could not be read", detail=repr(exc)) from exc
    except (OSError, ValueError, SyntaxError) as exc:  # truncated / corrupt image data
        raise MediaError("the photo is damaged and could not be read", detail=repr(exc)) from exc
    return img


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        img = img.convert("I").point(lambda v: v * (1 / 256)).convert("L")  # 16-bit grey to 8-bit
    return img.convert("RGB")


def _check_photo_sync(src: Path) -> tuple[int, int]:
    with _open_image(src) as img:
        oriented = ImageOps.exif_transpose(img)
        return oriented.size


def _transcode_photo_sync(src: Path, dst_jpg: Path, dst_thumb_jpg: Path) -> None:
    # A square draft box keeps every side >= PHOTO_MAX_SIDE whatever the EXIF orientation.
    with _open_image(src, draft_size=(PHOTO_MAX_SIDE, PHOTO_MAX_SIDE)) as opened:
        try:
            # Shrink first (reduce() steps, then a resampling filter), so the
            # rotation and colour conversions below work on the small picture.
            # Palette and 16-bit pictures resize well only once converted.
            if opened.mode in _RESIZABLE_MODES:
                opened.thumbnail((PHOTO_MAX_SIDE, PHOTO_MAX_SIDE), Image.Resampling.LANCZOS, reducing_gap=3.0)
            img = ImageOps.exif_transpose(opened)
            icc = img.info.get("icc_profile") if img.mode in ("RGB", "RGBA", "P") else None
            img = _to_rgb(img)
            img.thumbnail((PHOTO_MAX_SIDE, PHOTO_MAX_SIDE), Image.Resampling.LANCZOS)
            # Nothing of the source's metadata but its colour profile: no EXIF, no XMP, no comment.
            img.save(
                dst_jpg,
                "JPEG",
                quality=PHOTO_QUALITY,
                optimize=True,
                progressive=True,
                icc_profile=icc,
                comment=b"",
            )
            thumb = img.copy()
            thumb.thumbnail((THUMBNAIL_MAX_SIDE, THUMBNAIL_MAX_SIDE), Image.Resampling.LANCZOS)
            thumb.save(
                dst_thumb_jpg, "JPEG", quality=THUMBNAIL_QUALITY, optimize=True, icc_profile=icc, comment=b""
            )
        except MediaError:
            raise
        except (OSError, ValueError, SyntaxError) as exc:
            for out in (dst_jpg, dst_thumb_jpg):
                out.unlink(missing_ok=True)
            raise MediaError("the photo could not be converted", detail=repr(exc)) from exc


@dataclass(frozen=True)
class PhotoOriginal:
    """What :func:`photo_original` found in a photo's original file.

    ``captured_at`` is EXIF's DateTimeOriginal in ISO 8601, with the camera's UTC
    offset (OffsetTimeOriginal) when it recorded one and without any offset when
    it did not; ``stripped`` says that location metadata was found and a copy
    without it was written.
    """

    captured_at: str | None
    stripped: bool


_EXIF_IFD = 0x8769
_DATE_TIME_ORIGINAL = 0x9003
_OFFSET_TIME_ORIGINAL = 0x9011
_SUBSEC_TIME_ORIGINAL = 0x9291
_OFFSET_RE = re.compile(r"(?P<sign>[+-])(?P<h>\d\d):(?P<m>\d\d)")


def _exif_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return value.strip("\x00 ") if isinstance(value, str) else None


def _captured_at(exif: Image.Exif) -> str | None:
    ifd = exif.get_ifd(_EXIF_IFD)
    text = _exif_text(ifd.get(_DATE_TIME_ORIGINAL))
    if not text:
        return None
    try:
        moment = datetime.strptime(text, "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None  # "0000:00:00 00:00:00", blanks, or any other unreadable date
    subsec = _exif_text(ifd.get(_SUBSEC_TIME_ORIGINAL))
    if subsec and subsec.isdigit():
        moment = moment.replace(microsecond=int(subsec[:6].ljust(6, "0")))
    offset = _OFFSET_RE.fullmatch(_exif_text(ifd.get(_OFFSET_TIME_ORIGINAL)) or "")
    if offset is not None and int(offset["h"]) < 24 and int(offset["m"]) < 60:
        delta = timedelta(hours=int(offset["h"]), minutes=int(offset["m"]))
        moment = moment.replace(tzinfo=timezone(-delta if offset["sign"] == "-" else delta))
    return moment.isoformat()


def _has_location(path: Path) -> bool:
    """Whether Pillow still finds a location in the file's EXIF or XMP."""
    with Image.open(path) as img:
        exif = img.getexif()
        if photo_metadata.GPS_IFD_TAG in exif or exif.get_ifd(photo_metadata.GPS_IFD_TAG):
            return True
        xmp = img.info.get("xmp") or img.info.get("XML:com.adobe.xmp")
        if isinstance(xmp, str):
            xmp = xmp.encode("utf-8", "replace")
        return isinstance(xmp, bytes) and photo_metadata.LOCATION_XMP.search(xmp) is not None


def _photo_original_sync(src: Path, dst: Path | None) -> PhotoOriginal:
    try:
        with Image.open(src) as img:  # the header and metadata only: nothing is decoded
            captured_at = _captured_at(img.getexif())
        if dst is None:
            return PhotoOriginal(captured_at, stripped=False)
        data = bytearray(src.stat().st_size)  # read once, edited in place
        with src.open("rb") as stream:
            stream.readinto(data)
        stripped = photo_metadata.strip_location(data)
        if stripped:
            dst.write_bytes(data)
        if _has_location(dst if stripped else src):
            dst.unlink(missing_ok=True)
            raise MediaError("the location could not be removed from the photo")
    except MediaError:
        raise
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError("the photo's metadata could not be read", detail=repr(exc)) from exc
    return PhotoOriginal(captured_at, stripped)


def _check_text_sync(src: Path) -> None:
    """UTF-8, checked while reading: memory stays one chunk, whatever the size."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with src.open("rb") as stream:
            while chunk := stream.read(_TEXT_CHUNK_BYTES):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise MediaError("the file is not UTF-8 text", detail=repr(exc)) from exc


@functools.cache
def _photo_pool() -> concurrent.futures.ProcessPoolExecutor:
    """Photos decode in child processes, one photo per child: the decoder's
    memory goes back to the system when the child exits, and a crash in a
    codec cannot take the server with it."""
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=PHOTO_WORKERS,
        mp_context=_forkserver(),
        max_tasks_per_child=1,
        initializer=_start_photo_worker,
        initargs=(os.getpid(),),
    )


def _start_photo_worker(server: int) -> None:
    """Each photo process ends with the server (`server`, its pid), and reads HEIF/HEIC
    too (iPhone photos). pillow-heif applies the file's own rotation while decoding and
    sets the EXIF orientation it hands on to 1, so ``ImageOps.exif_transpose`` turns such
    a photo only once. It yields the CPU to the server."""
    probing.die_with(server)
    probing.in_background()
    import pillow_heif

    pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)


def close_photo_pool() -> None:
    """Stops the photo processes, if any; the next photo starts new ones. For a
    process that made photos before it serves (`./dev demo`): a pool left from
    then is reported as leaked semaphores at exit."""
    if _photo_pool.cache_info().currsize:
        _photo_pool().shutdown()
        _photo_pool.cache_clear()


async def _in_photo_process(function: Callable[..., T], *args: Any) -> T:
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_photo_pool(), function, *args)
    except concurrent.futures.process.BrokenProcessPool as exc:
        _photo_pool.cache_clear()
        raise MediaError("the photo could not be processed", detail=repr(exc)) from exc


async def check_text(src: Path) -> None:
    """Check that ``src`` is UTF-8 text, off the event loop and in bounded memory."""
    await asyncio.to_thread(_check_text_sync, src)


async def check_photo(src: Path) -> tuple[int, int]:
    """Check that Pillow can read ``src`` as an image; return its (width, height) upright."""
    return await _in_photo_process(_check_photo_sync, src)


async def transcode_photo(src: Path, dst_jpg: Path, dst_thumb_jpg: Path) -> None:
    """Convert a photo to an upright RGB JPEG ≤ PHOTO_MAX_SIDE and a ≤ THUMBNAIL_MAX_SIDE thumbnail.

    EXIF orientation is applied; EXIF itself (location, device) is not copied; an ICC colour
    profile is kept. Transparent areas become white. Never upscales.
    """
    await _in_photo_process(_transcode_photo_sync, src, dst_jpg, dst_thumb_jpg)


async def photo_original(src: Path, stripped: Path | None) -> PhotoOriginal:
    """Reads the capture time of a photo and, given ``stripped``, writes there a copy of
    ``src`` without its location metadata (only when it has some: see ``.stripped``).

    The copy differs from ``src`` in the location bytes alone (GPS, XMP and IPTC
    location; see :mod:`resolvers.adapters.photo_metadata`): its pixels are not encoded
    again. Raises MediaError if Pillow still finds a location in what would be stored.
    """
    return await _in_photo_process(_photo_original_sync, src, stripped)
