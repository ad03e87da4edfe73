"""Work directories in the system temp folder (a transcode's, an export
build's), named by the process that made them, so that what a killed process
left there is swept when a process starts: a directory whose process no
longer runs is nobody's. A directory of a process still running (another
server on the same machine) is left alone."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("mifamilias.workdirs")

PREFIX = "mifamilias-"
_NAMED = re.compile(rf"^{PREFIX}(?P<kind>[a-z]+)-(?P<pid>\d+)-")


def work_dir(kind: str) -> tempfile.TemporaryDirectory[str]:
    """A work directory for `kind` ("media", "export"), removed on exit."""
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{kind}-{os.getpid()}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def sweep_dead(root: Path | None = None) -> int:
    """Removes the work directories of processes that no longer run; returns how many."""
    folder = Path(root or tempfile.gettempdir())
    removed = 0
    for entry in folder.iterdir():
        named = _NAMED.match(entry.name)
        if named is None or not entry.is_dir() or _running(int(named["pid"])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    if removed:
        log.info("removed %d work directories left by stopped processes", removed)
    return removed
