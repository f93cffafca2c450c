#!/usr/bin/env bash
# Issues 32 and 30: does giving the engine core's main thread a vCPU of its own remove the eager chunk
# step's two levels? The launch-bound step (one 1028-token chunk beside 4 decodes at B = 8192, no CUDA
# graph: ~50 ms of Python launching kernels) runs at ~55 or ~80-95 ms, switching between repetitions
# and holding for seconds; nothing inside the guest tracked it in GPU sessions 12 and 14 (no run-queue
# waits, no steal, no vCPU's load, not the monitor's fixed loop: results/*-1gpu-s14/RUN.md).
#
# One vLLM (the seed grid's command, warm from the committed engine-cache pack), one point measured in
# blocks of `pdexporter measure` (faithful mode: fresh probes each repetition), alternating:
#   free    every process may run on every vCPU (as every sweep so far ran)
#   pinned  the engine core's main thread alone on vCPU 2, its other threads on 3, the API server
#           on 4-7, the measuring client and the monitor on 8-15 (taskset, on the running processes)
# so a drift of the host over the minutes is not taken for the pinning. From the repository root on
# the GPU machine, after the three calls that carry the vLLM bundle (carry .gpu-stage-otel here):
#
#   bash scripts/gpu/pin-h200.sh [REPS_PER_BLOCK=60] [BLOCKS="free pinned free pinned"]
#
# Leaves in $OUT: pin.tgz (each block's records and raw windows), pin.log, host-monitor.tgz.
set -u
cd "$(dirname "$0")/../.."
reps=${1:-60}
blocks=${2:-free pinned free pinned}
OUT=${OUT:?set OUT to the folder whose files come back}
R=${R:-/root/r}/pin
mkdir -p "$R" "$OUT"
# shellcheck source=/dev/null
source scripts/gpu/unpack-bundle.sh || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# shellcheck source=/dev/null
source scripts/gpu/engine-cache.sh || exit 1
nproc_all=$(($(nproc) - 1))
nice -n 5 python3 scripts/gpu/host_monitor.py "$R/host-$(date +%s).jsonl" &
monpid=$!
python3 -m vllm.entrypoints.cli.main serve /tmp/model/qwen3-coder-30b-a3b --served-model-name qwen3-coder-30b-a3b \
  --load-format dummy --max-model-len 200000 --max-num-batched-tokens 8192 --enable-prefix-caching \
  --enable-chunked-prefill --gpu-memory-utilization 0.9 --host 127.0.0.1 --port 8000 \
  --enable-logging-iteration-details > "$R/engine.log" 2>&1 &
api=$!
t0=$(date +%s)
until curl -sf http://127.0.0.1:8000/health >/dev/null; do
  sleep 1
  if [ $(($(date +%s) - t0)) -gt 300 ] || ! kill -0 $api 2>/dev/null; then
    echo "vLLM did not come up"; tail -n 30 "$R/engine.log"; kill $monpid; exit 1
  fi
done
echo "vLLM healthy after $(($(date +%s) - t0)) s" | tee -a "$R/pin.log"
core=$(pgrep -f 'VLLM::EngineCore' | head -1)
[ -n "$core" ] || { echo "no engine core process"; exit 1; }

place() {  # place free|pinned: set the affinity of every thread of the engine's processes
  local mode=$1 tid
  if [ "$mode" = free ]; then
    for p in $api $core; do taskset -a -cp 0-$nproc_all "$p" >/dev/null; done
    taskset -cp 0-$nproc_all $monpid >/dev/null
  else
    taskset -a -cp 4-7 $api >/dev/null
    for tid in /proc/$core/task/*; do
      tid=${tid##*/}
      if [ "$tid" = "$core" ]; then taskset -cp 2 "$tid" >/dev/null; else taskset -cp 3 "$tid" >/dev/null; fi
    done
    taskset -cp 8-$nproc_all $monpid >/dev/null
  fi
  echo "$mode: engine core main thread on $(taskset -cp "$core" | sed 's/.*: //'), API server on $(taskset -cp $api | sed 's/.*: //')" \
    | tee -a "$R/pin.log"
}

i=0
for mode in $blocks; do
  place "$mode"
  cpus="0-$nproc_all"; [ "$mode" = pinned ] && cpus="8-$nproc_all"
  s=$(date +%s)
  taskset -c "$cpus" python3 -m pdexporter measure --target http://127.0.0.1:8000 -B 8192 -D 4 -P 1024 \
    --reps "$reps" --out "$R/block$i-$mode" > "$R/block$i-$mode.log" 2>&1
  echo "block $i $mode rc=$? $(($(date +%s) - s)) s" | tee -a "$R/pin.log"
  tail -n 3 "$R/block$i-$mode.log"
  i=$((i + 1))
done
kill $api 2>/dev/null; kill $monpid 2>/dev/null; wait $monpid 2>/dev/null
(cd "$R" && tar czf "$OUT/host-monitor.tgz" host-*)
# shellcheck source=/dev/null
source scripts/gpu/engine-logs.sh && trim_engine_logs 3000 --gzip "$R"
tar czf "$OUT/pin.tgz" --exclude=engine.log --exclude='host-*' -C "$(dirname "$R")" pin
cp "$R/pin.log" "$OUT/"
python3 - "$R" <<'PY'
import json, statistics, sys
from pathlib import Path
for block in sorted(Path(sys.argv[1]).glob("block*")):
    if not block.is_dir():
        continue
    for rec in block.glob("*/D*_P*.json"):
        reps = json.loads(rec.read_text())["reps"]
        pen = [r["derived"]["tpot_penalty_ms"] for r in reps if r["derived"].get("tpot_penalty_ms") is not None]
        ttft = [r["interference"]["prefill_duration_ms"] for r in reps]
        if len(pen) > 1:
            q = statistics.quantiles(pen, n=10)
            print(f"{block.name}: {len(pen)} reps, penalty median {statistics.median(pen):.1f} ms, "
                  f"CV {statistics.stdev(pen) / statistics.fmean(pen):.1%}, p10 {q[0]:.1f} p90 {q[-1]:.1f}, "
                  f"prefill median {statistics.median(ttft):.1f} ms")
PY
