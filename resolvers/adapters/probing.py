"""Read what a media file holds with PyAV (libavformat), in a process of its own.

:func:`resolvers.adapters.media.probe` runs :func:`probe_child` in a child forked from a warm
forkserver (``av`` already imported there, so a probe costs a fork, not an interpreter start and
an import of libav), and kills the child when it takes too long: a hostile file can make a
demuxer spin, block (a FIFO) or crash, and none of that may reach the server. The child sends
(exit code, the fields of ``media.Probe`` as JSON, the reason) on a pipe and exits; a file
libavformat cannot open is :data:`EXIT_UNREADABLE` with the reason. Run as a script
(``python -I probing.py PATH``), the same probe prints the JSON on stdout instead.

Only headers are read (``avformat_open_input`` and ``avformat_find_stream_info``, as ``ffmpeg -i``
does). The display rotation of a video lives in side data that PyAV shows on decoded frames
only, so for a clip (not a still image) one frame of the first video stream is decoded, with
one thread and at most :data:`MAX_PACKETS_FOR_ROTATION` packets read. The child's address space
is capped at :data:`MEMORY_LIMIT_BYTES`.

This module imports nothing from the project (it also runs as a plain script) and imports
``av`` only in the child and the forkserver, so the server process never loads libav.
"""

from __future__ import annotations

import json
import resource
import sys
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from av.container import InputContainer
    from av.video.stream import VideoStream

__all__ = ["EXIT_UNREADABLE", "ProbeFields", "die_with", "is_image_format", "probe_child", "probe_file"]

EXIT_UNREADABLE = 2
MEMORY_LIMIT_BYTES = 1 << 30
MAX_PACKETS_FOR_ROTATION = 64

# Demuxers that read one picture (or an animation stored as a picture), not a clip.
_IMAGE_FORMATS = frozenset({"image2", "gif", "apng", "webp", "ico", "bmp", "tiff", "jpegxl_anim"})


class ProbeFields(TypedDict):
    """The fields of ``media.Probe``, as the child prints them."""

    has_video: bool
    has_audio: bool
    duration_seconds: float | None
    width: int | None
    height: int | None
    format_name: str | None
    video_codec: str | None
    audio_codec: str | None
    has_cover_art: bool


def is_image_format(format_name: str | None) -> bool:
    """True for libavformat's image demuxers: ``image2``, ``png_pipe``, ``jpeg_pipe``, ``gif``..."""
    if not format_name:
        return False
    return any(name in _IMAGE_FORMATS or name.endswith("_pipe") for name in format_name.split(","))


def _codec_name(name: str | None) -> str | None:
    return None if name in (None, "", "none") else name


def _rotation(container: InputContainer, stream: VideoStream) -> float:
    """The display rotation of the first decoded frame of ``stream``, in degrees (0 if none)."""
    import av
    from av.stream import Discard

    for other in container.streams:
        if other.index != stream.index:
            other.discard = Discard.all
    stream.codec_context.thread_count = 1
    try:
        for count, packet in enumerate(container.demux(stream), start=1):
            for frame in packet.decode():
                return float(frame.rotation)
            if count >= MAX_PACKETS_FOR_ROTATION:
                break
    except av.FFmpegError:
        pass  # damaged data after good headers: the headers are what the probe reports
    return 0.0


def probe_file(path: str) -> ProbeFields:
    """Open ``path`` and describe its streams. Raises ``av.FFmpegError`` if it cannot be opened."""
    import av
    from av.stream import Disposition

    # "file:" stops libavformat reading "a:b.mp4" as a protocol, and every other protocol.
    with av.open("file:" + path, mode="r") as container:
        format_name = container.format.name or None
        has_audio = has_video = has_cover_art = False
        audio_codec: str | None = None
        video: VideoStream | None = None
        for stream in container.streams:
            context = stream.codec_context
            name = _codec_name(context.codec.canonical_name) if context is not None else None
            if stream.type == "audio":
                has_audio = True
                audio_codec = audio_codec or name
            elif isinstance(stream, av.VideoStream):
                if stream.disposition & Disposition.attached_pic:
                    has_cover_art = True
                elif video is None:
                    video = stream
                    has_video = True

        width = height = None
        video_codec: str | None = None
        if video is not None and video.codec_context is not None:
            video_codec = _codec_name(video.codec_context.codec.canonical_name)
            width, height = video.codec_context.width or None, video.codec_context.height or None
            clip = width is not None and height is not None and not is_image_format(format_name)
            if clip and round(abs(_rotation(container, video))) % 180 == 90:
                width, height = height, width

        duration = container.duration / 1_000_000 if container.duration is not None else None
        return ProbeFields(
            has_video=has_video,
            has_audio=has_audio,
            duration_seconds=duration if duration is not None and duration > 0 else None,
            width=width,
            height=height,
            format_name=format_name,
            video_codec=video_codec,
            audio_codec=audio_codec,
            has_cover_art=has_cover_art,
        )


def _probed(path: str) -> tuple[int, str, str]:
    """(exit code, JSON fields, reason), in a child whose address space is capped."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    import av

    try:
        return 0, json.dumps(probe_file(path)), ""
    except av.FFmpegError as exc:
        return EXIT_UNREADABLE, "", str(exc)


# Media and speech work yields the CPU to the server: a long transcode or
# transcription on every core must not hold requests (niceness 10: such work
# gets about a tenth of a core the server wants).
BACKGROUND_NICENESS = 10


def in_background(pid: int = 0) -> None:
    """Lowers process `pid` (0: this one) to the background's CPU priority; a
    process already lower stays as it is."""
    import os

    try:
        current = os.getpriority(os.PRIO_PROCESS, pid)
        if current < BACKGROUND_NICENESS:
            os.setpriority(os.PRIO_PROCESS, pid, BACKGROUND_NICENESS)
    except (ProcessLookupError, PermissionError, AttributeError):
        pass  # gone already, or a platform without priorities: it runs as it is


def die_with(pid: int) -> None:
    """Ends this process as soon as process `pid` (the server) ends, from a watching thread.

    A child of the forkserver is not the server's child, so the kernel's parent-death
    signal cannot tie it to the server, and the forkserver itself stays up while any of
    its children does (each holds its liveness pipe): without this, a SIGKILLed server
    leaves its forkserver, its resource tracker and its idle photo processes for good.
    """
    import os
    import select
    import threading
    import time

    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)  # it is gone already
    except (OSError, AttributeError):
        handle = -1  # no pidfd here (an old kernel, or not Linux): look once a second instead

    def watch() -> None:
        if handle >= 0:
            select.select([handle], [], [])
        else:
            while _alive(pid):
                time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-server", daemon=True).start()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def probe_child(path: str, answer: Connection) -> None:
    """The forked child: probes ``path`` and sends the outcome on ``answer``."""
    answer.send(_probed(path))
    answer.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: probing.py PATH", file=sys.stderr)
        return 64
    code, fields, reason = _probed(argv[1])
    if code == 0:
        sys.stdout.write(fields)
    else:
        print(reason, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
