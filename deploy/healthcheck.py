"""The container's HEALTHCHECK: exit 0 when /healthz answers 200 (liveness)."""

import os
import sys
import urllib.request

port = os.environ.get("MIFAMILIAS_PORT", "8000")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
