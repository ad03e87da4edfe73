#!/usr/bin/env bash
# Times ./dev serve on a fresh clone until /healthz answers: first start (cold uv and pip caches), then second.
# Usage: bench/first_start.sh   (clones this repository into a temporary folder; port 8765)
set -u
dir=$(mktemp -d /tmp/firststart.XXXX)
git clone -q "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" "$dir/clone"
cd "$dir/clone"
export UV_CACHE_DIR="$dir/uv-cache" PIP_NO_CACHE_DIR=1 MIFAMILIAS_PORT=8765
for run in first second; do
  start=$(date +%s.%N)
  ./dev serve > "$dir/$run.log" 2>&1 &
  pid=$!
  until curl -sf http://127.0.0.1:8765/healthz >/dev/null; do sleep 0.1; done
  end=$(date +%s.%N)
  echo "$run start: $(echo "$end - $start" | bc) s"
  kill $pid; wait $pid 2>/dev/null
done
rm -rf "$dir"
