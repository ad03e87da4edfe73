"""Section 4: unlock throughput. Capsules with two recipients each, all due at
once, opened by UnlockScheduler.run_once in-process: capsules per second to
AVAILABLE (with their notifications) on the embedded store, and store calls
per capsule on DynamoDB (moto_server), counted through CountingTable.

The embedded store's baseline, from the same round: SQLite alone writing the
rows the pass wrote, in the same commits, into a copy of the table as it was
before the pass (no reads, no conditions, no Python of ours). Capsules per
second depend on the machine; the baseline, from the same machine and round,
says how much of a pass is SQLite's own writing and how much is ours."""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import Row, Sizes, Stats, bench_settings, now, ratio_stats, verdict
from resolvers.adapters.broker import InProcessBroker
from resolvers.core.context import utc_now
from resolvers.core.heap import settle_after_start
from resolvers.processes.scheduler import UnlockScheduler
from store import keys
from store.port import Table
from tests.counting import CountingTable
from tests.factories import capsule_rows, family_rows

SECTION = "4. Unlock throughput"
SHARDS = 8


def scheduler_for(table: Table, data_dir: Path) -> UnlockScheduler:
    return UnlockScheduler(
        table=table, broker=InProcessBroker(), settings=bench_settings(data_dir), clock=utc_now
    )


async def seed(table: Table, count: int) -> list[tuple[str, str]]:
    family_id = f"fam{uuid.uuid4().hex[:8]}"
    recipients = [f"r{n}{family_id}" for n in range(6)]
    creator = f"c{family_id}"
    rows: list[dict[str, Any]] = family_rows(family_id, creator, recipients)
    due = datetime.now(UTC) - timedelta(seconds=1)
    capsule_keys = []
    for n in range(count):
        chosen = (recipients[n % 6], recipients[(n + 1) % 6])
        capsule_id, more = capsule_rows(family_id, creator, chosen, due, SHARDS, tag=f"{n:05d}")
        rows += more
        capsule_keys.append(keys.capsule(capsule_id))
    for start in range(0, len(rows), 1000):
        await table.batch_write(rows[start : start + 1000])
    return capsule_keys


async def check(table: Table, capsule_keys: list[tuple[str, str]]) -> int:
    """How many of the capsules are AVAILABLE with their notifications sent."""
    done = 0
    for start in range(0, len(capsule_keys), 100):
        found = await table.batch_get(capsule_keys[start : start + 100])
        done += sum(
            1 for item in found.values() if item["status"] == "AVAILABLE" and item["notificationSent"]
        )
    return done


async def one_pass(
    table: Table, scheduler: UnlockScheduler, capsule_keys: list[tuple[str, str]]
) -> tuple[float, int]:
    start = now()
    unlocked = 0
    for _ in range(5):  # one pass should do; a failed step is retried by the next
        unlocked += (await scheduler.run_once()).unlocked
        if unlocked >= len(capsule_keys):
            break
    elapsed = now() - start
    return elapsed, unlocked


@contextlib.contextmanager
def under_the_servers_collector() -> Iterator[None]:
    """The pass runs in this process as in a server's: a server tunes its
    collector and freezes its heap once started (`settle_after_start`), and
    without that the same pass spent a tenth of its time in full collections
    walking this process's modules. Put back after, for the other sections."""
    thresholds = gc.get_threshold()
    settle_after_start()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@dataclass(frozen=True)
class OnSqlite:
    capsules_per_second: float
    # The same rows and commits written by SQLite alone (`written_alone`).
    alone_per_second: float


class Commits:
    """The writes an embedded table commits, group by group, as `_Changes`
    (store.sqlite): the writer's own apply and commit, wrapped. For the bench
    alone: the server has no use for a record of its writes."""

    def __init__(self, table: Any) -> None:
        self.groups: list[list[Any]] = []
        writer = table._writer
        apply, commit = writer._apply, writer._commit

        def recording_commit(db: sqlite3.Connection, group: list[Any]) -> Any:
            self.groups.append([])
            return commit(db, group)

        def recording_apply(db: sqlite3.Connection, changes: Any) -> None:
            self.groups[-1].append(changes)
            apply(db, changes)

        writer._commit, writer._apply = recording_commit, recording_apply


def written_alone(path: Path, groups: list[list[Any]]) -> float:
    """Seconds SQLite takes to write `groups` into the table at `path`, each
    group one transaction, with the connection settings of the loop's own."""
    from store.sqlite import _apply, _connect

    if not groups:
        raise RuntimeError("no commit of the pass was recorded: has the writer's apply or commit changed?")
    db = _connect(str(path), timeout=0)
    try:
        db.execute("PRAGMA wal_autocheckpoint=0")
        start = now()
        for group in groups:
            db.execute("BEGIN IMMEDIATE")
            for changes in group:
                _apply(db, changes)
            db.execute("COMMIT")
        return now() - start
    finally:
        db.close()


def copy_of(path: Path, to: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as source, contextlib.closing(sqlite3.connect(to)) as copy:
        source.backup(copy)
        copy.execute("PRAGMA journal_mode=WAL")


async def embedded(sizes: Sizes, tmp: Path) -> list[OnSqlite]:
    return [await _embedded_round(sizes, tmp, r) for r in range(sizes.unlock_rounds)]


async def _embedded_round(sizes: Sizes, tmp: Path, r: int) -> OnSqlite:
    from store.sqlite import SqliteTable

    data_dir = tmp / f"unlock-{r}"
    data_dir.mkdir(parents=True, exist_ok=True)
    table = SqliteTable(data_dir / "table.sqlite3")
    try:
        capsule_keys = await seed(table, sizes.unlock_capsules)
        copy_of(data_dir / "table.sqlite3", data_dir / "alone.sqlite3")
        commits = Commits(table)
        elapsed, unlocked = await one_pass(table, scheduler_for(table, data_dir), capsule_keys)
        opened = await check(table, capsule_keys)
        if opened != len(capsule_keys):
            raise RuntimeError(f"only {opened} of {len(capsule_keys)} capsules opened")
    finally:
        await table.close()
    # The pass's own commits: the check's reads write nothing, and closing commits nothing.
    alone = written_alone(data_dir / "alone.sqlite3", commits.groups)
    return OnSqlite(unlocked / elapsed, unlocked / alone)


def use_moto_credentials() -> None:
    """moto's test credentials, for this process and the servers it starts."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_CONFIG_FILE", "/dev/null"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
    ):
        os.environ[name] = value


@contextlib.asynccontextmanager
async def moto_table(tmp: Path) -> AsyncIterator[Table]:
    from store.dynamodb import create_table, open_dynamo_table
    from tests.servers import running_moto_server

    use_moto_credentials()
    with running_moto_server(tmp) as url:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        async with open_dynamo_table(name, url, "us-east-1") as table:
            await create_table(table.client, name)
            yield table


@dataclass(frozen=True)
class OnDynamo:
    calls_per_capsule: float
    calls: dict[str, int]
    capsules_per_second: float  # moto's speed, not DynamoDB's
    write_units_per_capsule: float
    # This process's CPU (the server's side: botocore, the scheduler), moto's
    # own excluded: it runs in a process of its own.
    cpu_ms_per_capsule: float


async def dynamodb(sizes: Sizes, tmp: Path) -> OnDynamo:
    async with moto_table(tmp) as inner:
        capsule_keys = await seed(inner, sizes.moto_capsules)
        table = CountingTable(inner)
        cpu = time.process_time()
        elapsed, unlocked = await one_pass(table, scheduler_for(table, tmp), capsule_keys)
        cpu = time.process_time() - cpu
        calls = dict(table.calls)
        opened = await check(inner, capsule_keys)
        if opened != len(capsule_keys):
            raise RuntimeError(f"only {opened} of {len(capsule_keys)} capsules opened on moto")
        n = len(capsule_keys)
        return OnDynamo(
            table.total_calls / n, calls, unlocked / elapsed, table.write_units / n, 1000 * cpu / n
        )


async def run(sizes: Sizes, tmp: Path) -> list[Row]:
    with under_the_servers_collector():
        rounds = await embedded(sizes, tmp)
        on = await dynamodb(sizes, tmp)
    stats = Stats.of([r.capsules_per_second for r in rounds])
    m, s = stats.fmt(" capsules/s", 0)
    alone_m, alone_s = Stats.of([r.alone_per_second for r in rounds]).fmt(" capsules/s", 0)
    share_m, share_s = ratio_stats(
        [r.capsules_per_second for r in rounds], [r.alone_per_second for r in rounds]
    ).fmt("", 2)
    rows: list[Row] = [
        Row(
            SECTION,
            f"embedded store: {sizes.unlock_capsules:,} capsules × 2 recipients, due at once",
            m,
            s,
            "",
            "≥ 2,000 capsules/s",
            verdict(stats.median >= 2000),
        ),
        Row(
            SECTION,
            "  SQLite alone writing the pass's rows, in its commits (no reads, no logic)",
            alone_m,
            alone_s,
        ),
        Row(
            SECTION,
            "  embedded store / SQLite alone (the pass's share that is SQLite's writing)",
            share_m,
            share_s,
        ),
    ]
    detail = ", ".join(f"{k} {v}" for k, v in sorted(on.calls.items()))
    rows += [
        Row(
            SECTION,
            f"DynamoDB (moto_server), {sizes.moto_capsules} capsules: store calls per capsule ({detail})",
            f"{on.calls_per_capsule:.2f}",
            f"moto: {on.capsules_per_second:.0f} capsules/s (n=1)",
            "",
            "≤ 3",
            verdict(on.calls_per_capsule <= 3),
        ),
        Row(
            SECTION,
            "  write units per capsule (1 per item written alone, 2 per item of a transaction; items ≤ 1 KB)",
            f"{on.write_units_per_capsule:.1f}",
            "what a million capsules cost in write units: bench/NOTES.md",
            "",
            "",
            "",
        ),
        Row(
            SECTION,
            "  the server's CPU per capsule on DynamoDB (moto's own excluded)",
            f"{on.cpu_ms_per_capsule:.2f} ms",
            "process CPU of the pass / capsules (n=1)",
            "",
            "",
            "",
        ),
    ]
    return rows
