"""The local transcriber: faster-whisper (CTranslate2, int8 on CPU) in worker processes.

Each worker is a child Python running :mod:`resolvers.adapters.speech`, which keeps the model
loaded between files. At most ``workers`` run at once (the pipeline's ``PIPELINE_WORKERS``):
a transcription waits for a free one. A worker is killed when it goes silent for
``chunk_timeout_seconds`` (it reports after every piece of audio, so a long recording is not
a slow one), when the awaiting task is cancelled (the pipeline stopping, a lease lost), and
when it exits with a memory error; the next transcription starts a new one. A worker idle for
``idle_seconds`` is closed, so the model's memory goes back to the system between bursts.

`./dev serve` installs faster-whisper and the model in the background of a first start. While
its marker (``<venv>/.installing-speech``) names a live process, a transcription waits for the
packages (the pipeline keeps renewing the content's lease), then runs; without the packages and
with no install going on, it fails with a reason (the content is READY without a transcript).

The media blob is fetched from the blob store into a temporary file, the worker reads it
there, and the file is removed when the transcription ends, whatever the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resolvers.adapters import speech
from resolvers.adapters.transcribe import Cue, Transcription, TranscriptionError
from resolvers.core import workdirs
from store.blobs import BlobStore

__all__ = ["LocalTranscriber", "WorkerStats", "open_local_transcriber"]

log = logging.getLogger("mifamilias.transcribe")

CHUNK_TIMEOUT_SECONDS = 600.0
START_TIMEOUT_SECONDS = 60.0
INSTALL_POLL_SECONDS = 2.0
INSTALLING_MARKER = Path(sys.prefix) / ".installing-speech"
IDLE_SECONDS = 120.0
# The worker's address space: the base model decodes in about 400 MB resident; CTranslate2
# and onnxruntime reserve more address space than they touch.
MEMORY_LIMIT_BYTES = 3 << 30
_LINE_LIMIT = 16 << 20  # one piece's segments as JSON


@dataclass(frozen=True)
class WorkerStats:
    """What the last transcription cost its worker: seconds of audio, the worker's CPU
    seconds on it (all threads), its peak resident memory so far."""

    audio_seconds: float
    cpu_seconds: float
    max_rss_bytes: int
    pid: int


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process, pid: int) -> None:
        self.process = process
        self.pid = pid
        self.idle: asyncio.TimerHandle | None = None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def read(self, seconds: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        async with asyncio.timeout(seconds):
            line = await self.process.stdout.readline()
        if not line:
            code = await self.process.wait()
            raise TranscriptionError(f"the speech worker stopped (exit code {code})")
        message: dict[str, Any] = json.loads(line)
        return message

    async def kill(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()

    async def close(self) -> None:
        """Ends the worker the gentle way: its stdin closes, it exits."""
        if self.idle is not None:
            self.idle.cancel()
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            async with asyncio.timeout(5):
                await self.process.wait()
        except TimeoutError:
            await self.kill()


class LocalTranscriber:
    """Whisper on this machine's CPU, one worker process per concurrent transcription."""

    def __init__(
        self,
        blobs: BlobStore,
        *,
        cache_dir: Path,
        model_dir: Path | None = None,
        language: str | None = None,
        workers: int = 1,
        chunk_seconds: float = speech.CHUNK_SECONDS,
        chunk_timeout_seconds: float = CHUNK_TIMEOUT_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        memory_limit_bytes: int = MEMORY_LIMIT_BYTES,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.blobs = blobs
        self.cache_dir = cache_dir
        self.model_dir = model_dir
        self.language = language
        self.chunk_seconds = chunk_seconds
        self.chunk_timeout_seconds = chunk_timeout_seconds
        self.idle_seconds = idle_seconds
        self.memory_limit_bytes = memory_limit_bytes
        self._slots = asyncio.Semaphore(workers)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False
        self.last_stats: WorkerStats | None = None
        self.installing_marker = INSTALLING_MARKER

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the workers now running (idle or busy)."""
        return sorted(w.pid for w in [*self._idle, *self._busy] if w.alive)

    def _missing(self) -> str | None:
        """What of transcription is not installed, if anything."""
        if not speech.engine_installed():
            return "faster-whisper is not installed"
        if self.model_dir is None and not speech.default_model_installed():
            return "the default speech model is not installed"
        return None

    async def _installed(self) -> None:
        """Returns once faster-whisper and the model are there; raises TranscriptionError
        when they are not and nothing is installing them."""
        while (missing := await asyncio.to_thread(self._missing)) is not None:
            if not self.installing():
                raise TranscriptionError(f"transcription is unavailable: {missing} (./dev installs it)")
            await asyncio.sleep(INSTALL_POLL_SECONDS)

    def installing(self) -> bool:
        """Whether faster-whisper and the model are being installed (`./dev serve`'s first start)."""
        return _installing(self.installing_marker)

    def check_model(self) -> None:
        """Raises TranscriptionError unless a model is there to load (for start-up logs)."""
        if (missing := self._missing()) is not None:
            raise TranscriptionError(missing)
        if self.model_dir is not None and not (self.model_dir / "model.bin").is_file():
            raise TranscriptionError(f"no CTranslate2 model at {self.model_dir} (model.bin is missing)")

    async def transcribe(self, *, bucket_key: str, media_format: str, job_name: str) -> Transcription | None:
        with workdirs.work_dir("speech") as workdir:
            path = Path(workdir) / f"media.{media_format or 'bin'}"
            await self.blobs.fetch_to_file(bucket_key, path)
            return await self.transcribe_file(path)

    async def transcribe_file(self, path: Path) -> Transcription | None:
        """What was said in the local file at `path`; None when nothing was."""
        async with self._slots:
            worker = await self._take()
            try:
                result = await self._run(worker, path)
            except BaseException:
                # Cancelled, timed out, or the worker broke: it holds a half-done decode.
                await worker.kill()
                raise
            finally:
                self._busy.discard(worker)
            self._put_back(worker)
            return result

    async def _run(self, worker: _Worker, path: Path) -> Transcription | None:
        assert worker.process.stdin is not None
        request = {"path": str(path), "language": self.language, "chunk_seconds": self.chunk_seconds}
        worker.process.stdin.write((json.dumps(request) + "\n").encode())
        await worker.process.stdin.drain()
        cues: list[Cue] = []
        while True:
            try:
                message = await worker.read(self.chunk_timeout_seconds)
            except TimeoutError:
                raise TranscriptionError(
                    f"transcription stopped: no progress in {self.chunk_timeout_seconds:g} s"
                ) from None
            if "error" in message:
                raise TranscriptionError(f"transcription failed: {message['error']}")
            if message.get("done"):
                seconds, rss = float(message.get("seconds") or 0.0), int(message.get("max_rss_kib") or 0)
                cpu = float(message.get("cpu_seconds") or 0.0)
                self.last_stats = WorkerStats(seconds, cpu, rss * 1024, worker.pid)
                return Transcription.of_cues(cues, message.get("language"))
            cues.extend(Cue(float(start), float(end), str(text)) for start, end, text in message["segments"])

    async def _take(self) -> _Worker:
        if self._closed:
            raise TranscriptionError("the transcriber is closed")
        while self._idle:
            worker = self._idle.pop()
            if worker.idle is not None:
                worker.idle.cancel()
            if worker.alive:
                self._busy.add(worker)
                return worker
        await self._installed()
        worker = await self._start()
        self._busy.add(worker)
        return worker

    async def _start(self) -> _Worker:
        argv = [
            sys.executable,
            "-I",
            speech.__file__,
            "--cache",
            str(self.cache_dir),
            "--memory-limit",
            str(self.memory_limit_bytes),
        ]
        if self.model_dir is not None:
            argv += ["--model", str(self.model_dir)]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,  # the worker's own diagnostics go to the server's log
                limit=_LINE_LIMIT,
            )
        except OSError as exc:
            raise TranscriptionError(f"the speech worker could not start: {exc}") from exc
        worker = _Worker(process, process.pid)
        try:
            hello = await worker.read(START_TIMEOUT_SECONDS)
        except BaseException:
            await worker.kill()
            raise
        if not hello.get("ready"):
            await worker.kill()
            raise TranscriptionError(f"the speech worker did not start: {hello}")
        log.info("speech worker %d started", worker.pid)
        return worker

    def _put_back(self, worker: _Worker) -> None:
        if self._closed or not worker.alive:
            self._in_background(worker.close())
            return
        self._idle.append(worker)
        worker.idle = asyncio.get_running_loop().call_later(self.idle_seconds, self._retire, worker)

    def _retire(self, worker: _Worker) -> None:
        if worker in self._idle:
            self._idle.remove(worker)
            self._in_background(worker.close())

    def _in_background(self, closing: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(closing)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """Stops every worker: idle ones gently, busy ones by kill (their callers see an error)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for worker in idle:
            await worker.close()
        for worker in list(self._busy):
            await worker.kill()
        for task in list(self._retiring):
            await task


def _installing(marker: Path) -> bool:
    """Whether `marker` names a process that is still alive."""
    try:
        pid = int(marker.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.asynccontextmanager
async def open_local_transcriber(
    blobs: BlobStore,
    *,
    cache_dir: Path,
    model_dir: Path | None = None,
    language: str | None = None,
    workers: int = 1,
) -> AsyncIterator[LocalTranscriber]:
    transcriber = LocalTranscriber(
        blobs, cache_dir=cache_dir, model_dir=model_dir, language=language, workers=workers
    )
    try:
        yield transcriber
    finally:
        await transcriber.close()
