"""A health-check prober in a process of its own, so the load it measures
against cannot slow it down through the benchmark's own interpreter.

    python -m bench.probe URL

Sends GET URL one after another until "STOP" arrives on stdin, then prints one
JSON line: every latency in milliseconds, and how many requests failed.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from urllib.parse import urlsplit


def main() -> None:
    url = urlsplit(sys.argv[1])
    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    latencies: list[float] = []
    failures = 0
    print("READY", flush=True)
    while not stop.is_set():
        connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=60)
        started = time.perf_counter()
        try:
            connection.request("GET", url.path or "/")
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                failures += 1
            else:
                latencies.append((time.perf_counter() - started) * 1000)
        except OSError:
            failures += 1
        finally:
            connection.close()
        time.sleep(0.01)  # about 100 probes a second, as a load balancer's would be fewer
    print(json.dumps({"latencies": latencies, "failures": failures}), flush=True)


if __name__ == "__main__":
    main()
