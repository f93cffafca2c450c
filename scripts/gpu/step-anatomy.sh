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
# Leaves in $OUT (at most 8 files come back): dense.tgz, sweep.log, gpu.csv (dense-h200.sh's), monitor.tgz,
# anatomy.md and anatomy.csv (one row per step of every trace), anatomy.tgz (windows.jsonl: the profiler's windows
# on the records' clock; anatomy.log; traces.txt: the traces' names and sizes) and the smallest trace where it fits
# the 16 MiB a file that comes back. AT="" opens no window (a resumed call: the sweep, then the traces already there).
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-480}
OUT=${OUT:?set OUT to the folder whose files come back}
export MODEL=${MODEL:-llama-3.2-3b-instruct} SWEEP=${SWEEP:-sweeps/h200-dense-llama-3.2-3b-anatomy.yaml}
R=${R:-/root/r-anatomy}
AT=${AT-"45 105 165"} SPAN=${SPAN:-10}
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
prof=
if [ ${#at_args[@]} -gt 0 ]; then
  python3 scripts/gpu/profile_window.py "$R/windows.jsonl" "${at_args[@]}" --for "$SPAN" \
    --health-timeout "${HEALTH_TIMEOUT:-600}" &
  prof=$!
fi
R=$R bash scripts/gpu/dense-h200.sh "$deadline"
rc=$?
kill -TERM $prof "$mon" 2>/dev/null
wait $prof "$mon" 2>/dev/null
tar czf "$OUT/monitor.tgz" -C "$R" monitor
traces=$(ls "$PROF"/*.pt.trace.json* 2>/dev/null)
if [ -n "$traces" ]; then
  # shellcheck disable=SC2086
  python3 scripts/gpu/step_anatomy.py $traces --csv "$OUT/anatomy.csv" --md "$OUT/anatomy.md" \
    > "$R/anatomy.log" 2>&1 || echo "step_anatomy failed: $R/anatomy.log"
  cat "$OUT/anatomy.md" 2>/dev/null || tail -5 "$R/anatomy.log"
  ls -la "$PROF" > "$R/traces.txt"
  # shellcheck disable=SC2012,SC2086
  small=$(ls -Sr $traces | head -1)
  [ "$(stat -c %s "$small")" -le 15000000 ] && cp "$small" "$OUT/"
else
  echo "no trace in $PROF" | tee "$R/traces.txt"
fi
extra=()
for f in windows.jsonl anatomy.log traces.txt; do [ -f "$R/$f" ] && extra+=("$f"); done
tar czf "$OUT/anatomy.tgz" -C "$R" "${extra[@]}"
[ -z "${SIM:-}" ] && pkill -f "[v]llm.entrypoints"
ls -la "$OUT"
echo "step-anatomy: dense-h200.sh rc=$rc"
exit "$rc"
