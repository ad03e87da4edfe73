"""The fast tier: `./dev test --fast` (pytest `--fast`).

It keeps what a store, domain or schema change must pass before anything else:
the store contract suites, the domain and schema tests, the generated access
matrix and the round-trip tests, all on the embedded engine. It leaves out, by
rule rather than by list where it can, whatever needs a part that is slow to
start or to run:

- DynamoDB or S3 on moto_server: the `moto_server` fixture, or a `dynamodb` or
  `s3` case of an engine parameter;
- Redis: the `redis_url` fixture;
- server processes, Chromium, npm clients, the multi-process and fault tests:
  the end-to-end modules at the top of tests/ (all but those named below);
- the speech model and long media: the modules in :data:`HEAVY_MODULES`.

The full run (`./dev test`) runs everything, the fast tier included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Top-level modules that start nothing: they read the code, the schema or an app in this process.
IN_PROCESS_MODULES = frozenset(
    {
        "tests.test_layers",
        "tests.test_lock",
        "tests.test_resolving",
        "tests.test_schema_contract",
        "tests.test_strawberry_internals",
        "tests.test_upgrade",
    }
)
HEAVY_MODULES = frozenset(
    {
        "tests.api.test_transcription",  # the speech model on spoken clips
        "tests.resolvers.test_transcribe",
        "tests.resolvers.test_whisper",
    }
)
# The modules whose tests take longest, dealt to the parallel workers first: a
# slow test started last would run alone at the end while the other workers idle.
# Only the order depends on this list; a module missing from it still runs.
SLOWEST_FIRST = (
    "tests.test_bench_smoke",
    "tests.test_fuzz",
    "tests.test_robustness",
    "tests.test_unlocks",
    "tests.api.test_access_matrix",
    "tests.test_privacy",
    "tests.resolvers.test_whisper",
    "tests.api.test_transcription",
    "tests.test_transcription_crash",
    "tests.test_demo",
    "tests.api.test_idempotency",
    "tests.api.test_large_capsules",
)
SLOW_FIXTURES = frozenset({"moto_server", "redis_url", "live_server"})
SLOW_ENGINES = ("dynamodb", "s3")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: the embedded engine, nothing that needs moto, Redis, servers, browsers or speech",
    )


def needs_slow_parts(item: pytest.Item) -> bool:
    if _end_to_end_or_heavy(_module(item)):
        return True
    if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(engine in callspec.id for engine in SLOW_ENGINES)


def _end_to_end_or_heavy(module: str) -> bool:
    return (module.count(".") == 1 and module not in IN_PROCESS_MODULES) or module in HEAVY_MODULES


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the fast tier, the modules it leaves out whole are not even imported."""
    if not config.getoption("--fast") or collection_path.suffix != ".py":
        return None
    relative = collection_path.resolve().relative_to(ROOT).with_suffix("")
    module = ".".join(relative.parts)
    if module.startswith("tests.") and relative.name.startswith("test_") and _end_to_end_or_heavy(module):
        return True
    return None


def _module(item: pytest.Item) -> str:
    return item.module.__name__ if isinstance(item, pytest.Function) and item.module else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))  # stable: the rest keep their order
    if not config.getoption("--fast"):
        return
    kept = [item for item in items if not needs_slow_parts(item)]
    deselected = [item for item in items if needs_slow_parts(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept
