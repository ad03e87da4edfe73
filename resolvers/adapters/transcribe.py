"""The transcriber port: speech in a stored media blob to text.

`Transcriber.transcribe` takes the blob's key, its container format and a job
name, and returns a `Transcription` (the text, its language and its timed
cues), or None when it heard no speech. Failures raise `TranscriptionError`.
Two adapters answer it: `resolvers.adapters.whisper.LocalTranscriber` (the
default: faster-whisper in worker processes) and `AwsTranscriber` below.

`AwsTranscriber` runs an Amazon Transcribe batch job on the blob where it lies
(`s3://<bucket>/<key>`), waits for it by polling, and reads the transcript
JSON the service writes to `s3://<output bucket>/transcripts/<job name>.json`.

Job names make retries idempotent: starting a job whose name exists
(ConflictException) reuses that job, so a retried pipeline step waits for, or
simply reads, the first attempt's result instead of paying for a second job.
The caller should derive the name from the content (the same media gives the
same name). A reused job must be for the same media URI, else the names
collide and `TranscriptionError` says so. A FAILED job stays failed under its
name: retrying it needs a new name.

Where the transcript is read from, in order:

1. the output object this adapter asked for, through the S3 client;
2. the job's `Transcript.TranscriptFileUri`, when it names another S3 object
   (read through the S3 client too: plain S3 URLs need credentials);
3. that URI over HTTP (httpx), only when it is not a plain S3 object URL,
   i.e. a presigned URL (the service-managed bucket) or an emulator endpoint.

A plain S3 URL is never fetched anonymously: on an emulator it points at real
AWS, and a bucket of the same name there is someone else's. If none of these
yields the transcript the job's result is lost (deleted, or never written, as
with moto) and `TranscriptionError` says where it looked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from store.blobs import validate_key

MEDIA_FORMATS = frozenset({"amr", "flac", "m4a", "mp3", "mp4", "ogg", "wav", "webm"})
DEFAULT_POLL_SECONDS = 5.0
DEFAULT_TIMEOUT_SECONDS = 30 * 60.0
HTTP_TIMEOUT_SECONDS = 30.0
TRANSCRIPT_PREFIX = "transcripts/"

_JOB_NAME = re.compile(r"[0-9A-Za-z._-]{1,200}")
# s3.amazonaws.com, s3.<region>.amazonaws.com, s3-<region>.amazonaws.com,
# s3.dualstack.<region>.amazonaws.com (path style), each optionally prefixed
# by "<bucket>." (virtual-hosted style); .amazonaws.com.cn in China.
_S3_HOST = re.compile(
    r"(?:(?P<bucket>[a-z0-9][a-z0-9.-]*)\.)?s3(?:[.-](?:dualstack\.)?[a-z0-9-]+)?\.amazonaws\.com(?:\.cn)?"
)


class TranscriptionError(Exception):
    """A transcription could not be done; the message says why and for which job."""


@dataclass(frozen=True)
class Cue:
    """One caption: what was said between `start` and `end` (seconds from the start)."""

    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Transcription:
    """What a transcriber heard: the text, its language (ISO 639-1, None when the
    engine did not say) and the text again in timed cues, in time order."""

    text: str
    language: str | None
    cues: tuple[Cue, ...] = ()
    # Captions the engine wrote itself (AWS Transcribe's WebVTT subtitles), kept as written.
    vtt: str | None = None

    @property
    def has_captions(self) -> bool:
        return bool(self.cues) or bool(self.vtt)

    @classmethod
    def of_cues(cls, cues: Sequence[Cue], language: str | None) -> Transcription | None:
        """The transcription made of `cues`; None when they hold no words."""
        kept = tuple(cue for cue in cues if cue.text.strip())
        text = " ".join(cue.text.strip() for cue in kept)
        return cls(text, language, kept) if text else None

    def webvtt(self) -> str:
        """The captions as a WebVTT file (text/vtt)."""
        if self.vtt is not None:
            return self.vtt
        lines = ["WEBVTT", ""]
        for number, cue in enumerate(self.cues, start=1):
            # A cue's text may not hold a blank line or "-->"; "<" and "&" would start markup.
            text = " ".join(cue.text.split()).replace("&", "&amp;").replace("<", "&lt;")
            text = text.replace("-->", "->")
            lines += [
                str(number),
                f"{_timestamp(cue.start)} --> {_timestamp(max(cue.end, cue.start))}",
                text,
                "",
            ]
        return "\n".join(lines)


def _timestamp(seconds: float) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}"


class Transcriber(Protocol):
    async def transcribe(self, *, bucket_key: str, media_format: str, job_name: str) -> Transcription | None:
        """What was said in the media blob at `bucket_key`, or None if it holds no speech.

        `media_format` is the container (mp4, m4a, mp3, wav, flac, ogg, webm,
        amr). `job_name` identifies the work: calling again with the same name
        returns the same result without transcribing again.
        """
        ...


def _error(exc: Exception) -> tuple[str, str]:
    """The (code, message) of a botocore ClientError; ("", "") for anything else."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        if isinstance(error, dict):
            return str(error.get("Code", "")), str(error.get("Message", ""))
    return "", ""


def _describe(exc: Exception) -> str:
    code, message = _error(exc)
    return f"{code}: {message}" if code else f"{type(exc).__name__}: {exc}"


def _s3_location(uri: str) -> tuple[str, str] | None:
    """(bucket, key) if `uri` is a plain (unsigned) S3 object URL, else None."""
    parts = urlsplit(uri)
    if parts.scheme != "https" or parts.query or not parts.hostname:
        return None
    match = _S3_HOST.fullmatch(parts.hostname)
    if match is None:
        return None
    path = unquote(parts.path).lstrip("/")
    bucket = match.group("bucket")
    if bucket is None:
        bucket, _, path = path.partition("/")
    if not bucket or not path:
        return None
    return bucket, path


def parse_transcript(body: bytes, source: str) -> str | None:
    """The text of an Amazon Transcribe output document; None if it is blank."""
    try:
        document = json.loads(body)
        transcripts = document["results"]["transcripts"]
        if not isinstance(transcripts, list):
            raise TypeError("results.transcripts is not a list")
        if not transcripts:
            return None
        text = transcripts[0]["transcript"]
        if not isinstance(text, str):
            raise TypeError("results.transcripts[0].transcript is not a string")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise TranscriptionError(f"malformed transcript at {source}: {exc}") from exc
    text = text.strip()
    return text or None


async def _fetch_http(uri: str) -> bytes | None:
    """The body at `uri`, or None if the server has nothing there (404/403)."""
    try:
        import httpx
    except ImportError as exc:  # httpx is not a runtime dependency yet
        raise TranscriptionError(f"cannot fetch transcript from {uri}: httpx is not installed") from exc
    try:
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_SECONDS) as client:
            response = await client.get(uri)
    except httpx.HTTPError as exc:
        raise TranscriptionError(f"cannot fetch transcript from {uri}: {exc!r}") from exc
    if response.status_code in {403, 404}:
        return None
    if response.status_code != 200:
        raise TranscriptionError(f"cannot fetch transcript from {uri}: HTTP {response.status_code}")
    return response.content


class AwsTranscriber:
    """Amazon Transcribe batch jobs on media in an S3 bucket.

    Takes open aioboto3 `transcribe` and `s3` clients (see
    `open_aws_transcriber`). Without a `language_code` the service identifies
    the language itself.
    """

    def __init__(
        self,
        transcribe_client: Any,
        s3_client: Any,
        bucket: str,
        output_bucket: str | None = None,
        *,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        language_code: str | None = None,
    ) -> None:
        if poll_seconds <= 0:
            raise ValueError("poll_seconds must be positive")
        if timeout_seconds < 0:
            raise ValueError("timeout_seconds must not be negative")
        self._transcribe = transcribe_client
        self._s3 = s3_client
        self.bucket = bucket
        self.output_bucket = output_bucket or bucket
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        self.language_code = language_code

    @staticmethod
    def output_key(job_name: str) -> str:
        """Where a job's transcript JSON goes in the output bucket."""
        return f"{TRANSCRIPT_PREFIX}{job_name}.json"

    async def transcribe(self, *, bucket_key: str, media_format: str, job_name: str) -> Transcription | None:
        validate_key(bucket_key)
        if not _JOB_NAME.fullmatch(job_name):
            raise ValueError(f"invalid transcription job name {job_name!r} (1-200 of [0-9A-Za-z._-])")
        media_format = media_format.lower()
        if media_format not in MEDIA_FORMATS:
            raise TranscriptionError(
                f"cannot transcribe {bucket_key!r}: unsupported media format {media_format!r} "
                f"(expected one of {', '.join(sorted(MEDIA_FORMATS))})"
            )
        media_uri = f"s3://{self.bucket}/{bucket_key}"
        await self._start(job_name, media_uri, media_format)
        job = await self._wait(job_name)
        text = await self._read_transcript(job_name, job)
        if text is None:
            return None
        # The service answers a locale ("es-US"); the port answers the language ("es").
        code = job.get("LanguageCode")
        language = code.split("-")[0].lower() if isinstance(code, str) and code else None
        return Transcription(text, language, vtt=await self._read_subtitles(job_name, job))

    @staticmethod
    def subtitles_key(job_name: str) -> str:
        """Where the service writes a job's WebVTT subtitles in the output bucket."""
        return f"{TRANSCRIPT_PREFIX}{job_name}.vtt"

    async def _read_subtitles(self, job_name: str, job: dict[str, Any]) -> str | None:
        """The job's WebVTT subtitles, from the output bucket or the URI the job names;
        None when there are none (captions are then left out, the transcript kept)."""
        body = await self._get_object(self.output_bucket, self.subtitles_key(job_name))
        if body is None:
            uris = (job.get("Subtitles") or {}).get("SubtitleFileUris") or []
            for uri in (u for u in uris if isinstance(u, str) and u.endswith(".vtt")):
                location = _s3_location(uri)
                if location is None:
                    body = await _fetch_http(uri)
                elif location != (self.output_bucket, self.subtitles_key(job_name)):
                    body = await self._get_object(*location)
                if body is not None:
                    break
        if body is None:
            return None
        text = body.decode("utf-8", "replace")
        return text if text.lstrip("\ufeff").startswith("WEBVTT") else None

    async def _start(self, job_name: str, media_uri: str, media_format: str) -> None:
        request: dict[str, Any] = {
            "TranscriptionJobName": job_name,
            "Media": {"MediaFileUri": media_uri},
            "MediaFormat": media_format,
            "OutputBucketName": self.output_bucket,
            "OutputKey": self.output_key(job_name),
            # The service writes WebVTT beside the transcript: <OutputKey without .json>.vtt.
            "Subtitles": {"Formats": ["vtt"], "OutputStartIndex": 1},
        }
        if self.language_code:
            request["LanguageCode"] = self.language_code
        else:
            request["IdentifyLanguage"] = True
        try:
            await self._transcribe.start_transcription_job(**request)
            return
        except Exception as exc:
            code, _ = _error(exc)
            if not code:
                raise
            if code != "ConflictException":
                raise TranscriptionError(
                    f"cannot start transcription job {job_name!r}: {_describe(exc)}"
                ) from exc
        # The name exists: a retry of the same work. Reuse the job, if it is
        # for the same media (else two contents share a name).
        existing = await self._get(job_name)
        existing_uri = (existing.get("Media") or {}).get("MediaFileUri")
        if existing_uri != media_uri:
            raise TranscriptionError(
                f"transcription job {job_name!r} already exists for {existing_uri!r}, not {media_uri!r}"
            )

    async def _get(self, job_name: str) -> dict[str, Any]:
        try:
            response = await self._transcribe.get_transcription_job(TranscriptionJobName=job_name)
        except Exception as exc:
            if not _error(exc)[0]:
                raise
            raise TranscriptionError(f"cannot get transcription job {job_name!r}: {_describe(exc)}") from exc
        return dict(response["TranscriptionJob"])

    async def _wait(self, job_name: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            job = await self._get(job_name)
            status = job.get("TranscriptionJobStatus")
            if status == "COMPLETED":
                return job
            if status == "FAILED":  # AWS Transcribe's job status, not one of ours
                reason = job.get("FailureReason") or "no reason given"
                raise TranscriptionError(f"transcription job {job_name!r} failed: {reason}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TranscriptionError(
                    f"transcription job {job_name!r} still {status or 'pending'} "
                    f"after {self.timeout_seconds:g} s"
                )
            await asyncio.sleep(min(self.poll_seconds, remaining))

    async def _get_object(self, bucket: str, key: str) -> bytes | None:
        try:
            response = await self._s3.get_object(Bucket=bucket, Key=key)
        except Exception as exc:
            code, _ = _error(exc)
            if code in {"NoSuchKey", "404", "NotFound"}:
                return None
            if not code:
                raise
            raise TranscriptionError(f"cannot read transcript s3://{bucket}/{key}: {_describe(exc)}") from exc
        async with response["Body"] as stream:
            body: bytes = await stream.read()
        return body

    async def _read_transcript(self, job_name: str, job: dict[str, Any]) -> str | None:
        expected = (self.output_bucket, self.output_key(job_name))
        tried = [f"s3://{expected[0]}/{expected[1]}"]
        body = await self._get_object(*expected)
        if body is not None:
            return parse_transcript(body, tried[0])
        uri = (job.get("Transcript") or {}).get("TranscriptFileUri")
        if isinstance(uri, str) and uri:
            location = _s3_location(uri)
            if location is None:
                tried.append(uri)
                body = await _fetch_http(uri)
                if body is not None:
                    return parse_transcript(body, uri)
            elif location != expected:
                tried.append(f"s3://{location[0]}/{location[1]}")
                body = await self._get_object(*location)
                if body is not None:
                    return parse_transcript(body, tried[-1])
        raise TranscriptionError(
            f"transcription job {job_name!r} completed but its transcript is not at {' nor '.join(tried)}"
            + (f" (TranscriptFileUri {uri})" if isinstance(uri, str) and uri else "")
        )


@contextlib.asynccontextmanager
async def open_aws_transcriber(
    bucket: str,
    endpoint_url: str | None = None,
    region: str = "us-east-1",
    *,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    output_bucket: str | None = None,
    language_code: str | None = None,
) -> AsyncIterator[AwsTranscriber]:
    """Open the Transcribe and S3 clients once for the process.

    Credentials come from the usual chain. With an `endpoint_url` (moto,
    LocalStack) both clients use it, S3 with path-style addressing. The
    buckets must exist (`open_s3_blob_store` makes the media bucket).
    """
    import aioboto3
    from aiobotocore.config import AioConfig

    s3_config = AioConfig(
        signature_version="s3v4",
        s3={"addressing_style": "path" if endpoint_url else "auto"},
    )
    session = aioboto3.Session()
    async with (
        session.client("transcribe", endpoint_url=endpoint_url, region_name=region) as transcribe_client,
        session.client("s3", endpoint_url=endpoint_url, region_name=region, config=s3_config) as s3_client,
    ):
        yield AwsTranscriber(
            transcribe_client,
            s3_client,
            bucket,
            output_bucket,
            poll_seconds=poll_seconds,
            timeout_seconds=timeout_seconds,
            language_code=language_code,
        )
