"""The local transcriber on this machine: real-time factor and peak worker memory.

    .venv/bin/python -m bench.transcription [--quick]

Speech is made by espeak-ng (English and Spanish), as in the tests. Each recording goes
through one `LocalTranscriber` worker (the default model, int8, one CPU thread), the model
already loaded (its load is reported apart). The real-time factor is seconds of audio per
CPU second of the worker (above 1: faster than real time); the baseline of the same run is
the worker's CPU on a recording of the same length without speech (voice-activity detection
and decoding alone), so the ratio is what Whisper itself adds. The table goes to
bench/RESULTS.md, under "Transcription".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import tempfile
import time
from pathlib import Path

from resolvers.adapters.whisper import LocalTranscriber
from resolvers.core.config import Settings
from tests import media_factory as mf

HERE = Path(__file__).resolve().parent
SECTION = "## Transcription (`python -m bench.transcription`)"


async def _measure(local: LocalTranscriber, path: Path) -> tuple[float, float, float, int]:
    started = time.perf_counter()
    await local.transcribe_file(path)
    wall = time.perf_counter() - started
    stats = local.last_stats
    assert stats is not None
    return stats.audio_seconds, stats.cpu_seconds, wall, stats.max_rss_bytes


def _repeat(folder: Path, speech: Path, times: int, name: str) -> Path:
    listing = folder / f"{name}.txt"
    listing.write_text("".join(f"file '{speech}'\n" for _ in range(times)))
    out = folder / f"{name}.wav"
    mf._ffmpeg("-f", "concat", "-safe", "0", "-i", str(listing), "-c", "copy", str(out))
    return out


async def run(quick: bool) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        english = mf.make_speech_wav(folder, mf.ENGLISH_SPEECH, "en")
        spanish = mf.make_speech_wav(folder, mf.SPANISH_SPEECH, "es")
        times = 4 if quick else 17  # about 30 s or 2 minutes of talk
        talk = _repeat(folder, english, times, "talk")
        hour = mf.make_long_audio_with_speech(folder, english, spanish, seconds=600 if quick else 3600)
        local = LocalTranscriber(None, cache_dir=Settings().resolved_cache_dir / "models")  # type: ignore[arg-type]
        try:
            started = time.perf_counter()
            await local.transcribe_file(english)  # starts the worker and loads the model
            first = time.perf_counter() - started
            rows.append(
                ("worker start, model load and 7 s of speech", f"{first:.1f} s wall", "once per worker")
            )
            talk_cpu = 0.0
            for label, path in (("English, 7 s", english), ("Spanish, 7 s", spanish), ("English talk", talk)):
                audio, cpu, wall, rss = await _measure(local, path)
                talk_cpu = cpu
                rows.append(
                    (
                        f"{label} ({audio:.0f} s of audio)",
                        f"RTF {audio / cpu:.1f}x real time per CPU second",
                        f"{cpu:.1f} CPU s, {wall:.1f} s wall, peak worker RSS {rss >> 20} MiB",
                    )
                )
            audio, cpu, wall, rss = await _measure(local, hour)
            rows.append(
                (
                    f"{audio / 60:.0f} min, speech at both ends, silence between",
                    f"RTF {audio / cpu:.0f}x",
                    f"{cpu:.1f} CPU s, {wall:.1f} s wall, peak worker RSS {rss >> 20} MiB",
                )
            )
            silent = mf.make_audio_clip(folder, "silent-talk.wav", seconds=float(int(audio_of(talk))))
            fresh = LocalTranscriber(None, cache_dir=Settings().resolved_cache_dir / "models")  # type: ignore[arg-type]
            try:
                base_audio, base_cpu, _, base_rss = await _measure(fresh, silent)
            finally:
                await fresh.close()
            rows.append(
                (
                    f"baseline: {base_audio:.0f} s of tone, no speech (VAD + decode only)",
                    f"RTF {base_audio / base_cpu:.0f}x",
                    f"{base_cpu:.2f} CPU s, peak worker RSS {base_rss >> 20} MiB (no model loaded); "
                    f"Whisper costs {talk_cpu / max(base_cpu, 1e-6):.0f}x that on as much talk",
                )
            )
        finally:
            await local.close()
    return rows


def audio_of(path: Path) -> float:
    import wave

    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def write(rows: list[tuple[str, str, str]], quick: bool) -> str:
    load = os.getloadavg()
    lines = [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} (the machine is shared: CPU seconds, not wall time, carry the claim)"
        + (", quick sizes" if quick else "")
        + ". Model: Whisper base (multilingual), CTranslate2 int8, 1 thread per worker.",
        "",
        "| Recording | Real-time factor | Detail |",
        "| --- | --- | --- |",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
    ]
    block = "\n".join(lines)
    results = HERE / "RESULTS.md"
    text = results.read_text() if results.exists() else ""
    pattern = re.compile(re.escape(SECTION) + r".*?(?=\n## |\Z)", re.S)
    if pattern.search(text):
        text = pattern.sub(block.rstrip("\n") + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    results.write_text(text)
    return block


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.transcription")
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    print(write(asyncio.run(run(quick)), quick))


if __name__ == "__main__":
    main()
