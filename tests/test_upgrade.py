"""Upgrades that keep the data, on both engines.

Each directory `tests/fixtures/format-<N>/` holds the data a release left
(made by `tests/fixtures/make_release_fixture.py` with that release's code),
with leases a process of the release before it holds, as a rolling upgrade
finds them. This code opens each one, a copy of the SQLite file or its items
loaded as they are into a fresh DynamoDB table, and must:

- answer the recorded GraphQL queries as the release that made the data did;
- honour the previous format's leases: while one lives, nothing here runs its
  item; once it has run out, the item runs exactly once, however many
  processes try (docs/operations.md, "Upgrading").

And every item a typical session writes (`tests/typical_calls.py`) says the
format it was written in (`store.formats`), whatever wrote it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from resolvers.core import leases
from resolvers.core.config import Settings
from resolvers.domain import mail
from resolvers.processes.exports import ExportBuilder
from resolvers.processes.mailer import Mailer
from store import formats
from store.dynamodb import DynamoTable, serialize_item
from store.items import parse_iso
from store.port import Table
from tests.api.conftest import Api, dump, running_api
from tests.clock import FakeClock
from tests.servers import SECRET
from tests.typical_calls import VIEWERS, build_world, operations, settle

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RELEASES = sorted(path.name for path in FIXTURES.glob("format-*") if path.is_dir())
ENGINES = ("sqlite", "dynamodb")


@dataclass
class Upgraded:
    api: Api
    expected: dict[str, Any]


def load_items(directory: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((directory / "items.json").read_text(encoding="utf-8"))
    return items


def items_loader(directory: Path) -> Any:
    """Puts the fixture's items into an empty DynamoDB table as they are: past
    the engine, which would stamp them with this release's format."""

    async def load(table: Table) -> None:
        assert isinstance(table, DynamoTable)
        items = load_items(directory)
        for start in range(0, len(items), 25):
            requests = [{"PutRequest": {"Item": serialize_item(item)}} for item in items[start : start + 25]]
            response = await table.client.batch_write_item(RequestItems={table.table_name: requests})
            assert not response.get("UnprocessedItems"), response

    return load


@pytest.fixture(
    params=[(engine, release) for release in RELEASES for engine in ENGINES], ids=lambda p: "-".join(p)
)
async def upgraded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Upgraded]:
    """This code's app on a release's data, its clock at the moment the data was made."""
    engine, release = request.param
    directory = FIXTURES / release
    expected = json.loads((directory / "expected.json").read_text(encoding="utf-8"))
    prepare = None
    if engine == "sqlite":
        shutil.copyfile(directory / "table.sqlite3", tmp_path / "table.sqlite3")
    else:
        prepare = items_loader(directory)
    clock = FakeClock(datetime.fromisoformat(expected["now"]))
    async with running_api(engine, "local", tmp_path, request, clock=clock, prepare=prepare) as api:
        yield Upgraded(api, expected)


def test_there_is_data_of_a_release_to_open() -> None:
    assert RELEASES, "no tests/fixtures/format-*/: run tests/fixtures/make_release_fixture.py"


@pytest.mark.parametrize("release", RELEASES)
async def test_the_fixtures_file_and_items_hold_the_same_data(release: str, tmp_path: Path) -> None:
    directory = FIXTURES / release
    shutil.copyfile(directory / "table.sqlite3", tmp_path / "table.sqlite3")
    from store.sqlite import SqliteTable

    table = SqliteTable(tmp_path / "table.sqlite3")
    try:
        in_file = await dump(table)
    finally:
        await table.close()
    assert in_file == {(item["PK"], item["SK"]): item for item in load_items(directory)}


async def test_the_data_answers_as_it_did(upgraded: Upgraded) -> None:
    api, queries = upgraded.api, upgraded.expected["queries"]
    assert queries
    differing = []
    for query in queries:
        body = await api.post(query["query"], query["variables"], as_=query["viewer"])
        answer = {name: body[name] for name in ("data", "errors") if name in body}
        if answer != query["answer"]:
            differing.append((query["viewer"], query["query"], answer, query["answer"]))
    assert differing == []


class Outbox:
    """A sender that keeps what it is given (the mailer's `Sender`)."""

    def __init__(self) -> None:
        self.sent: list[EmailMessage] = []

    async def send(self, message: EmailMessage) -> None:
        self.sent.append(message)

    def to(self, person: str) -> list[EmailMessage]:
        return [message for message in self.sent if f"{person}@example.org" in str(message["To"])]


def mailers(api: Api, outbox: Outbox, tmp_path: Path, count: int) -> list[Mailer]:
    """Mailers of as many processes of this release, sending into `outbox`."""
    settings = Settings(
        data_dir=tmp_path / "mailers",
        auth_secret=SECRET,
        smtp_url="smtp://127.0.0.1:9",
        mail_from="MiFamilias <hola@mifamilias.test>",
    )
    return [Mailer(table=api.table, settings=settings, clock=api.clock, sender=outbox) for _ in range(count)]


async def test_a_capsule_email_the_previous_release_holds_is_sent_once_after_its_lease(
    upgraded: Upgraded, tmp_path: Path
) -> None:
    api, held = upgraded.api, upgraded.expected["leases"]["mail"]
    # The pusher leases the same notes; what it pushes is not this test's.
    await api.services.pusher.stop()
    key, person, until = (held["key"][0], held["key"][1]), held["to"], parse_iso(held["until"])
    outbox = Outbox()
    these = mailers(api, outbox, tmp_path, 2)

    await asyncio.gather(*(mailer.run_once() for mailer in these))
    assert outbox.to(person) == []  # its lease lives: not sent by this release
    item = await api.table.get(key)
    assert item is not None and item.get(leases.PREVIOUS_UNTIL) == held["until"]
    others = [message for message in outbox.sent if person not in str(message["To"])]
    assert others, "an opening nobody held went at once"

    api.clock.moment = until + timedelta(seconds=1)  # the previous release's process died
    await asyncio.gather(*(mailer.run_once() for mailer in these))
    await asyncio.gather(*(mailer.run_once() for mailer in these))
    (message,) = outbox.to(person)  # once: not lost, not twice
    assert message["Message-ID"]
    assert [message for message in outbox.sent if person not in str(message["To"])] == others
    item = await api.table.get(key)
    assert item is not None and item["mailState"] == "SENT"
    assert not {leases.PREVIOUS_UNTIL, leases.PREVIOUS_OWNER} & set(item)
    assert leases.attempts(item, mail.PREVIOUS_ATTEMPTS) == 2  # its claim and ours
    assert formats.format_of(item) == formats.CURRENT


async def export_status(api: Api, person: str, export_id: str) -> str:
    query = "query($id: ID!) { dataExport(id: $id) { status } }"
    return str((await api.ok(query, {"id": export_id}, as_=person))["dataExport"]["status"])


async def test_an_export_the_previous_release_holds_is_built_once_after_its_lease(
    upgraded: Upgraded,
) -> None:
    api, found = upgraded.api, upgraded.expected["leases"]
    own = api.services.exports
    await own.stop()  # its start-up recovery has run: the builds here are the test's
    builders = [
        own,
        ExportBuilder(
            table=api.table, blobs=api.services.blobs, settings=api.services.settings, clock=api.clock
        ),
    ]
    held = found["export"]
    assert [await builder.build(held["user"], held["id"]) for builder in builders] == [False, False]
    assert await export_status(api, held["user"], held["id"]) == "PENDING"

    api.clock.moment = parse_iso(held["until"]) + timedelta(seconds=1)
    built = await asyncio.gather(*(builder.build(held["user"], held["id"]) for builder in builders))
    assert sorted(built) == [False, True]
    assert await export_status(api, held["user"], held["id"]) == "READY"
    assert [await builder.build(held["user"], held["id"]) for builder in builders] == [False, False]

    # Claimed as many times as an export gets by builds of the previous release
    # that died: given up, never built again.
    given_up = found["export_given_up"]
    for builder in builders:
        await builder.build(given_up["user"], given_up["id"])
    assert await export_status(api, given_up["user"], given_up["id"]) == "FAILED"


@pytest.mark.parametrize("engine", ENGINES)
async def test_every_item_a_typical_session_writes_says_its_format(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async with running_api(engine, "local", tmp_path, request) as api:
        world = await build_world(api, api.clock)
        await api.sign_in(*VIEWERS)
        for op in operations(api, world):
            variables = await op.setup() if op.setup else {}
            await api.ok(op.document, variables, as_=op.viewer)
        await settle(api)
        await api.services.pusher.stop()
        items = await dump(api.table)
    # A session's worth: records of every kind it writes, index and counter items.
    kinds = {str(item.get("type")) for item in items.values()}
    assert len(items) > 200 and len(kinds) > 20, (len(items), sorted(kinds))
    found = {key: item.get(formats.ATTRIBUTE) for key, item in items.items()}
    assert {key: stamp for key, stamp in found.items() if stamp != formats.CURRENT} == {}
