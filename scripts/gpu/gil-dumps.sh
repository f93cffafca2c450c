#!/usr/bin/env bash
# Issues 30, 32 and 36 (GPU session 39): step-anatomy.sh found the eager step's slow state on the CPU's side of the
# step (the Python and ATen time between the launches ×1.9, the launch call itself ×1.6, the GPU's kernels ×1.0).
# Who runs in the engine core process meanwhile? py-spy's non-blocking dumps of the engine core (every thread's
# Python stack, which thread holds the GIL) every ~50 ms, timestamped, beside the anatomy sweep on a fresh engine with
# no profiler window opened; read afterwards against the sweep's repetitions (scripts/gpu/gil_dumps.py).
# py-spy is not in the bundle: carry its binary (the py-spy wheel's data/scripts/py-spy) gzipped in .gpu-stage-pyspy/
# (py-spy.gz: unpacked it would take the call over the 64 MiB it may carry); without it no dumps are taken.
# Beside them (session 39's next question: a lower clock or fewer instructions a cycle?) scripts/gpu/thread_counters.py
# samples the main thread's own counters every 0.1 s (task-clock always; cycles, instructions and reference cycles
# where the guest has a virtual PMU: its header line says which).
#
#   GPU=H100 bash scripts/gpu/gil-dumps.sh [DEADLINE_S]     # default 420; OUT as every step here
#   SIM=1 OUT=/tmp/out bash scripts/gpu/gil-dumps.sh        # the plumbing on the embedded engine: the counters
#                                                           # follow the sweep's own process, which runs it
#
# Leaves in $OUT: step-anatomy.sh's files (no traces), dumps.txt.gz ("@@ <epoch>" before every dump) and
# counters.jsonl.gz.
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-420}
OUT=${OUT:?set OUT to the folder whose files come back}
PYSPY=${PYSPY:-.gpu-stage-pyspy/py-spy}
R=${R:-/root/r-gil}
mkdir -p "$R" "$OUT"
[ -f "$PYSPY.gz" ] && gunzip -f "$PYSPY.gz"
python3 scripts/gpu/thread_counters.py --check
pattern="^VLLM::EngineCore"
[ -n "${SIM:-}" ] && pattern="-m pdexporter sim sweep"
python3 scripts/gpu/thread_counters.py "$R/counters.jsonl" --pattern="$pattern" --interval 0.1 --wait "$deadline" &
counters=$!
chmod +x "$PYSPY" 2>/dev/null || { echo "no py-spy at $PYSPY: no dumps"; PYSPY=; }
[ -n "$PYSPY" ] && (
  # thread_counters.py's finder, as the counters' own: never a process running that script, whose arguments name
  # the pattern (session 40: an unanchored pgrep here found the sampler, and py-spy dumped it instead of the engine)
  core=$(python3 scripts/gpu/thread_counters.py --find --pattern="$pattern" --wait 900)
  echo "core pid ${core:-none} at $(date +%s.%N)"
  while [ -n "$core" ] && kill -0 "$core" 2>/dev/null; do
    echo "@@ $(date +%s.%N)"
    "$PYSPY" dump --nonblocking --pid "$core" 2>&1
    sleep 0.03
  done
) > "$R/dumps.txt" 2>&1 &
dumper=$!
AT="" R=$R OUT=$OUT bash scripts/gpu/step-anatomy.sh "$deadline"
rc=$?
sleep 2
kill "$dumper" "$counters" 2>/dev/null
wait "$counters" 2>/dev/null
[ -f "$R/counters.jsonl" ] && gzip -c "$R/counters.jsonl" > "$OUT/counters.jsonl.gz" && head -1 "$R/counters.jsonl"
[ -f "$R/dumps.txt" ] || exit "$rc"
gzip -c "$R/dumps.txt" > "$OUT/dumps.txt.gz"
echo "dumps: $(grep -c '^@@' "$R/dumps.txt") taken; $(grep -c 'active+gil' "$R/dumps.txt") thread lines holding the GIL"
head -3 "$R/dumps.txt"; grep -m3 -A12 '^@@' "$R/dumps.txt" | tail -26
exit "$rc"
