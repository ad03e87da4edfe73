#!/usr/bin/env bash
# Times ./dev serve on a fresh clone until /healthz answers: first start (cold uv and pip caches), then second.
# The first start installs transcription (faster-whisper and its model) in the background: the
# script also reports when that install is done, and waits for it before the second start.
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
  if [ "$run" = first ]; then
    until ls .venv/.installed-speech-* >/dev/null 2>&1 || [ ! -f .venv/.installing-speech ]; do sleep 0.5; done
    ready=$(date +%s.%N)
    if ls .venv/.installed-speech-* >/dev/null 2>&1; then
      echo "transcription installed: $(echo "$ready - $start" | bc) s after the first start began"
    else
      echo "transcription install FAILED: see .venv/speech-install.log"; cat .venv/speech-install.log
    fi
  fi
  kill $pid; wait $pid 2>/dev/null
done
rm -rf "$dir"
