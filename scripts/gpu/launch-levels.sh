#!/usr/bin/env bash
# Issues 30 and 32 (docs/status.md, "The one thing to know first"): is the eager step's level the host's CUDA
# launch path? One engine, one sweep of a few one-chunk eager points and a compute-bound control, repeated and
# interleaved over ~5 minutes (sweeps/h200-dense-llama-3.2-3b-levels.yaml by default), with two sidecars:
# scripts/gpu/host_monitor.py (CPUs, the engine's threads, steal, the guest's CPU speed, the GPU's clocks) and
# scripts/gpu/launch_probe.py (the host's CUDA launch speed from a process of its own, every 2 s, once the
# engine answers /health). scripts/gpu/host_levels.py then pairs every repetition with both (`launch_us`).
# From the repository root on the GPU machine after the bundle's three stage calls (scripts/gpu/README.md):
#
#   GPU=H100 bash scripts/gpu/launch-levels.sh [DEADLINE_S]     # default 420; the same again resumes
#   SIM=1 OUT=/tmp/out bash scripts/gpu/launch-levels.sh        # the plumbing on the embedded engine (virtual
#                                                               # time, the probe --fake: no pairing to read)
#
# MODEL and SWEEP override (dense-h200.sh's). Leaves in $OUT: dense.tgz, sweep.log, gpu.csv (dense-h200.sh's),
# monitor.tgz (the sidecars' files), levels.csv and levels.txt (host_levels.py's rows and summary).
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-420}
OUT=${OUT:?set OUT to the folder whose files come back}
export MODEL=${MODEL:-llama-3.2-3b-instruct} SWEEP=${SWEEP:-sweeps/h200-dense-llama-3.2-3b-levels.yaml}
R=${R:-/root/r-levels}
mkdir -p "$R/monitor" "$OUT"
export PYTHONUNBUFFERED=1
if [ -z "${SIM:-}" ]; then
  # shellcheck source=/dev/null
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  export PYTHONPATH=/tmp/site
  probe_args=(--wait-url http://127.0.0.1:8000/health)
else
  probe_args=(--fake)
fi
stamp=$(date +%s)
nice -n 5 python3 scripts/gpu/host_monitor.py "$R/monitor/host-$stamp.jsonl" --interval 0.1 &
mon=$!
python3 scripts/gpu/launch_probe.py "$R/monitor/launch-$stamp.jsonl" --interval 2 "${probe_args[@]}" &
probe=$!
R=$R bash scripts/gpu/dense-h200.sh "$deadline"
rc=$?
kill -TERM "$probe" "$mon" 2>/dev/null
wait "$probe" "$mon" 2>/dev/null
tar czf "$OUT/monitor.tgz" -C "$R" monitor
rm -rf "$R/unpacked" && mkdir -p "$R/unpacked" && tar xzf "$OUT/dense.tgz" -C "$R/unpacked"
python3 scripts/gpu/host_levels.py "$R/unpacked/dense" "$R/monitor" --csv "$OUT/levels.csv" \
  > "$OUT/levels.txt" 2>&1 || echo "host_levels failed: $OUT/levels.txt"
cat "$OUT/levels.txt"
[ -z "${SIM:-}" ] && pkill -f "[v]llm.entrypoints"
ls -la "$OUT"
echo "launch-levels: dense-h200.sh rc=$rc"
exit "$rc"
