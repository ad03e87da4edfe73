"""Serves an app through app.py's own `_serve` (so the same uvicorn options),
with what the benchmark needs on top:

    python -m bench.serve_app [--plain] [--deflate] [--unlock-log PATH]

--plain       the baseline app of bench/plain_app.py instead of ours
--deflate     uvicorn's ws_per_message_deflate on, whatever _serve says
--unlock-log  append "<time.time()> <capsule id>" after each unlock transaction commits
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from store.port import Table, Update, WriteOp


class UnlockLog:
    """Passes everything through; notes when an unlock transaction has committed."""

    def __init__(self, inner: Table, path: Path) -> None:
        self.inner = inner
        self.handle = path.open("a", buffering=1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def transact(self, ops: Sequence[WriteOp]) -> None:
        await self.inner.transact(ops)
        first = ops[0] if ops else None
        if isinstance(first, Update) and first.set.get("status") == "AVAILABLE":
            self.handle.write(f"{time.time():.6f} {first.key[0].split('#', 1)[1]}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--deflate", action="store_true")
    parser.add_argument("--unlock-log", type=Path)
    args = parser.parse_args(argv)

    import uvicorn

    import app
    from resolvers.core.config import Settings

    if args.plain:
        from bench.plain_app import create_plain_app

        app.create_app = lambda settings, **_: create_plain_app(settings)
    elif args.unlock_log:
        path = args.unlock_log
        app.create_app = functools.partial(app.create_app, wrap_table=lambda table: UnlockLog(table, path))
    if args.deflate:
        real_run = uvicorn.run

        def run(*a: Any, **kw: Any) -> None:
            kw["ws_per_message_deflate"] = True
            real_run(*a, **kw)

        uvicorn.run = run
    app._serve(Settings.from_env())


if __name__ == "__main__":
    main()
