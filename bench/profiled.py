"""`python -m bench.profiled OUT app.py serve`: the server under cProfile, its
profile written to OUT when it stops (`MIFAMILIAS_BENCH_PROFILE`, bench/processes.py).

uvicorn raises the stopping signal again once it has shut down, so that the
process ends as the signal says; here the server returns instead, or the
profile would never be written."""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
import time


def main() -> None:
    out, script, *args = sys.argv[1:]
    signal.raise_signal = lambda signum: None
    sys.argv = [script, *args]
    # CPU time, not wall time: a process waiting for SQLite's write lock or for
    # the core spends none, and CPU is what section 8 compares.
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(runpy.run_path, script, run_name="__main__")
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
