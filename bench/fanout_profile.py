"""Where a fan-out's time goes, per subscriber: the capsule fan-out of section 3
(N subscribers, a few rounds) on a server whose event loop is sampled every
millisecond (`bench/serve_app.py --sample`); samples are counted from the
first unlock commit to the last delivery, grouped by the innermost frame's
package; shares of the busy samples (the loop's idle wait left out).

    python -m bench.fanout_profile [SUBSCRIBERS] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.common import server_env, token
from bench.fanout import Clients, read_log, seed_people, seed_round, settle_seconds
from bench.processes import bench_server


def group(name: str) -> str:
    module, _, function = name.partition(":")
    top = module.split(".")[0]
    if top in ("schema", "resolvers", "store"):
        return module + ":" + function
    return top


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    people = [f"sub{k:05d}" for k in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "fanout"
        data_dir.mkdir()
        asyncio.run(seed_people(data_dir, people))
        unlock_log, samples = data_dir / "unlocks.log", data_dir / "samples.json"
        env = server_env(data_dir, MIFAMILIAS_UNLOCK_POLL_SECONDS="0.2")
        server = bench_server(
            "profile", ["--unlock-log", str(unlock_log), "--sample", str(samples)], env, Path(tmp)
        )
        totals: collections.Counter[str] = collections.Counter()
        delivered = 0
        with server:
            assert server.process is not None
            clients = Clients(server.url.replace("http", "ws") + "/graphql", [token(p) for p in people], 4)
            clients.wait_ready()
            time.sleep(2.0)
            try:
                for r in range(rounds):
                    before = clients.count()
                    os.kill(server.process.pid, signal.SIGUSR1)  # resets the counts
                    capsules = asyncio.run(seed_round(data_dir, people, r))
                    while not set(capsules) <= set(read_log(unlock_log)):
                        time.sleep(0.05)
                    deadline = time.monotonic() + settle_seconds(n) + 10
                    while clients.count() < before + n and time.monotonic() < deadline:
                        time.sleep(0.05)
                    os.kill(server.process.pid, signal.SIGUSR1)
                    time.sleep(0.3)
                    totals.update(json.loads(samples.read_text()))
                    delivered += clients.count() - before
            finally:
                clients.stop()
    busy = {
        k: v
        for k, v in totals.items()
        if not k.startswith(("uvloop", "asyncio.base_events:run", "asyncio.runners:run"))
    }
    grouped: collections.Counter[str] = collections.Counter()
    for name, count in busy.items():
        grouped[group(name)] += count
    total = sum(grouped.values())
    print(f"{delivered} deliveries, {sum(totals.values())} samples of 1 ms, {total} busy")
    print("innermost frames, raw:", totals.most_common(8))
    for name, count in grouped.most_common(25):
        # A share of the busy samples: the sampler thread waits for the GIL, so a
        # sample is not a fixed millisecond; scale by a measured fan-out time.
        print(f"{count:6d} samples  {count / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
