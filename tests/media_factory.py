"""Make small test media files (video, audio, images, garbage) in a given folder.

Sync helpers using the ffmpeg binary shipped by imageio-ffmpeg (lavfi test sources) and Pillow.
Each call writes a fresh file and returns its path.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import imageio_ffmpeg
from PIL import Image, ImageDraw

FFMPEG_TIMEOUT_SECONDS = 60


def _ffmpeg(*args: str) -> None:
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-y", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=FFMPEG_TIMEOUT_SECONDS, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ffmpeg failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")


def make_video_with_tone(
    dir: Path, name: str = "tone.mp4", *, size: tuple[int, int] = (320, 240), seconds: float = 1.0
) -> Path:
    """A `seconds`-long H.264/AAC MP4 (test pattern, 25 fps) with a 440 Hz tone."""
    out = Path(dir) / name
    w, h = size
    _ffmpeg(
        "-f", "lavfi", "-i", f"testsrc=size={w}x{h}:rate=25:duration={seconds}",
        "-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=44100:duration={seconds}",
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
        "-c:a", "aac", "-b:a", "64k", "-shortest", str(out),
    )  # fmt: skip
    return out


def make_silent_video(
    dir: Path, name: str = "silent.mp4", *, size: tuple[int, int] = (320, 240), seconds: float = 1.0
) -> Path:
    """A `seconds`-long H.264 MP4 with no audio stream."""
    out = Path(dir) / name
    w, h = size
    _ffmpeg(
        "-f", "lavfi", "-i", f"testsrc=size={w}x{h}:rate=25:duration={seconds}",
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-an", str(out),
    )  # fmt: skip
    return out


def make_large_video(
    dir: Path, name: str = "large.mp4", *, size: tuple[int, int] = (640, 480), seconds: float = 3.5
) -> Path:
    """A big, valid H.264 MP4 that is quick to make and to convert: lossless
    frames of a test pattern under temporal noise, about 12 MB a second at
    640x480 (3.5 s is about 40 MiB). The noise filter's seed is fixed, so the
    file is the same each time with the same ffmpeg."""
    out = Path(dir) / name
    w, h = size
    _ffmpeg(
        "-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate=25:duration={seconds}",
        "-vf", "noise=alls=60:allf=t+u",
        "-c:v", "libx264", "-preset", "ultrafast", "-qp", "0", "-pix_fmt", "yuv420p", "-an", str(out),
    )  # fmt: skip
    return out


def make_audio_clip(dir: Path, name: str = "tone.wav", *, seconds: float = 1.0) -> Path:
    """A `seconds`-long 440 Hz tone; the container/codec follow the suffix (.wav, .mp3, .m4a...)."""
    out = Path(dir) / name
    _ffmpeg("-f", "lavfi", "-i", f"sine=frequency=440:sample_rate=44100:duration={seconds}", str(out))
    return out


def make_audio_with_cover(dir: Path, name: str = "cover.mp3", *, seconds: float = 1.0) -> Path:
    """A tone with an embedded cover picture (an attached pic, not a real video).

    ``.mp3``: MP3 with a PNG in an ID3v2 tag; ``.m4a``: AAC with a JPEG ``covr`` atom.
    """
    cover = make_png(dir, size=(64, 64), name="cover-art.png")
    out = Path(dir) / name
    if out.suffix == ".m4a":
        codecs = ["-c:a", "aac", "-c:v", "mjpeg"]
    else:
        codecs = ["-c:a", "libmp3lame", "-c:v", "png", "-id3v2_version", "3"]
    _ffmpeg(
        "-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}", "-i", str(cover),
        "-map", "0:a", "-map", "1:v", *codecs, "-disposition:v", "attached_pic", str(out),
    )  # fmt: skip
    return out


def make_rotated_video(dir: Path, src: Path, degrees: int, name: str | None = None) -> Path:
    """A copy of the video ``src`` (streams copied, not re-encoded) whose container asks players
    to turn the picture by ``degrees`` counter-clockwise (a display matrix, as phones write)."""
    out = Path(dir) / (name or f"{src.stem}-rot{degrees}{src.suffix}")
    _ffmpeg("-display_rotation", str(degrees), "-i", str(src), "-map", "0", "-c", "copy", str(out))
    return out


def make_truncated(dir: Path, src: Path, name: str, keep: float = 0.5) -> Path:
    """The first ``keep`` fraction of the bytes of ``src``."""
    data = src.read_bytes()
    out = Path(dir) / name
    out.write_bytes(data[: int(len(data) * keep)])
    return out


def make_png(dir: Path, size: tuple[int, int] = (800, 600), name: str | None = None) -> Path:
    """An RGB PNG of `size` with a diagonal gradient and a marker in the top-left corner."""
    w, h = size
    out = Path(dir) / (name or f"photo-{w}x{h}.png")
    img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
    ImageDraw.Draw(img).rectangle((0, 0, max(w // 8, 1), max(h // 8, 1)), fill=(255, 0, 0))
    img.save(out, "PNG", compress_level=1)
    return out


def make_jpeg_with_orientation(
    dir: Path, size: tuple[int, int] = (800, 600), orientation: int = 6, name: str | None = None
) -> Path:
    """A JPEG stored as `size` whose EXIF says to rotate it (6 = 90° clockwise on display)."""
    w, h = size
    out = Path(dir) / (name or f"rotated-{w}x{h}-o{orientation}.jpg")
    img = Image.new("RGB", (w, h), (0, 128, 255))
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.save(out, "JPEG", exif=exif.tobytes())
    return out


# 40°25'1.5" N, 3°42'12" W: the Puerta del Sol, for photos that carry a location.
GPS_LATITUDE = (40.0, 25.0, 1.5)
GPS_LONGITUDE = (3.0, 42.0, 12.0)
TAKEN = "2024:05:17 14:03:22"


def location_exif(
    *, orientation: int = 6, taken: str | None = TAKEN, offset: str | None = "+02:00"
) -> Image.Exif:
    """EXIF as a phone writes it: make and model, orientation, capture time and a GPS block."""
    exif = Image.Exif()
    exif[0x010F] = "Apple"  # Make
    exif[0x0110] = "iPhone 15"  # Model
    exif[0x0112] = orientation
    details = exif.get_ifd(0x8769)  # the Exif IFD
    if taken is not None:
        details[0x9003] = taken  # DateTimeOriginal
    if offset is not None:
        details[0x9011] = offset  # OffsetTimeOriginal
    gps = exif.get_ifd(0x8825)
    gps[0x0000] = b"\x02\x02\x00\x00"  # GPSVersionID
    gps[0x0001] = "N"
    gps[0x0002] = GPS_LATITUDE
    gps[0x0003] = "W"
    gps[0x0004] = GPS_LONGITUDE
    gps[0x0006] = 657.0  # GPSAltitude
    return exif


def make_photo_with_location(
    dir: Path,
    fmt: str = "HEIF",
    size: tuple[int, int] = (400, 300),
    name: str | None = None,
    exif: Image.Exif | None = None,
    **save: object,
) -> Path:
    """A landscape photo (`fmt`: HEIF, JPEG, PNG, WEBP...) with a red marker top-left as
    stored, and `location_exif()` (orientation 6: shown turned 90° clockwise, the marker
    top-right). HEIF goes through pillow-heif, a real HEIC as an iPhone makes."""
    import pillow_heif

    pillow_heif.register_heif_opener()
    w, h = size
    suffix = {"HEIF": "heic", "JPEG": "jpg"}.get(fmt, fmt.lower())
    out = Path(dir) / (name or f"located-{w}x{h}.{suffix}")
    img = Image.new("RGB", (w, h), (0, 128, 255))
    ImageDraw.Draw(img).rectangle((0, 0, w // 8, h // 6), fill=(255, 0, 0))
    exif = exif if exif is not None else location_exif()
    img.save(out, fmt, exif=exif.tobytes(), quality=90, **save)
    return out


def make_garbage(dir: Path, name: str = "garbage.bin", size: int = 4096, seed: int = 1234) -> Path:
    """`size` random bytes (seeded, so every run gets the same bytes)."""
    out = Path(dir) / name
    out.write_bytes(random.Random(seed).randbytes(size))
    return out


ENGLISH_SPEECH = (
    "My grandmother bakes fresh bread every Sunday morning. "
    "The children play football in the garden after school."
)
SPANISH_SPEECH = (
    "Hola abuela, mañana vamos a la playa con los niños. Después comemos juntos en la casa de mi hermana."
)


def make_speech_wav(dir: Path, text: str, voice: str, name: str | None = None) -> Path:
    """`text` spoken by espeak-ng with `voice` ("en", "es"), as a WAV file."""
    out = Path(dir) / (name or f"speech-{voice}.wav")
    subprocess.run(
        ["espeak-ng", "-v", voice, "-s", "150", "-w", str(out), text],
        check=True,
        capture_output=True,
        timeout=FFMPEG_TIMEOUT_SECONDS,
    )
    return out


def make_video_with_speech(dir: Path, speech: Path, name: str = "speech.mp4") -> Path:
    """An H.264/AAC MP4 (test pattern) whose sound track is `speech`, as long as it."""
    out = Path(dir) / name
    _ffmpeg(
        "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25", "-i", str(speech),
        "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
        "-c:a", "aac", "-b:a", "64k", "-shortest", str(out),
    )  # fmt: skip
    return out


def make_long_audio_with_speech(
    dir: Path, first: Path, last: Path, *, seconds: float, name: str = "long.m4a"
) -> Path:
    """`seconds` of audio (AAC in .m4a): `first` spoken at the start, `last` at the end,
    silence between."""
    out = Path(dir) / name
    _ffmpeg(
        "-i", str(first), "-i", str(last),
        "-filter_complex",
        f"[0:a]aresample=16000,apad=whole_dur={seconds - 10:.3f}[a];"
        "[1:a]aresample=16000,apad=whole_dur=10[b];[a][b]concat=n=2:v=0:a=1[out]",
        "-map", "[out]", "-ac", "1", "-c:a", "aac", "-b:a", "32k", str(out),
    )  # fmt: skip
    return out
