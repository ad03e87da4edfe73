"""Section 9: what one media probe costs, in a fresh child interpreter (the
probe as a script, `python -I probing.py PATH`: an interpreter start and an
import of libav per file) and in a child forked from the warm forkserver
(`media.probe`, av imported once), interleaved, on the same file."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Row, Stats, now, ratio_stats, verdict
from resolvers.adapters import media, probing
from tests.media_factory import make_video_with_tone

SECTION = "9. Media probe (per file)"
TARGET_MS = 25.0  # what a probe cost before it moved into a child interpreter


def _fresh(path: Path) -> None:
    subprocess.run([sys.executable, "-I", probing.__file__, str(path)], check=True, capture_output=True)


async def _measure(path: Path, rounds: int, per_round: int) -> tuple[list[float], list[float]]:
    await media.probe(path)  # starts the forkserver: once per server process
    fresh: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):
        start = now()
        for _ in range(per_round):
            await asyncio.to_thread(_fresh, path)
        fresh.append((now() - start) / per_round)
        start = now()
        for _ in range(per_round):
            await media.probe(path)
        warm.append((now() - start) / per_round)
    return fresh, warm


def run(rounds: int = 5, per_round: int = 10) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="mifamilias-probe-") as tmp:
        path = make_video_with_tone(Path(tmp))
        fresh, warm = asyncio.run(_measure(path, rounds, per_round))
    fresh_median, fresh_spread = Stats.of(fresh).fmt(" ms", 1, 1000)
    warm_stats = Stats.of(warm)
    warm_median, warm_spread = warm_stats.fmt(" ms", 1, 1000)
    ratio_median, ratio_spread = ratio_stats(warm, fresh).fmt("×", 2)
    return [
        Row(SECTION, "fresh child interpreter (python -I probing.py)", fresh_median, fresh_spread),
        Row(
            SECTION,
            "warm child (forkserver with av imported): media.probe",
            warm_median,
            warm_spread,
            target=f"≤ {TARGET_MS:g} ms",
            met=verdict(warm_stats.median * 1000 <= TARGET_MS),
        ),
        Row(SECTION, "warm / fresh", ratio_median, ratio_spread, ratio_median),
    ]
