"""Work directories a SIGKILLed process left in the temp folder are swept;
those of a process still running are not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from resolvers.core import workdirs
from tests.servers import ROOT

MAKES_ONE = (
    "import sys, time\n"
    "from resolvers.core import workdirs\n"
    "held = workdirs.work_dir(sys.argv[1])\n"
    "folder = held.name\n"
    "open(folder + '/part.zip', 'wb').write(b'x' * 4096)\n"
    "print(folder, flush=True)\n"
    "time.sleep(600)\n"
)


def _holding(kind: str, tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen(
        [sys.executable, "-c", MAKES_ONE, kind],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    folder = Path(child.stdout.readline().strip())
    assert folder.parent == tmp and folder.is_dir(), folder
    return child, folder


def test_a_killed_builds_folder_is_swept_and_a_running_ones_is_kept(tmp_path: Path) -> None:
    killed, left = _holding("export", tmp_path)
    running, kept = _holding("media", tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        other = tmp_path / "someone-elses"
        other.mkdir()
        assert left.is_dir() and kept.is_dir()
        assert workdirs.sweep_dead(tmp_path) == 1
        assert not left.exists() and kept.is_dir() and other.is_dir()
    finally:
        running.kill()
        running.wait()
    assert workdirs.sweep_dead(tmp_path) == 1 and not kept.exists()
