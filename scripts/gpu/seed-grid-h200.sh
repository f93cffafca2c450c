#!/usr/bin/env bash
# Issue 32: the seed grid on one H200 (sweeps/h200.yaml: 4 chunk sizes x 7 D x 7 P x 5 repetitions,
# fast mode, each later engine started while the one before serves: launcher.overlap_starts), vLLM
# starting from the torch.compile / Triton caches an earlier session packed
# (scripts/gpu/engine-cache/, committed; results/h200-vllm0.22-qwen3-coder-30b-a3b-starts/RUN.md).
# From the repository root on the GPU machine, after the three calls that carry the vLLM bundle,
# carrying .gpu-stage-otel in the first call that runs it:
#
#   bash scripts/gpu/seed-grid-h200.sh [DEADLINE_S]    # default 540; the same command again until "complete"
#
# Each call resumes (complete records skipped, the engine left running adopted). On a new machine (the
# lent one is given back 30 s after a call), carry the last call's records as .gpu-resume/h200.tgz
# (ignored by git: `cp <files_at>/h200.tgz .gpu-resume/`) in the call that carries the bundle's last
# part: they are unpacked into $R when it holds none, without the engines' state files (those engines
# died with their machine), and the sweep goes on from there (GPU session 12 did so twice). Leaves in $OUT:
# h200.tgz (records, raw, trimmed engine logs, sweep.json with every invocation's phase times),
# sweep.log, gpu-apps.log (the GPU's processes every 5 s), host-monitor.tgz (every call's host and GPU
# samples, scripts/gpu/host_monitor.py), engine-cache.tar.xz.NN (the caches as they are now: B = 16384's too once it started).
# The last lines sum the invocations' wall times (the issue's "every invocation's wall time summed").
# On another GPU, GPU=H100 MAX_MODEL_LEN=65536 (scripts/gpu/grid-for-gpu.sh). SWEEP (default sweeps/h200.yaml)
# runs another grid the same way: sweeps/h200-seed-graphs.yaml is the seed grid with more CUDA-graph sizes.
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-540}
OUT=${OUT:?set OUT to the folder whose files come back}
R=${R:-/root/r}
mkdir -p "$R" "$OUT"
if [ -f .gpu-resume/h200.tgz ] && [ ! -d "$R/h200" ]; then
  tar xzf .gpu-resume/h200.tgz -C "$R" && find "$R/h200" -name engine.json -path '*/engine/*' -delete \
    && echo "resumed from .gpu-resume/h200.tgz: $(find "$R/h200" -name 'D*_P*.json' -path '*/[0-9]*/*' -not -path '*/raw/*' | wc -l) records"
fi
# shellcheck source=/dev/null
source scripts/gpu/unpack-bundle.sh || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# shellcheck source=/dev/null
source scripts/gpu/engine-cache.sh || exit 1
# Which processes hold GPU memory, every 5 s: an engine held at its start gate (launcher.overlap_starts)
# must not appear until the engine before it has stopped.
( while sleep 5; do echo "$(date +%s) $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ';')"; done ) \
  >> "$R/gpu-apps.log" 2>&1 &
apps=$!
# What the host and the GPU do beside the sweep, 10 samples a second (scripts/gpu/host_monitor.py):
# the eager chunk step's two levels matched afterwards with CPU, run-queue waits and GPU clocks.
mon=$R/host-$(date +%s).jsonl
nice -n 5 python3 scripts/gpu/host_monitor.py "$mon" &
monpid=$!
# shellcheck source=/dev/null
source scripts/gpu/grid-for-gpu.sh
echo "grid ${SWEEP:-sweeps/h200.yaml}" >> "$R/sweep.log"
grid=$(grid_for_gpu "${SWEEP:-sweeps/h200.yaml}" "$R" 2>> "$R/sweep.log")
timeout $((deadline + 45)) python3 -m pdexporter sweep "$grid" --out "$R/h200" --deadline "${deadline}s" \
  >> "$R/sweep.log" 2>&1
echo "sweep rc=$?" >> "$R/sweep.log"
kill $apps 2>/dev/null
kill $monpid 2>/dev/null; wait $monpid 2>/dev/null
(cd "$R" && tar czf "$OUT/host-monitor.tgz" host-*.jsonl host-*.gpu.csv host-*.topology.json 2>/dev/null)
# shellcheck source=/dev/null
source scripts/gpu/engine-logs.sh && trim_engine_logs 3000 --gzip "$R/h200"
tar czf "$OUT/h200.tgz" --exclude=engine.log -C "$R" h200
cp "$R/sweep.log" "$OUT/sweep.log"; cp "$R/gpu-apps.log" "$OUT/gpu-apps.log"
tar cf - -C / root/ecache | xz -T0 -6 | split -b 15M -d - "$OUT/engine-cache.tar.xz."
tail -n 14 "$R/sweep.log"
python3 - "$R/h200/sweep.json" <<'PY'
import json, sys
invs = json.load(open(sys.argv[1]))["invocations"]
for i, inv in enumerate(invs):
    starts = {c: v["wall_s"]["engine_start"] for c, v in inv.get("chunks", {}).items() if v["wall_s"]["engine_start"]}
    print(f"invocation {i}: {inv['status']} {inv['complete_configs']}/{inv['total_configs']} wall {inv['wall_s']:.1f} s, starts {starts}")
print(f"every invocation's wall time summed: {sum(inv['wall_s'] for inv in invs):.1f} s"
      f" = {sum(inv['wall_s'] for inv in invs) / 60:.2f} min (goal <= 14)")
PY
