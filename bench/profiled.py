"""`python -m bench.profiled OUT app.py serve`: the server under cProfile, its
profile written to OUT when it stops (`MIFAMILIAS_BENCH_PROFILE`, bench/processes.py).

SIGUSR2 pauses the profile and SIGUSR1 resumes it (`pause`, `resume`). With
`WINDOWS` set in its environment the profile starts paused, so a section can
profile only the windows it measures, leaving out the start-up, the
subscribers' connecting and its own probes; without, the whole run is.

uvicorn raises the stopping signal again once it has shut down, so that the
process ends as the signal says; here the server returns instead, or the
profile would never be written."""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
import time

# Set in a profiled server's environment: count only between `resume` and `pause`.
WINDOWS = "MIFAMILIAS_BENCH_PROFILE_WINDOWS"


def main() -> None:
    out, script, *args = sys.argv[1:]
    signal.raise_signal = lambda signum: None
    sys.argv = [script, *args]
    # CPU time, not wall time: a process waiting for SQLite's write lock or for
    # the core spends none, and CPU is what section 8 compares.
    profile = cProfile.Profile(time.process_time)
    # Handled on the main thread, which runs the server's event loop: the
    # thread the profile counts (its CPU clock is the whole process's).
    signal.signal(signal.SIGUSR1, lambda signum, frame: profile.enable())
    signal.signal(signal.SIGUSR2, lambda signum, frame: profile.disable())
    try:
        if os.environ.get(WINDOWS):
            runpy.run_path(script, run_name="__main__")
        else:
            profile.runcall(runpy.run_path, script, run_name="__main__")
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


def resume(pid: int) -> None:
    """Counts a profiled server's work again. Only for a server run here
    (`MIFAMILIAS_BENCH_PROFILE`): anywhere else the signal ends the process."""
    os.kill(pid, signal.SIGUSR1)


def pause(pid: int) -> None:
    os.kill(pid, signal.SIGUSR2)


if __name__ == "__main__":
    main()
