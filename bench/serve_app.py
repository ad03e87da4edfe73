"""Serves an app through app.py's own `_serve` (so the same uvicorn options),
with what the benchmark needs on top:

    python -m bench.serve_app [--plain] [--deflate] [--unlock-log PATH]

--plain       the baseline app of bench/plain_app.py instead of ours
--deflate     per-message deflate on (MIFAMILIAS_WS_DEFLATE), whatever the environment says
--unlock-log  append "<time.time()> <capsule id>" after each unlock transaction commits
--gc-probe    note every full (generation 2) collection; on SIGUSR1 append one JSON line to
              PATH: the objects the collector tracks, those frozen, the full collections
              so far, and the duration of a gc.collect() made then; SIGUSR2 runs gc.freeze()
--gc-threshold  gc.set_threshold(*values), e.g. 700,10,100
--sample      sample the event loop's stack every millisecond from a thread; on SIGUSR1
              write {"package.module:function (innermost frame)": count} as JSON to PATH
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from store.port import Table, Update, WriteOp


class GcProbe:
    """Full collections as the process makes them (gc.callbacks), and a timed
    full collection on request (SIGUSR1: the pause a subscriber would see now)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pauses: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._note)
        signal.signal(signal.SIGUSR1, lambda *_: self.report())
        signal.signal(signal.SIGUSR2, lambda *_: gc.freeze())

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._started)

    def report(self) -> None:
        tracked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        pauses = list(self.pauses)
        started = time.perf_counter()
        gc.collect()
        collect = time.perf_counter() - started
        line = {"tracked": tracked, "frozen": frozen, "full_collections": pauses, "collect": collect}
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")


class StackSampler:
    """A poor man's py-spy: the event loop thread's innermost frame, every
    millisecond, counted by module and function (the loop's idle wait, in C
    under uvloop, shows as the Python frame that called it)."""

    def __init__(self, path: Path) -> None:
        import collections
        import sys
        import threading

        self.path = path
        self.counts: collections.Counter[str] = collections.Counter()
        self.main = threading.main_thread().ident
        sys.setswitchinterval(0.0005)
        threading.Thread(target=self._run, daemon=True).start()
        signal.signal(signal.SIGUSR1, lambda *_: self.write())

    def _run(self) -> None:
        import sys

        while True:
            time.sleep(0.001)
            frame = sys._current_frames().get(self.main)  # type: ignore[arg-type]
            if frame is not None:
                code = frame.f_code
                self.counts[f"{frame.f_globals.get('__name__', '?')}:{code.co_name}"] += 1

    def write(self) -> None:
        self.path.write_text(json.dumps(dict(self.counts.most_common())))
        self.counts.clear()


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
    parser.add_argument("--gc-probe", type=Path)
    parser.add_argument("--gc-threshold")
    parser.add_argument("--sample", type=Path)
    args = parser.parse_args(argv)

    import app
    from resolvers.core.config import Settings

    if args.plain:
        from bench.plain_app import create_plain_app

        app.create_app = lambda settings, **_: create_plain_app(settings)
    elif args.unlock_log:
        path = args.unlock_log
        app.create_app = functools.partial(app.create_app, wrap_table=lambda table: UnlockLog(table, path))
    if args.gc_probe:
        GcProbe(args.gc_probe)
    if args.sample:
        StackSampler(args.sample)
    if args.gc_threshold:
        gc.set_threshold(*(int(v) for v in args.gc_threshold.split(",")))
    settings = Settings.from_env()
    if args.deflate:
        settings = settings.model_copy(update={"ws_deflate": True})
    app._serve(settings)


if __name__ == "__main__":
    main()
