#!/usr/bin/env bash
# Issues 30, 32 and 36 (docs/status.md, "The one thing to know first"; GPU session 37 found the eager step's level
# to be the engine's own, a state of seconds): the inside of the steps in both states. One engine with vLLM's torch
# profiler available (sweeps/h200-dense-llama-3.2-3b-anatomy.yaml: the levels points, interleaved), the host monitor
# beside it, and scripts/gpu/profile_window.py opening the profiler for $SPAN s at each of $AT (seconds after the
# engine answers); scripts/gpu/step_anatomy.py then reads the traces on the GPU machine (they are too big to bring
# back whole). From the repository root on the GPU machine after the bundle's three stage calls (scripts/gpu/README.md):
#
#   GPU=H100 bash scripts/gpu/step-anatomy.sh [DEADLINE_S]     # default 480
#   SIM=1 OUT=/tmp/out bash scripts/gpu/step-anatomy.sh        # the plumbing on the embedded engine (virtual time; it
#                                                              # has no profiler: the windows fail, and say so)
#
# Leaves in $OUT: dense.tgz, sweep.log, gpu.csv (dense-h200.sh's), monitor.tgz, windows.jsonl (the profiler's
# windows on the records' clock), anatomy.md and anatomy.csv (one row per step of every trace), traces.txt (the
# traces' names and sizes) and, where they fit the 16 MiB a file that comes back, the traces themselves.
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-480}
OUT=${OUT:?set OUT to the folder whose files come back}
export MODEL=${MODEL:-llama-3.2-3b-instruct} SWEEP=${SWEEP:-sweeps/h200-dense-llama-3.2-3b-anatomy.yaml}
R=${R:-/root/r-anatomy}
AT=${AT:-"45 105 165"} SPAN=${SPAN:-10}
PROF=${PROF:-/root/prof}  # the sweep's --profiler-config torch_profiler_dir
if [ -n "${SIM:-}" ]; then PROF=$R/prof HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-3}; fi
mkdir -p "$R/monitor" "$OUT" "$PROF"
export PYTHONUNBUFFERED=1
if [ -z "${SIM:-}" ]; then
  # shellcheck source=/dev/null
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
stamp=$(date +%s)
nice -n 5 python3 scripts/gpu/host_monitor.py "$R/monitor/host-$stamp.jsonl" --interval 0.1 &
mon=$!
at_args=()
for t in $AT; do at_args+=(--at "$t"); done
python3 scripts/gpu/profile_window.py "$OUT/windows.jsonl" "${at_args[@]}" --for "$SPAN" \
  --health-timeout "${HEALTH_TIMEOUT:-600}" &
prof=$!
R=$R bash scripts/gpu/dense-h200.sh "$deadline"
rc=$?
kill -TERM "$prof" "$mon" 2>/dev/null
wait "$prof" "$mon" 2>/dev/null
tar czf "$OUT/monitor.tgz" -C "$R" monitor
traces=$(ls "$PROF"/*.pt.trace.json* 2>/dev/null)
if [ -n "$traces" ]; then
  # shellcheck disable=SC2086
  python3 scripts/gpu/step_anatomy.py $traces --csv "$OUT/anatomy.csv" --md "$OUT/anatomy.md" \
    > "$OUT/anatomy.log" 2>&1 || echo "step_anatomy failed: $OUT/anatomy.log"
  cat "$OUT/anatomy.md" 2>/dev/null || tail -5 "$OUT/anatomy.log"
  ls -la "$PROF" > "$OUT/traces.txt"
  # shellcheck disable=SC2086
  for f in $traces; do [ "$(stat -c %s "$f")" -le 15000000 ] && cp "$f" "$OUT/"; done
else
  echo "no trace in $PROF" | tee "$OUT/traces.txt"
fi
[ -z "${SIM:-}" ] && pkill -f "[v]llm.entrypoints"
ls -la "$OUT"
echo "step-anatomy: dense-h200.sh rc=$rc"
exit "$rc"
