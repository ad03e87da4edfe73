"""The local transcriber's worker processes, driven directly on files: one model per
worker, killed on a cancel or a stall, closed when idle, and an hour of audio (speech at
its start and end, silence between) transcribed in memory that does not grow with it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from resolvers.adapters import speech as speech_worker
from resolvers.adapters.probing import BACKGROUND_NICENESS
from resolvers.adapters.transcribe import TranscriptionError
from resolvers.adapters.whisper import LocalTranscriber
from resolvers.core.config import Settings
from tests import media_factory as mf
from tests.servers import until

HOUR = 3600.0
# An hour of 16 kHz float32 samples: what holding the whole decode would cost, at least.
WHOLE_HOUR_BYTES = int(HOUR * speech_worker.SAMPLE_RATE * 4)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("whisper")
    english = mf.make_speech_wav(folder, mf.ENGLISH_SPEECH, "en")
    spanish = mf.make_speech_wav(folder, mf.SPANISH_SPEECH, "es")
    return {
        "english": english,
        "hour": mf.make_long_audio_with_speech(folder, english, spanish, seconds=HOUR),
        "tone": mf.make_audio_clip(folder, seconds=2.0),
    }


@pytest.fixture
async def transcriber() -> AsyncIterator[LocalTranscriber]:
    local = LocalTranscriber(None, cache_dir=Settings().resolved_cache_dir / "models")  # type: ignore[arg-type]
    try:
        yield local
    finally:
        await local.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


async def test_an_hour_with_speech_at_both_ends_is_transcribed_in_bounded_memory(
    transcriber: LocalTranscriber, recordings: dict[str, Path]
) -> None:
    short = await transcriber.transcribe_file(recordings["english"])
    assert short is not None and transcriber.last_stats is not None
    short_stats = transcriber.last_stats

    heard = await transcriber.transcribe_file(recordings["hour"])
    assert heard is not None and transcriber.last_stats is not None
    stats = transcriber.last_stats
    assert stats.pid == short_stats.pid  # the same worker, the model loaded once
    assert stats.audio_seconds == pytest.approx(HOUR, abs=1.0)
    text = heard.text.lower()
    assert "grandmother" in text and "football" in text  # the start
    assert "playa" in text and "niños" in text  # the end, heard in its own language
    assert heard.language == "en"  # the first words decide
    starts = [cue.start for cue in heard.cues]
    assert starts == sorted(starts)
    assert heard.cues[0].start < 10 and heard.cues[-1].end > HOUR - 12
    assert not any(60 < cue.start < HOUR - 60 for cue in heard.cues)  # silence says nothing
    # Memory does not grow with the hour: less than the hour's decoded samples alone.
    assert stats.max_rss_bytes - short_stats.max_rss_bytes < WHOLE_HOUR_BYTES


async def test_a_recording_without_speech_loads_no_model_and_is_none(
    transcriber: LocalTranscriber, recordings: dict[str, Path]
) -> None:
    assert await transcriber.transcribe_file(recordings["tone"]) is None
    assert transcriber.last_stats is not None
    # Voice-activity detection alone: far below the ~350 MB of a loaded model.
    assert transcriber.last_stats.max_rss_bytes < 300 << 20


async def test_a_cancelled_transcription_kills_its_worker(
    transcriber: LocalTranscriber, recordings: dict[str, Path]
) -> None:
    task = asyncio.create_task(transcriber.transcribe_file(recordings["hour"]))
    await until(lambda: bool(transcriber.worker_pids), "the worker to start")
    (pid,) = transcriber.worker_pids
    # It runs at the background's priority, below the server's.
    await until(lambda: os.getpriority(os.PRIO_PROCESS, pid) == BACKGROUND_NICENESS, "the worker to yield")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _alive(pid)
    assert transcriber.worker_pids == []
    # The next transcription starts a new worker.
    assert await transcriber.transcribe_file(recordings["english"]) is not None
    assert transcriber.worker_pids != [pid]


async def test_a_worker_that_stalls_is_killed_and_the_transcription_fails(
    recordings: dict[str, Path],
) -> None:
    local = LocalTranscriber(
        None,  # type: ignore[arg-type]
        cache_dir=Settings().resolved_cache_dir / "models",
        chunk_timeout_seconds=0.05,
    )
    try:
        with pytest.raises(TranscriptionError, match="no progress"):
            await local.transcribe_file(recordings["hour"])
        assert local.worker_pids == []
    finally:
        await local.close()


async def test_an_idle_worker_is_closed_and_gives_its_memory_back(recordings: dict[str, Path]) -> None:
    local = LocalTranscriber(
        None,  # type: ignore[arg-type]
        cache_dir=Settings().resolved_cache_dir / "models",
        idle_seconds=0.2,
    )
    try:
        assert await local.transcribe_file(recordings["tone"]) is None
        assert local.last_stats is not None
        pid = local.last_stats.pid
        await until(lambda: not _alive(pid), "the idle worker to exit")
        assert local.worker_pids == []
    finally:
        await local.close()


async def test_unreadable_audio_fails_with_a_reason_and_keeps_the_worker(
    transcriber: LocalTranscriber, tmp_path: Path, recordings: dict[str, Path]
) -> None:
    garbage = mf.make_garbage(tmp_path)
    with pytest.raises(TranscriptionError, match="transcription failed"):
        await transcriber.transcribe_file(garbage)
    assert await transcriber.transcribe_file(recordings["tone"]) is None


def test_the_default_model_is_assembled_once_and_checked(tmp_path: Path) -> None:
    first = speech_worker.assemble_default_model(tmp_path)
    assert (first / "model.bin").stat().st_size == 145_217_607
    assert {p.name for p in first.iterdir()} == {
        "model.bin",
        "config.json",
        "tokenizer.json",
        "vocabulary.json",
    }
    modified = (first / "model.bin").stat().st_mtime_ns
    assert speech_worker.assemble_default_model(tmp_path) == first
    assert (first / "model.bin").stat().st_mtime_ns == modified  # not joined again
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built directory left


def test_a_damaged_cached_model_is_joined_again(tmp_path: Path) -> None:
    first = speech_worker.assemble_default_model(tmp_path)
    with (first / "model.bin").open("r+b") as model:
        model.seek(1_000_000)
        model.write(b"\xa5" * 64)  # as a bad block or an interrupted copy would leave it
    assert speech_worker._sha256(first / "model.bin") != speech_worker.DEFAULT_MODEL_SHA256
    again = speech_worker.assemble_default_model(tmp_path)
    assert again == first
    assert speech_worker._sha256(again / "model.bin") == speech_worker.DEFAULT_MODEL_SHA256
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # the damaged copy is gone


def test_parts_that_do_not_check_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speech_worker, "DEFAULT_MODEL_SHA256", "0" * 64)
    with pytest.raises(speech_worker.ModelMissing, match="do not check"):
        speech_worker.assemble_default_model(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-checked is left to load
