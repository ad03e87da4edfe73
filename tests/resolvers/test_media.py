"""Real-behaviour tests for resolvers.adapters.media: real ffmpeg runs, real Pillow files."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from PIL import Image

from resolvers.adapters import media
from resolvers.adapters.media import (
    PHOTO_MAX_SIDE,
    THUMBNAIL_MAX_SIDE,
    VIDEO_MAX_SIDE,
    MediaError,
    check_kind,
    check_photo,
    probe,
    transcode_audio,
    transcode_photo,
    transcode_video,
)
from resolvers.adapters.probing import BACKGROUND_NICENESS
from tests import media_factory as mf


@pytest.fixture(scope="module", autouse=True)
def photo_processes() -> Iterator[None]:
    """These tests call the media functions without an app: the photo processes
    they start are stopped here, as an app stops them when it ends."""
    yield
    media.close_photo_pool()


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Source media made once for the module (the slow part is ffmpeg start-up)."""
    d = tmp_path_factory.mktemp("media-src")
    return {
        "tone_video": mf.make_video_with_tone(d),
        "silent_video": mf.make_silent_video(d),
        "wide_video": mf.make_silent_video(d, "wide.mp4", size=(1600, 900), seconds=0.2),
        "audio": mf.make_audio_clip(d),
        "audio_cover": mf.make_audio_with_cover(d),
        "png": mf.make_png(d),
        "big_png": mf.make_png(d, size=(4000, 3000)),
        "rotated_jpg": mf.make_jpeg_with_orientation(d, size=(800, 600), orientation=6),
        "garbage": mf.make_garbage(d, "garbage.mp4"),
    }


def _exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _rgb(img: Image.Image, xy: tuple[int, int]) -> tuple[int, int, int]:
    pixel = img.getpixel(xy)
    assert isinstance(pixel, tuple) and len(pixel) == 3
    return (int(pixel[0]), int(pixel[1]), int(pixel[2]))


def _jpeg_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as img:
        assert img.format == "JPEG"
        return img.size


# ---------------------------------------------------------------------------------------------- probe


async def test_probe_video_with_tone(src: dict[str, Path]) -> None:
    p = await probe(src["tone_video"])
    assert p.has_video and p.has_audio
    assert (p.width, p.height) == (320, 240)
    assert p.duration_seconds == pytest.approx(1.0, abs=0.1)
    assert (p.video_codec, p.audio_codec) == ("h264", "aac")
    assert p.format_name is not None and "mp4" in p.format_name
    assert not p.has_cover_art and not p.is_still_image


async def test_probe_silent_video(src: dict[str, Path]) -> None:
    p = await probe(src["silent_video"])
    assert p.has_video and not p.has_audio
    assert p.audio_codec is None
    assert (p.width, p.height) == (320, 240)


async def test_probe_audio_clip(src: dict[str, Path]) -> None:
    p = await probe(src["audio"])
    assert p.has_audio and not p.has_video
    assert p.width is None and p.height is None and p.video_codec is None
    assert p.audio_codec == "pcm_s16le"
    assert p.format_name == "wav"
    assert p.duration_seconds == pytest.approx(1.0, abs=0.05)


async def test_probe_audio_with_cover_art_is_not_video(src: dict[str, Path]) -> None:
    p = await probe(src["audio_cover"])
    assert p.has_audio and p.audio_codec == "mp3"
    assert p.has_cover_art and not p.has_video
    await check_kind(p, "AUDIO")
    with pytest.raises(MediaError, match="not a video"):
        await check_kind(p, "VIDEO")


async def test_probe_png_is_still_image(src: dict[str, Path]) -> None:
    p = await probe(src["png"])
    assert p.has_video and not p.has_audio and p.is_still_image
    assert (p.width, p.height, p.video_codec) == (800, 600, "png")
    assert p.duration_seconds is None


async def test_probe_garbage_raises(src: dict[str, Path]) -> None:
    with pytest.raises(MediaError) as info:
        await probe(src["garbage"])
    assert str(info.value) == "the file is not a readable audio, video or image file"
    assert info.value.detail  # ffmpeg's complaint, for the logs only
    assert "ffmpeg" not in str(info.value) and "\n" not in str(info.value)


async def test_probe_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="could not be found"):
        await probe(tmp_path / "nope.mp4")


async def test_probe_timeout_kills_and_raises(src: dict[str, Path]) -> None:
    with pytest.raises(MediaError, match="took too long") as info:
        await probe(src["tone_video"], timeout_seconds=0.001)
    assert info.value.detail is not None and "timed out" in info.value.detail


@pytest.mark.parametrize(
    ("degrees", "size"), [(90, (240, 320)), (-90, (240, 320)), (270, (240, 320)), (180, (320, 240))]
)
async def test_probe_reports_display_size_of_rotated_video(
    src: dict[str, Path], tmp_path: Path, degrees: int, size: tuple[int, int]
) -> None:
    rotated = mf.make_rotated_video(tmp_path, src["tone_video"], degrees)
    p = await probe(rotated)
    assert (p.width, p.height) == size
    assert p.has_video and p.has_audio and not p.is_still_image
    assert (p.video_codec, p.audio_codec) == ("h264", "aac")


async def test_probe_size_of_rotated_video_is_the_size_ffmpeg_transcodes_to(
    src: dict[str, Path], tmp_path: Path
) -> None:
    rotated = mf.make_rotated_video(tmp_path, src["tone_video"], 90)
    before = await probe(rotated)
    out, thumb = tmp_path / "out.mp4", tmp_path / "thumb.jpg"
    await transcode_video(rotated, out, thumb, probed=before)
    after = await probe(out)  # ffmpeg turned the picture upright; no rotation is left in the file
    assert (before.width, before.height) == (after.width, after.height) == (240, 320)
    assert _jpeg_size(thumb) == (240, 320)


async def test_probe_m4a_with_cover_art_is_not_video(tmp_path: Path) -> None:
    p = await probe(mf.make_audio_with_cover(tmp_path, "cover.m4a"))
    assert p.has_audio and p.audio_codec == "aac"
    assert p.has_cover_art and not p.has_video
    assert p.width is None and p.height is None and p.video_codec is None
    assert p.format_name == "mov,mp4,m4a,3gp,3g2,mj2"


async def test_probe_jpeg_is_still_image_at_its_stored_size(src: dict[str, Path]) -> None:
    # EXIF orientation is Pillow's business (check_photo, transcode_photo), not the probe's.
    p = await probe(src["rotated_jpg"])
    assert p.has_video and not p.has_audio and p.is_still_image
    assert (p.width, p.height, p.video_codec) == (800, 600, "mjpeg")
    assert p.format_name == "image2"


async def test_probe_truncated_video_raises(src: dict[str, Path], tmp_path: Path) -> None:
    # Without faststart the index (moov) is at the end: the first half has no index.
    half = mf.make_truncated(tmp_path, src["silent_video"], "half.mp4")
    with pytest.raises(MediaError, match=_exactly("the file is not a readable audio, video or image file")):
        await probe(half)


async def test_probe_of_a_file_without_media_raises(tmp_path: Path) -> None:
    srt = tmp_path / "subtitles.srt"
    srt.write_text("1\n00:00:00,000 --> 00:00:01,000\nhola\n")
    with pytest.raises(MediaError, match=_exactly("the file contains no audio, video or picture")):
        await probe(srt)


async def test_a_playlist_pointing_at_other_files_is_refused_before_ffmpeg_reads_them(
    src: dict[str, Path], tmp_path: Path
) -> None:
    # An HLS playlist is a video ffmpeg would happily convert, reading the segments it
    # names from the server's own disk: a way to copy the server's files into a video.
    segment = tmp_path / "secret.ts"
    mf._ffmpeg("-i", str(src["tone_video"]), "-c", "copy", "-f", "mpegts", str(segment))
    text = f"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:1.0,\n{segment}\n#EXT-X-ENDLIST\n"
    assert (await probe(segment)).format_name == "mpegts"  # the segment alone is fine
    # Named as the pipeline names an original, libav does not take it for a playlist...
    original = tmp_path / "original"
    original.write_text(text)
    with pytest.raises(MediaError, match=_exactly("the file is not a readable audio, video or image file")):
        await probe(original)
    # ...and where it would (a name that says m3u8), the container is refused.
    playlist = tmp_path / "upload.m3u8"
    playlist.write_text(text)
    with pytest.raises(MediaError, match=_exactly("the file is not in an audio or video format we accept")):
        await probe(playlist)


class _Children:
    """Records the probe's child processes (multiprocessing.Process), in the order started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: asyncio.Queue[Any] = asyncio.Queue()
        real = media._start_probe_child
        loop = asyncio.get_running_loop()

        def recording(path: Path, answer: Any) -> Any:
            process = real(path, answer)
            loop.call_soon_threadsafe(self.started.put_nowait, process)
            return process

        monkeypatch.setattr(media, "_start_probe_child", recording)


def _probe_reads(monkeypatch: pytest.MonkeyPatch, other: Path) -> None:
    """Make the probe's child read ``other`` instead of the file it was given."""
    start = media._start_probe_child
    monkeypatch.setattr(media, "_start_probe_child", lambda path, answer: start(other, answer))


def _stuck_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Children:
    """The probe's children, each reading a FIFO no one writes to: it blocks
    the child's demuxer for ever."""
    fifo = tmp_path / "never.mp4"
    os.mkfifo(fifo)
    _probe_reads(monkeypatch, fifo)
    return _Children(monkeypatch)


async def _cancelled_and_killed(task: asyncio.Task[Any], child: Any) -> None:
    """The cancelled probe ends cancelled, its child killed."""
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(60):  # a guard: a probe that failed to kill its child would wait for ever
            await task
    assert child.exitcode == -signal.SIGKILL


def _abort(path: str, answer: Any) -> None:
    """A probe child that crashes (imported by reference in the forked child)."""
    os.abort()


async def test_probe_kills_a_child_stuck_on_a_fifo(
    src: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    children = _stuck_children(tmp_path, monkeypatch)
    # The outer timeout is a guard only: a probe that failed to kill its child would wait for ever.
    async with asyncio.timeout(60):
        with pytest.raises(
            MediaError, match=_exactly("reading the file took too long and was stopped")
        ) as info:
            await probe(src["png"], timeout_seconds=0.5)
    assert info.value.detail is not None and "timed out" in info.value.detail
    child = children.started.get_nowait()
    assert child.exitcode == -signal.SIGKILL


async def test_probe_leaves_the_loop_free_and_cancelling_kills_the_child(
    src: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    children = _stuck_children(tmp_path, monkeypatch)
    task = asyncio.create_task(probe(src["png"], timeout_seconds=600))
    # This coroutine runs while the child is stuck: the probe does not hold the event loop.
    child = await asyncio.wait_for(children.started.get(), timeout=60)
    assert not task.done() and child.exitcode is None
    task.cancel()
    await _cancelled_and_killed(task, child)


async def test_a_probe_cancelled_while_its_child_starts_still_kills_it(
    src: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    children = _stuck_children(tmp_path, monkeypatch)
    cancelled = threading.Event()
    recording = media._start_probe_child

    def slow_to_return(path: Path, answer: Any) -> Any:
        process = recording(path, answer)
        cancelled.wait(60)  # the probe is cancelled before its start has returned
        return process

    monkeypatch.setattr(media, "_start_probe_child", slow_to_return)
    task = asyncio.create_task(probe(src["png"], timeout_seconds=600))
    child = await asyncio.wait_for(children.started.get(), timeout=60)
    task.cancel()  # while the start is still out: its thread waits for this
    cancelled.set()
    await _cancelled_and_killed(task, child)


async def test_probe_child_crash_is_an_unreadable_file(
    src: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a demuxer crashing on a hostile file looks like from the server: a child killed by a signal.
    monkeypatch.setattr(media, "_probe_target", lambda: _abort)
    with pytest.raises(
        MediaError, match=_exactly("the file is not a readable audio, video or image file")
    ) as info:
        await probe(src["png"])
    assert info.value.detail is not None and f"exit code {-signal.SIGABRT}" in info.value.detail


# ------------------------------------------------------------------------------------------ check_kind


async def test_check_kind_accepts_matching_kinds(src: dict[str, Path]) -> None:
    await check_kind(await probe(src["tone_video"]), "VIDEO")
    await check_kind(await probe(src["silent_video"]), "VIDEO")
    await check_kind(await probe(src["audio"]), "AUDIO")
    await check_kind(await probe(src["png"]), "PHOTO")
    assert await check_photo(src["png"]) == (800, 600)


async def test_check_kind_audio_as_video(src: dict[str, Path]) -> None:
    with pytest.raises(MediaError, match=_exactly("the file is not a video: it only has sound")):
        await check_kind(await probe(src["audio"]), "VIDEO")


async def test_check_kind_png_as_video(src: dict[str, Path]) -> None:
    with pytest.raises(MediaError, match=_exactly("the file is not a video: it is a still image")):
        await check_kind(await probe(src["png"]), "VIDEO")


async def test_check_kind_video_as_audio_and_photo(src: dict[str, Path]) -> None:
    p = await probe(src["tone_video"])
    with pytest.raises(MediaError, match="not audio: it contains video"):
        await check_kind(p, "AUDIO")
    with pytest.raises(MediaError, match="not a photo"):
        await check_kind(p, "PHOTO")
    with pytest.raises(MediaError, match="not a photo: it is a video"):
        await check_kind(await probe(src["silent_video"]), "PHOTO")
    with pytest.raises(MediaError, match="not a photo"):
        await check_kind(await probe(src["audio"]), "PHOTO")


async def test_check_kind_garbage_as_photo(src: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MediaError):
        await probe(src["garbage"])
    with pytest.raises(MediaError, match=_exactly("the file is not a photo: the image could not be read")):
        await check_photo(src["garbage"])
    with pytest.raises(MediaError, match="not a photo"):
        await transcode_photo(src["garbage"], tmp_path / "g.jpg", tmp_path / "g-thumb.jpg")
    assert _files(tmp_path) == []


async def test_check_kind_unknown_type(src: dict[str, Path]) -> None:
    p = await probe(src["png"])
    with pytest.raises(MediaError, match="unknown content type"):
        await check_kind(p, "HOLOGRAM")
    with pytest.raises(MediaError):
        await check_kind(p, "TEXT")


# ----------------------------------------------------------------------------------------- transcoding


async def test_transcode_video_with_tone(src: dict[str, Path], tmp_path: Path) -> None:
    out, thumb = tmp_path / "out.mp4", tmp_path / "thumb.jpg"
    await transcode_video(src["tone_video"], out, thumb)
    p = await probe(out)
    assert (p.video_codec, p.audio_codec) == ("h264", "aac")
    assert (p.width, p.height) == (320, 240)
    assert p.duration_seconds == pytest.approx(1.0, abs=0.1)
    head = out.read_bytes()[:65536]
    assert head.find(b"moov") != -1 and head.find(b"moov") < head.find(b"mdat")  # faststart
    # 320x240 source: the long side is already THUMBNAIL_MAX_SIDE, so no scaling at all.
    assert _jpeg_size(thumb) == (THUMBNAIL_MAX_SIDE, 240) == (320, 240)


async def test_transcode_silent_video_has_no_audio(src: dict[str, Path], tmp_path: Path) -> None:
    out, thumb = tmp_path / "out.mp4", tmp_path / "thumb.jpg"
    await transcode_video(src["silent_video"], out, thumb)
    p = await probe(out)
    assert p.has_video and not p.has_audio
    assert p.video_codec == "h264"
    assert _jpeg_size(thumb) == (320, 240)


async def test_transcode_video_bounds_long_side(src: dict[str, Path], tmp_path: Path) -> None:
    out, thumb = tmp_path / "out.mp4", tmp_path / "thumb.jpg"
    await transcode_video(src["wide_video"], out, thumb)
    p = await probe(out)
    assert (p.width, p.height) == (VIDEO_MAX_SIDE, 720)  # 1600x900 -> 1280x720
    assert _jpeg_size(thumb) == (320, 180)


async def test_transcode_video_refuses_audio_and_cleans_up(src: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="not a video"):
        await transcode_video(src["audio"], tmp_path / "o.mp4", tmp_path / "t.jpg")
    with pytest.raises(MediaError, match="took too long"):
        await transcode_video(
            src["tone_video"], tmp_path / "o.mp4", tmp_path / "t.jpg", timeout_seconds=0.001
        )
    assert _files(tmp_path) == []


async def test_transcode_audio_to_m4a(src: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.m4a"
    await transcode_audio(src["audio"], out)
    p = await probe(out)
    assert p.has_audio and not p.has_video and not p.has_cover_art
    assert p.audio_codec == "aac"
    assert p.duration_seconds == pytest.approx(1.0, abs=0.1)
    assert out.read_bytes()[4:12] == b"ftypM4A "


async def test_transcode_audio_drops_cover_art(src: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.m4a"
    await transcode_audio(src["audio_cover"], out)
    p = await probe(out)
    assert p.audio_codec == "aac" and not p.has_video and not p.has_cover_art


async def test_transcode_photo_keeps_small_size(src: dict[str, Path], tmp_path: Path) -> None:
    out, thumb = tmp_path / "out.jpg", tmp_path / "thumb.jpg"
    await transcode_photo(src["png"], out, thumb)
    assert _jpeg_size(out) == (800, 600)
    assert _jpeg_size(thumb) == (320, 240)
    with Image.open(out) as img:
        assert img.mode == "RGB"
        r, g, b = _rgb(img, (5, 5))
        assert r > 200 and g < 60 and b < 60  # the red marker stays top-left


async def test_transcode_photo_bounds_big_photo(src: dict[str, Path], tmp_path: Path) -> None:
    out, thumb = tmp_path / "out.jpg", tmp_path / "thumb.jpg"
    await transcode_photo(src["big_png"], out, thumb)
    assert _jpeg_size(out) == (PHOTO_MAX_SIDE, 1536)
    assert _jpeg_size(thumb) == (320, 240)


async def test_transcode_photo_applies_exif_orientation(src: dict[str, Path], tmp_path: Path) -> None:
    out, thumb = tmp_path / "out.jpg", tmp_path / "thumb.jpg"
    await transcode_photo(src["rotated_jpg"], out, thumb)
    assert _jpeg_size(out) == (600, 800)
    assert _jpeg_size(thumb) == (240, 320)
    with Image.open(out) as img:
        assert 0x0112 not in img.getexif()  # EXIF (orientation, location) is not copied


async def test_transcode_photo_flattens_transparency(tmp_path: Path) -> None:
    src = tmp_path / "alpha.png"
    Image.new("RGBA", (50, 40), (0, 0, 0, 0)).save(src)
    out, thumb = tmp_path / "out.jpg", tmp_path / "thumb.jpg"
    await transcode_photo(src, out, thumb)
    with Image.open(out) as img:
        assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (50, 40))
        assert min(_rgb(img, (25, 20))) > 240  # white, not black


# ---------------------------------------------------------------------------------------------- iPhone photos

XMP = (
    b'<?xpacket begin="\xef\xbb\xbf" id="W5M0MpCehiHzreSzNTczkc9d"?>'
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    b'<rdf:Description rdf:about="" xmlns:exif="http://ns.adobe.com/exif/1.0/"'
    b' xmlns:photoshop="http://ns.adobe.com/photoshop/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/"'
    b' xmlns:hdrgm="http://ns.adobe.com/hdr-gain-map/1.0/"'
    b' exif:GPSLatitude="40,25.025N" photoshop:City="Madrid" hdrgm:Version="1.0">'
    b"<exif:GPSLongitude>3,42.2W</exif:GPSLongitude>"
    b'<dc:title><rdf:Alt><rdf:li xml:lang="x-default">Sol</rdf:li></rdf:Alt></dc:title>'
    b"</rdf:Description></rdf:RDF></x:xmpmeta>" + b" " * 64 + b'<?xpacket end="w"?>'
)


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload


def _iptc(*datasets: tuple[int, bytes]) -> bytes:
    """A Photoshop APP13 segment holding IPTC record 2 datasets."""
    iim = b"".join(b"\x1c\x02" + bytes([n]) + len(v).to_bytes(2, "big") + v for n, v in datasets)
    resource = b"8BIM\x04\x04\x00\x00" + len(iim).to_bytes(4, "big") + iim + b"\x00" * (len(iim) % 2)
    return _segment(0xED, b"Photoshop 3.0\x00" + resource)


def _has_gps(path: Path) -> bool:
    with Image.open(path) as img:
        exif = img.getexif()
        return 0x8825 in exif or bool(exif.get_ifd(0x8825))


def _pixels(path: Path) -> bytes:
    with Image.open(path) as img:
        return img.convert("RGB").tobytes()


async def test_heic_is_read_upright_and_converted_to_jpeg(tmp_path: Path) -> None:
    heic = mf.make_photo_with_location(tmp_path, "HEIF", size=(400, 300))
    assert await check_photo(heic) == (300, 400)
    out, thumb = tmp_path / "out.jpg", tmp_path / "thumb.jpg"
    await transcode_photo(heic, out, thumb)
    assert _jpeg_size(out) == (300, 400)
    assert _jpeg_size(thumb) == (240, 320)
    with Image.open(out) as img:
        assert not img.getexif() and "exif" not in img.info and "xmp" not in img.info
        r, g, b = _rgb(img, (294, 5))
        assert r > 180 and g < 90 and b < 90  # the marker stored top-left is top-right


async def test_photo_original_strips_exif_gps_xmp_and_iptc_location_losslessly(tmp_path: Path) -> None:
    extra = _segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00" + XMP) + _iptc(
        (90, b"Madrid"), (101, b"Spain"), (120, b"Cumple de la abuela")
    )
    src = mf.make_photo_with_location(tmp_path, "JPEG", extra=extra)
    clean = tmp_path / "clean.jpg"
    found = await media.photo_original(src, clean)
    assert found == media.PhotoOriginal("2024-05-17T14:03:22+02:00", stripped=True)
    data, before = clean.read_bytes(), src.read_bytes()
    assert len(data) == len(before) and _pixels(clean) == _pixels(src)
    assert not _has_gps(clean)
    with Image.open(clean) as img:
        assert img.getexif()[0x0112] == 6 and img.getexif()[0x010F] == "Apple"
        xmp = img.info["xmp"]
    for gone in (b"GPSLatitude", b"GPSLongitude", b"Madrid", b"Spain"):
        assert gone not in data
    for kept in (b'hdrgm:Version="1.0"', b"Sol", b"Cumple de la abuela"):
        assert kept in data
    ElementTree.fromstring(xmp.split(b"?>", 1)[1].rsplit(b"<?", 1)[0])  # still well-formed XML
    # Already clean: nothing to write.
    again = tmp_path / "again.jpg"
    assert (await media.photo_original(clean, again)).stripped is False
    assert not again.exists()


# The same location with the exif namespace as the default one (no prefix) and
# under a prefix of the writer's choosing.
UNPREFIXED_XMP = (
    b'<?xpacket begin="\xef\xbb\xbf" id="W5M0MpCehiHzreSzNTczkc9d"?>'
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
    b'<rdf:Description rdf:about="" xmlns="http://ns.adobe.com/exif/1.0/"'
    b' xmlns:e2="http://ns.adobe.com/exif/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/"'
    b' GPSAltitude="650/1" e2:GPSLatitude="40,25.025N">'
    b"<GPSLongitude>3,42.2W</GPSLongitude><e2:GPSDestLatitude>40,25N</e2:GPSDestLatitude>"
    b'<dc:title><rdf:Alt><rdf:li xml:lang="x-default">Sol</rdf:li></rdf:Alt></dc:title>'
    b"</rdf:Description></rdf:RDF></x:xmpmeta>" + b" " * 64 + b'<?xpacket end="w"?>'
)


async def test_photo_original_strips_xmp_location_whatever_its_prefix(tmp_path: Path) -> None:
    extra = _segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00" + UNPREFIXED_XMP)
    src = mf.make_photo_with_location(tmp_path, "JPEG", extra=extra)
    clean = tmp_path / "clean.jpg"
    assert (await media.photo_original(src, clean)).stripped
    data = clean.read_bytes()
    for gone in (b"GPSAltitude", b"GPSLatitude", b"GPSLongitude", b"GPSDestLatitude", b"3,42.2W", b"650/1"):
        assert gone not in data, gone
    assert b"Sol" in data
    with Image.open(clean) as img:
        xmp = img.info["xmp"]
    ElementTree.fromstring(xmp.split(b"?>", 1)[1].rsplit(b"<?", 1)[0])  # still well-formed XML


async def test_photo_original_cleans_every_jpeg_of_the_file_and_drops_what_follows(tmp_path: Path) -> None:
    """An MPF-style file (a second JPEG after the first, as a gain map) with a trailer."""
    first = mf.make_photo_with_location(tmp_path, "JPEG", name="first.jpg").read_bytes()
    second = mf.make_photo_with_location(tmp_path, "JPEG", size=(40, 30), name="second.jpg").read_bytes()
    src = tmp_path / "multi.jpg"
    src.write_bytes(first + second + b"ftypmp42 a motion photo's video, GPS and all")
    clean = tmp_path / "clean.jpg"
    assert (await media.photo_original(src, clean)).stripped
    data = clean.read_bytes()
    assert len(data) == len(first) + len(second)
    (tmp_path / "second-clean.jpg").write_bytes(data[len(first) :])
    assert not _has_gps(clean) and not _has_gps(tmp_path / "second-clean.jpg")


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "TIFF", "HEIF"])
async def test_photo_original_strips_gps_from_other_formats(tmp_path: Path, fmt: str) -> None:
    src = mf.make_photo_with_location(tmp_path, fmt, lossless=True)
    clean = tmp_path / f"clean.{fmt.lower()}"
    assert _has_gps(src)
    found = await media.photo_original(src, clean)
    assert found.stripped and not _has_gps(clean)
    assert clean.stat().st_size == src.stat().st_size and _pixels(clean) == _pixels(src)


async def test_photo_original_fails_when_a_location_stays(tmp_path: Path) -> None:
    """EXIF in a PNG text chunk (ImageMagick's old way) is read by Pillow and not by us."""
    from PIL import PngImagePlugin

    raw = b"Exif\x00\x00" + mf.location_exif().tobytes()
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", f"\nexif\n{len(raw)}\n{raw.hex()}\n")
    src = tmp_path / "raw-profile.png"
    Image.new("RGB", (20, 10)).save(src, pnginfo=info)
    assert _has_gps(src)
    clean = tmp_path / "clean.png"
    with pytest.raises(MediaError, match=_exactly("the location could not be removed from the photo")):
        await media.photo_original(src, clean)
    assert not clean.exists()


@pytest.mark.parametrize(
    ("taken", "offset", "subsec", "expected"),
    [
        ("2024:05:17 14:03:22", "+02:00", None, "2024-05-17T14:03:22+02:00"),
        ("2024:05:17 14:03:22", "-05:30", "25", "2024-05-17T14:03:22.250000-05:30"),
        ("2024:05:17 14:03:22", None, None, "2024-05-17T14:03:22"),  # the camera's clock, no offset
        ("2024:05:17 14:03:22", "   :  ", None, "2024-05-17T14:03:22"),
        ("0000:00:00 00:00:00", "+02:00", None, None),
        (None, "+02:00", None, None),
    ],
)
async def test_photo_original_reads_the_capture_time(
    tmp_path: Path, taken: str | None, offset: str | None, subsec: str | None, expected: str | None
) -> None:
    exif = mf.location_exif(taken=taken, offset=offset)
    if subsec is not None:
        exif.get_ifd(0x8769)[0x9291] = subsec
    src = mf.make_photo_with_location(tmp_path, "JPEG", exif=exif)
    kept = await media.photo_original(src, None)  # MIFAMILIAS_KEEP_ORIGINAL_METADATA: nothing written
    assert kept == media.PhotoOriginal(expected, stripped=False)


# The CPU goes to the server first ------------------------------------------------------------


async def test_media_tools_and_photo_processes_run_at_the_background_priority() -> None:
    # A tool (ffmpeg's place) reads its own niceness until the server has lowered it.
    watch = 'for i in $(seq 200); do n=$(nice); [ "$n" -ge 10 ] && break; sleep 0.05; done; echo "$n"'
    code, out, _ = await media._run_process(
        ["sh", "-c", watch], timeout_seconds=60, what="a tool", tool="sh", stdout=True
    )
    assert code == 0 and int(out) == BACKGROUND_NICENESS
    niceness = await asyncio.wrap_future(media._photo_pool().submit(os.getpriority, os.PRIO_PROCESS, 0))
    assert niceness == BACKGROUND_NICENESS
    assert os.getpriority(os.PRIO_PROCESS, 0) < BACKGROUND_NICENESS  # the server itself is not lowered


def test_a_photos_child_does_not_run_the_servers_main_module(tmp_path: Path) -> None:
    """multiprocessing runs the parent's main module again in each child of the
    forkserver; for the server that is app.py and all of its imports, twice per
    photo. A main module that notes each run of itself: a photo leaves one, its own."""
    import subprocess
    import sys
    import textwrap

    from tests.servers import ROOT

    runs, photo, main = tmp_path / "runs", tmp_path / "photo.png", tmp_path / "server_main.py"
    Image.new("RGB", (8, 8), "red").save(photo)
    main.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            from pathlib import Path

            with open({str(runs)!r}, "a") as log:
                log.write(__name__ + "\\n")

            if __name__ == "__main__":
                from resolvers.adapters import media

                asyncio.run(media.check_photo(Path({str(photo)!r})))
                media.close_photo_pool()
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(media.FORKSERVER_MAIN, None)
    subprocess.run([sys.executable, str(main)], cwd=tmp_path, env=env, check=True, timeout=120)
    assert runs.read_text().split() == ["__main__"]
