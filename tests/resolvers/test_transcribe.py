"""resolvers.adapters.transcribe against a real moto_server (Transcribe and S3).

What moto 5 does with a transcription job (checked here, see the first test):
StartTranscriptionJob answers without a status; each GetTranscriptionJob
moves it one step, QUEUED -> IN_PROGRESS -> COMPLETED, then it stays
COMPLETED. The completed job's Transcript.TranscriptFileUri is
https://s3.<region>.amazonaws.com/<OutputBucketName>/<OutputKey>, a real AWS
address, and moto writes no object there nor anywhere else, so it produces no
transcript text. It never fails a job (no FAILED transition, any media URI is
accepted), so the FAILED path is not exercised here.

The other tests play the service's part by writing the transcript document
(Amazon Transcribe's output format) to the output key, as AWS does when it
completes a job.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aioboto3
import pytest

from resolvers.adapters.transcribe import (
    AwsTranscriber,
    Transcriber,
    Transcription,
    TranscriptionError,
    open_aws_transcriber,
)
from tests import media_factory as mf
from tests.conftest import AWS_REGION

POLL = 0.05
MEDIA_KEY = "media/clip.m4a"


def _text(heard: Transcription | None) -> str | None:
    return heard.text if heard is not None else None


def _job_name() -> str:
    return f"job-{uuid.uuid4().hex}"  # moto keeps jobs for the whole session


@pytest.fixture(scope="module")
def bucket() -> str:
    return f"transcribe-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
async def clients(moto_server: str, bucket: str) -> AsyncIterator[tuple[Any, Any]]:
    """Raw (s3, transcribe) clients, for setting up and checking what the adapter did."""
    session = aioboto3.Session()
    async with (
        session.client("s3", endpoint_url=moto_server, region_name=AWS_REGION) as s3,
        session.client("transcribe", endpoint_url=moto_server, region_name=AWS_REGION) as transcribe,
    ):
        await s3.create_bucket(Bucket=bucket)
        yield s3, transcribe


@pytest.fixture(scope="module")
async def media(clients: tuple[Any, Any], bucket: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    s3, _ = clients
    clip = mf.make_audio_clip(tmp_path_factory.mktemp("transcribe"), "clip.m4a", seconds=0.5)
    await s3.put_object(Bucket=bucket, Key=MEDIA_KEY, Body=clip.read_bytes(), ContentType="audio/mp4")
    return MEDIA_KEY


@pytest.fixture(scope="module")
async def transcriber(moto_server: str, bucket: str, media: str) -> AsyncIterator[AwsTranscriber]:
    async with open_aws_transcriber(bucket, moto_server, AWS_REGION, poll_seconds=POLL) as adapter:
        yield adapter


def _transcript_document(job_name: str, text: str) -> bytes:
    """What Amazon Transcribe writes to OutputKey (trimmed to the fields that matter)."""
    document = {
        "jobName": job_name,
        "accountId": "123456789012",
        "status": "COMPLETED",
        "results": {"transcripts": [{"transcript": text}], "items": []},
    }
    return json.dumps(document).encode()


async def _write_transcript(s3: Any, bucket: str, key: str, job_name: str, text: str) -> None:
    await s3.put_object(
        Bucket=bucket, Key=key, Body=_transcript_document(job_name, text), ContentType="application/json"
    )


async def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    response = await s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for item in response.get("Contents", [])]


def test_aws_transcriber_answers_the_transcriber_port(transcriber: AwsTranscriber) -> None:
    """The pipeline calls `transcribe` with the port's keyword arguments; the
    adapter must take exactly those and be awaitable."""
    import inspect

    ours = inspect.signature(transcriber.transcribe)
    port = inspect.signature(Transcriber.transcribe)
    assert inspect.iscoroutinefunction(transcriber.transcribe)
    assert list(ours.parameters) == [name for name in port.parameters if name != "self"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours.parameters.values())


async def test_moto_job_completes_without_a_transcript(
    clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, transcribe = clients
    name = _job_name()
    started = await transcribe.start_transcription_job(
        TranscriptionJobName=name,
        Media={"MediaFileUri": f"s3://{bucket}/{media}"},
        MediaFormat="m4a",
        IdentifyLanguage=True,
        OutputBucketName=bucket,
        OutputKey=f"transcripts/{name}.json",
    )
    assert "TranscriptionJobStatus" not in started["TranscriptionJob"]
    statuses = []
    for _ in range(4):
        job = (await transcribe.get_transcription_job(TranscriptionJobName=name))["TranscriptionJob"]
        statuses.append(job["TranscriptionJobStatus"])
    assert statuses == ["QUEUED", "IN_PROGRESS", "COMPLETED", "COMPLETED"]
    assert job["Transcript"] == {
        "TranscriptFileUri": f"https://s3.{AWS_REGION}.amazonaws.com/{bucket}/transcripts/{name}.json"
    }
    assert job["LanguageCode"] == "en-US"  # moto's "identified" language
    assert "FailureReason" not in job
    assert await _keys(s3, bucket, "transcripts/") == []


async def test_adapter_reports_the_missing_transcript_moto_leaves(
    transcriber: AwsTranscriber, clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    _, transcribe = clients
    name = _job_name()
    with pytest.raises(TranscriptionError) as caught:
        await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name)
    assert str(caught.value) == (
        f"transcription job {name!r} completed but its transcript is not at "
        f"s3://{bucket}/transcripts/{name}.json "
        f"(TranscriptFileUri https://s3.{AWS_REGION}.amazonaws.com/{bucket}/transcripts/{name}.json)"
    )
    job = (await transcribe.get_transcription_job(TranscriptionJobName=name))["TranscriptionJob"]
    assert job["TranscriptionJobStatus"] == "COMPLETED"


async def test_transcribe_runs_a_job_and_reads_its_transcript(
    transcriber: AwsTranscriber, clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, transcribe = clients
    name = _job_name()
    await _write_transcript(s3, bucket, f"transcripts/{name}.json", name, " Hola, abuela. ")

    text = await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name)

    assert _text(text) == "Hola, abuela."
    job = (await transcribe.get_transcription_job(TranscriptionJobName=name))["TranscriptionJob"]
    assert job["TranscriptionJobStatus"] == "COMPLETED"
    assert job["Media"] == {"MediaFileUri": f"s3://{bucket}/{media}"}
    assert job["MediaFormat"] == "m4a"
    assert job["IdentifyLanguage"] is True
    assert job["Transcript"]["TranscriptFileUri"].endswith(f"/{bucket}/transcripts/{name}.json")

    # No subtitles were written: the transcript comes without captions.
    assert text is not None and text.vtt is None and not text.has_captions
    assert job["Subtitles"]["Formats"] == ["vtt"]

    # A retry with the same name reuses the job (ConflictException) and reads the same result.
    again = await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name)
    assert _text(again) == "Hola, abuela."
    listed = await transcribe.list_transcription_jobs(JobNameContains=name)
    assert [summary["TranscriptionJobName"] for summary in listed["TranscriptionJobSummaries"]] == [name]


async def test_retry_while_the_job_is_still_running_waits_for_it(
    transcriber: AwsTranscriber, clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, transcribe = clients
    name = _job_name()
    await transcribe.start_transcription_job(
        TranscriptionJobName=name,
        Media={"MediaFileUri": f"s3://{bucket}/{media}"},
        MediaFormat="m4a",
        IdentifyLanguage=True,
        OutputBucketName=bucket,
        OutputKey=f"transcripts/{name}.json",
    )
    await _write_transcript(s3, bucket, f"transcripts/{name}.json", name, "first attempt")
    assert (
        _text(await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name))
        == "first attempt"
    )


async def test_no_speech_is_none(
    transcriber: AwsTranscriber, clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, _ = clients
    name = _job_name()
    await _write_transcript(s3, bucket, f"transcripts/{name}.json", name, "")
    assert await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name) is None


async def test_a_job_name_taken_by_other_media_is_an_error(
    transcriber: AwsTranscriber, clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, _ = clients
    name = _job_name()
    await _write_transcript(s3, bucket, f"transcripts/{name}.json", name, "uno")
    assert _text(await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name)) == "uno"
    with pytest.raises(TranscriptionError) as caught:
        await transcriber.transcribe(bucket_key="media/other.m4a", media_format="m4a", job_name=name)
    assert str(caught.value) == (
        f"transcription job {name!r} already exists for 's3://{bucket}/{media}', "
        f"not 's3://{bucket}/media/other.m4a'"
    )


async def test_configured_language_code_is_sent_instead_of_identification(
    clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, transcribe = clients
    adapter = AwsTranscriber(transcribe, s3, bucket, poll_seconds=POLL, language_code="es-US")
    name = _job_name()
    await _write_transcript(s3, bucket, f"transcripts/{name}.json", name, "buenos días")
    assert (
        _text(await adapter.transcribe(bucket_key=media, media_format="m4a", job_name=name)) == "buenos días"
    )
    job = (await transcribe.get_transcription_job(TranscriptionJobName=name))["TranscriptionJob"]
    assert job["LanguageCode"] == "es-US"
    assert "IdentifyLanguage" not in job


async def test_a_separate_output_bucket(clients: tuple[Any, Any], bucket: str, media: str) -> None:
    s3, transcribe = clients
    output = f"{bucket}-out"
    await s3.create_bucket(Bucket=output)
    adapter = AwsTranscriber(transcribe, s3, bucket, output, poll_seconds=POLL)
    name = _job_name()
    await _write_transcript(s3, output, f"transcripts/{name}.json", name, "otro cubo")
    assert _text(await adapter.transcribe(bucket_key=media, media_format="m4a", job_name=name)) == "otro cubo"
    job = (await transcribe.get_transcription_job(TranscriptionJobName=name))["TranscriptionJob"]
    assert job["Transcript"]["TranscriptFileUri"].endswith(f"/{output}/transcripts/{name}.json")


async def test_timeout_is_an_error(clients: tuple[Any, Any], bucket: str, media: str) -> None:
    s3, transcribe = clients
    adapter = AwsTranscriber(transcribe, s3, bucket, poll_seconds=POLL, timeout_seconds=0)
    name = _job_name()
    with pytest.raises(TranscriptionError) as caught:
        await adapter.transcribe(bucket_key=media, media_format="m4a", job_name=name)
    assert str(caught.value) == f"transcription job {name!r} still QUEUED after 0 s"


async def test_the_language_and_the_subtitles_come_from_the_job(
    transcriber: AwsTranscriber, clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, transcribe = clients
    name = _job_name()
    await _write_transcript(s3, bucket, f"transcripts/{name}.json", name, "Hola, abuela.")
    vtt = "WEBVTT\n\n1\n00:00:00.000 --> 00:00:01.500\nHola, abuela.\n"
    # Where AWS writes them: the OutputKey with .vtt for .json (moto names the same URI).
    await s3.put_object(
        Bucket=bucket, Key=f"transcripts/{name}.vtt", Body=vtt.encode(), ContentType="text/vtt"
    )

    heard = await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name=name)

    assert heard is not None and heard.text == "Hola, abuela."
    job = (await transcribe.get_transcription_job(TranscriptionJobName=name))["TranscriptionJob"]
    assert job["Subtitles"]["SubtitleFileUris"][0].endswith(f"/{bucket}/transcripts/{name}.vtt")
    # The identified locale (moto's is en-US) as the port's ISO 639-1 language.
    assert job["LanguageCode"].split("-")[0] == heard.language == "en"
    assert heard.has_captions and heard.webvtt() == vtt


async def test_unsupported_media_format_is_an_error(transcriber: AwsTranscriber, media: str) -> None:
    with pytest.raises(TranscriptionError, match=r"unsupported media format 'mov'"):
        await transcriber.transcribe(bucket_key=media, media_format="mov", job_name=_job_name())


async def test_invalid_job_name_is_refused(transcriber: AwsTranscriber, media: str) -> None:
    with pytest.raises(ValueError, match="invalid transcription job name"):
        await transcriber.transcribe(bucket_key=media, media_format="m4a", job_name="no spaces")


class _PresignedTranscriptUri:
    """The real moto Transcribe client, except that a completed job's TranscriptFileUri is an
    HTTP URL on moto_server (as AWS gives for its service-managed bucket: a presigned URL)."""

    def __init__(self, inner: Any, uri: str) -> None:
        self._inner = inner
        self._uri = uri

    async def start_transcription_job(self, **kwargs: Any) -> Any:
        return await self._inner.start_transcription_job(**kwargs)

    async def get_transcription_job(self, **kwargs: Any) -> Any:
        response = await self._inner.get_transcription_job(**kwargs)
        job = response["TranscriptionJob"]
        if "Transcript" in job:
            job["Transcript"] = {"TranscriptFileUri": self._uri}
        return response


async def test_falls_back_to_fetching_the_transcript_uri_over_http(
    clients: tuple[Any, Any], bucket: str, media: str
) -> None:
    s3, transcribe = clients
    name = _job_name()
    elsewhere = f"service-output/{name}/asrOutput.json"
    await _write_transcript(s3, bucket, elsewhere, name, "por http")
    uri = await s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": elsewhere})
    adapter = AwsTranscriber(_PresignedTranscriptUri(transcribe, uri), s3, bucket, poll_seconds=POLL)
    assert _text(await adapter.transcribe(bucket_key=media, media_format="m4a", job_name=name)) == "por http"


async def test_http_fallback_that_finds_nothing_is_an_error(
    clients: tuple[Any, Any], bucket: str, media: str, moto_server: str
) -> None:
    s3, transcribe = clients
    name = _job_name()
    uri = f"{moto_server}/{bucket}/nowhere/{name}.json"
    adapter = AwsTranscriber(_PresignedTranscriptUri(transcribe, uri), s3, bucket, poll_seconds=POLL)
    with pytest.raises(TranscriptionError) as caught:
        await adapter.transcribe(bucket_key=media, media_format="m4a", job_name=name)
    assert str(caught.value) == (
        f"transcription job {name!r} completed but its transcript is not at "
        f"s3://{bucket}/transcripts/{name}.json nor {uri} (TranscriptFileUri {uri})"
    )
