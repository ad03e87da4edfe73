"""The table stalls (moto_server under SIGSTOP) for longer than the operation
deadline, under a real server process, while writers retry with an
Idempotency-Key: every answer during the stall is UNAVAILABLE (a read with
`retryAfter`, a write with `outcome: "UNKNOWN"`), none is BAD_USER_INPUT, and
once the table is back each comment is stored exactly once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from resolvers.adapters.webpush import new_private_key
from resolvers.core.auth import mint_token
from store import items, keys
from store.dynamodb import DynamoTable, create_table, open_dynamo_table
from tests.factories import family_rows
from tests.servers import SECRET, ServerProcess, moto_server_process, until

DEADLINE = 2.0
WRITERS = 8
COMMENT = "mutation($id: ID!, $b: String!) { addComment(contentId: $id, body: $b) { id body } }"


@pytest.fixture
def moto(aws_env: None, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with moto_server_process(tmp_path) as found:
        yield found


@pytest.fixture
async def table(moto: tuple[str, subprocess.Popen[bytes]]) -> AsyncIterator[DynamoTable]:
    name = f"stall-{uuid.uuid4().hex[:8]}"
    async with open_dynamo_table(name, moto[0], "us-east-1") as opened:
        assert isinstance(opened, DynamoTable)
        await create_table(opened.client, name)
        yield opened


async def gql(
    server: ServerProcess, user: str, query: str, variables: dict[str, Any], key: str | None = None
) -> Any:
    headers = {"Authorization": f"Bearer {mint_token(SECRET, user, given_name=user)}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{server.url}/graphql", json={"query": query, "variables": variables}, headers=headers
        )
    return response.json()


def codes(answer: dict[str, Any]) -> list[str]:
    return [error["extensions"]["code"] for error in answer.get("errors") or ()]


async def test_a_stalled_table_answers_unavailable_and_retries_apply_once(
    moto: tuple[str, subprocess.Popen[bytes]], table: DynamoTable, tmp_path: Path
) -> None:
    url, process = moto
    run = uuid.uuid4().hex[:6]
    writers = [f"w{n}x{run}" for n in range(WRITERS)]
    family_id, post = f"fam{run}", f"post{run}"
    await table.batch_write(family_rows(family_id, "ana", writers))
    now = items.iso(datetime.now(UTC))
    content = items.Content(
        id=post,
        family_id=family_id,
        author_id="ana",
        type="TEXT",
        status="READY",
        mime_type="text/plain",
        size_bytes=4,
        created_at=now,
        in_feed=True,
        ready_at=now,
        media_key=f"content/{post}/original",
    )
    await table.put(content.to_item())
    server = ServerProcess(
        tmp_path / "server",
        {
            "MIFAMILIAS_AUTH_SECRET": SECRET,
            "MIFAMILIAS_DYNAMODB_ENDPOINT": url,
            "MIFAMILIAS_AWS_REGION": "us-east-1",
            "MIFAMILIAS_TABLE_NAME": table.table_name,
            "MIFAMILIAS_UNLOCK_SHARDS": "1",
            "MIFAMILIAS_VAPID_PRIVATE_KEY": new_private_key(),
            "MIFAMILIAS_OPERATION_DEADLINE_SECONDS": str(DEADLINE),
        },
    ).start()
    answers: dict[str, list[dict[str, Any]]] = {writer: [] for writer in writers}
    reads: list[dict[str, Any]] = []
    try:
        for writer in writers:  # each has a profile before the stall
            assert "errors" not in await gql(server, writer, "{ me { id } }", {})

        async def write(writer: str) -> None:
            key = f"comment-of-{writer}"
            while True:
                answer = await gql(server, writer, COMMENT, {"id": post, "b": f"de {writer}"}, key)
                answers[writer].append(answer)
                if "UNAVAILABLE" not in codes(answer):
                    return
                await asyncio.sleep(0.2)  # a client's pause between retries

        process.send_signal(signal.SIGSTOP)
        try:
            tasks = [asyncio.create_task(write(writer)) for writer in writers]
            reads.append(
                await gql(server, "ana", "query($id: ID!) { content(id: $id) { id } }", {"id": post})
            )
            await until(
                lambda: all(len(found) >= 2 for found in answers.values()), "two answers per writer", 120
            )
        finally:
            process.send_signal(signal.SIGCONT)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finally:
        server.stop()

    read = reads[0]["errors"][0]
    assert read["extensions"]["code"] == "UNAVAILABLE" and read["extensions"]["retryAfter"] > 0
    everything = [answer for found in answers.values() for answer in found]
    assert not any("BAD_USER_INPUT" in codes(answer) for answer in everything), everything
    for writer, found in answers.items():
        stalled = [answer for answer in found if codes(answer) == ["UNAVAILABLE"]]
        assert len(stalled) >= 2, (writer, found)
        assert all(answer["errors"][0]["extensions"]["outcome"] == "UNKNOWN" for answer in stalled)
        last = found[-1]
        # The last answer: the comment, or (its answer lost) that it was applied.
        assert "errors" not in last or codes(last) == ["CONFLICT"], last
    stored = await table.query(keys.content_pk(post), None, limit=100)
    bodies = Counter(item["body"] for item in stored.items if item.get("type") == "Comment")
    assert bodies == Counter(f"de {writer}" for writer in writers)
    counted = await table.get(content.key)
    assert counted is not None and counted["commentCount"] == WRITERS
