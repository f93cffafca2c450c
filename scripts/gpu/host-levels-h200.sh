#!/usr/bin/env bash
# Issues 30 and 32: does the CPU the engine core runs on set the eager chunk step's level?
# GPU session 11's grid (results/h200-vllm0.22-qwen3-coder-30b-a3b-1gpu-host/) ran the one-chunk
# step at ~24-31 ms of penalty on some engine-core CPUs and ~37-41 ms on others, and GPU session 9's
# at ~45 or ~65-88 ms; the host monitor saw no run-queue waits and no steal. Here one vLLM
# (B = 8192, the grid's command, warm from the engine-cache pack) serves while the engine core's
# threads are pinned (taskset) to chosen CPUs, with and without a busy loop on the CPU's hyperthread
# sibling, and one launch-bound point (D = 4, P = 512, one eager chunk) is measured under each.
# From the repository root on the GPU machine after the bundle's three calls, carrying
# .gpu-stage-otel (the engine caches: scripts/gpu/engine-cache/, committed):
#
#   bash scripts/gpu/host-levels-h200.sh            # the pinnings
#   bash scripts/gpu/host-levels-h200.sh restart    # one engine's life against the next's (no pinning)
#
# Leaves in $OUT: levels.tgz (topology, every condition's record and console, the host monitor).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the folder whose files come back}
R=${R:-/root/levels}
mkdir -p "$R" "$OUT"
# shellcheck source=/dev/null
source scripts/gpu/unpack-bundle.sh || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# shellcheck source=/dev/null
source scripts/gpu/engine-cache.sh || exit 1
{ lscpu; lscpu -e; for c in /sys/devices/system/cpu/cpu[0-9]*; do echo "$c $(cat "$c/topology/thread_siblings_list" 2>/dev/null) node:$(ls -d "$c"/node* 2>/dev/null | xargs -n1 basename 2>/dev/null)"; done;
  nvidia-smi topo -m; } > "$R/topology.txt" 2>&1
nice -n 5 python3 scripts/gpu/host_monitor.py "$R/host-$(date +%s).jsonl" &
mon=$!
start_engine() {
python3 -m vllm.entrypoints.cli.main serve /tmp/model/qwen3-coder-30b-a3b --served-model-name qwen3-coder-30b-a3b \
  --load-format dummy --max-model-len 200000 --max-num-batched-tokens 8192 --enable-prefix-caching \
  --enable-chunked-prefill --gpu-memory-utilization 0.9 --host 127.0.0.1 --port 8000 \
  --enable-logging-iteration-details >> "$R/engine.log" 2>&1 &
t0=$(date +%s)
until curl -sf http://127.0.0.1:8000/health >/dev/null; do sleep 1; [ $(($(date +%s) - t0)) -gt 300 ] && { echo "no health"; break; }; done
echo "engine healthy after $(($(date +%s) - t0)) s"
core=$(pgrep -f 'VLLM::EngineCore' | head -1)
echo "engine core pid $core on cpu $(ps -o psr= -p "$core")"
}
stop_engine() { pkill -f 'vllm.entrypoints'; while pgrep -f 'VLLM::EngineCore' >/dev/null; do sleep 1; done; }
sib() { cut -d, -f2 < "/sys/devices/system/cpu/cpu$1/topology/thread_siblings_list" 2>/dev/null | tr -d ' ' | sed 's/-.*//'; }
A=4
S=$(sib $A); { [ -z "$S" ] || [ "$S" = "$A" ]; } && S=5
F=12
N=$(( $(nproc) - 1 ))
measure() {  # NAME: D = 4, P = 512 (one eager chunk), 12 repetitions, the current pinning and load
  local name=$1
  echo "== $name: engine core on cpu(s) $(taskset -pc "$core" | sed 's/.*: //'), now on $(ps -o psr= -p "$core")"
  timeout 75 python3 -m pdexporter measure --target http://127.0.0.1:8000 -B 8192 -D 4 -P 512 --reps 12 \
    --out "$R/$name" > "$R/$name.log" 2>&1
  python3 - "$R/$name/8192/D4_P512.json" <<'PY'
import json, sys, statistics
rec = json.load(open(sys.argv[1]))
pen = [r["derived"]["tpot_penalty_ms"] for r in rec["reps"]]
print(f"   penalty ms: median {statistics.median(pen):.1f}  min {min(pen):.1f}  max {max(pen):.1f}  ({len(pen)} reps)")
PY
}
if [ "${1:-}" = restart ]; then  # the level of one engine's life against the next one's: three points, a new engine, three more
  for e in 1 2; do
    start_engine
    for k in a b c; do measure "e$e-$k" | tee -a "$OUT/summary.txt"; done
    stop_engine
  done
  kill $mon; wait $mon 2>/dev/null
  tar czf "$OUT/levels.tgz" -C "$R" .
  exit 0
fi
start_engine
measure c0-unpinned
taskset -a -p -c "$A" "$core" >/dev/null && measure "c1-cpu$A"
taskset -c "$S" sh -c 'while :; do :; done' & b=$!
measure "c2-cpu$A-sibling$S-busy"; kill $b
taskset -c "$F" sh -c 'while :; do :; done' & b=$!
measure "c3-cpu$A-cpu$F-busy"; kill $b
taskset -a -p -c "$N" "$core" >/dev/null && measure "c4-cpu$N"
taskset -a -p -c "$A" "$core" >/dev/null && measure "c5-cpu$A-again"
taskset -a -p -c "0-$N" "$core" >/dev/null && measure c6-unpinned-again
kill $mon; wait $mon 2>/dev/null
pkill -f 'vllm.entrypoints' ; sleep 2
tar czf "$OUT/levels.tgz" -C "$R" .
