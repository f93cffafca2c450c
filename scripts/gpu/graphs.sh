#!/usr/bin/env bash
# One device call: the launch-bound configurations on a vLLM capturing CUDA graphs up to 2560
# tokens (sweeps/h200-graphs.yaml, or the file given), the host monitor beside it. Needs the
# bundle in /root/stage.
#   bash scripts/gpu/graphs.sh SECONDS [SWEEP_FILE]
set -u
BUDGET=${1:-540}
SWEEP=${2:-sweeps/h200-graphs.yaml}
source scripts/gpu/unpack-bundle.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/graphs; mkdir -p "$W"
setsid python3 scripts/gpu/hostmon.py "$W/hostmon.jsonl" > /dev/null 2>&1 < /dev/null &
pack() {
  (cd /root && tar czf "$OUT/graphs.tar.gz" --exclude=engine.log graphs/out graphs/console.log)
  for log in "$W"/out/*/engine/engine.log; do [ -f "$log" ] && gzip -c "$log" > "$OUT/engine.log.gz"; done
  gzip -c "$W/hostmon.jsonl" > "$OUT/hostmon.jsonl.gz"
  ls -la "$OUT"
}
trap pack EXIT
python3 -m pdexporter sweep "$SWEEP" --out "$W/out" --deadline $(( BUDGET - 20 ))s 2>&1 \
  | tee "$W/console.log" | grep -v "^\s*$" | tail -30
