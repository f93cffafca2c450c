#!/usr/bin/env bash
# One GPU session, several device calls: fast against faithful mode on one vLLM engine, the seed's
# cooldown against none, and the launch-bound steps unpinned against pinned, a host monitor running
# beside it all. Every call runs this same script; a step that finished is not run again, a sweep
# stopped by the call's time limit resumes in the next call (its engine adopted).
#
#   bash scripts/gpu/compare-modes.sh SECONDS_FOR_THIS_CALL
#
# Needs the vLLM bundle in /root/stage (../shared/gpu/README.md). Results in /root/modes, packed
# into $OUT at the end of every call.
set -u
BUDGET=${1:-540}
T0=$(date +%s)
W=${MODES_WORK:-/root/modes}
mkdir -p "$W"
[ -n "${MODES_FILE:-}" ] || source scripts/gpu/unpack-bundle.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
NCPU=$(nproc)
if [ ! -f "$W/hostmon.pid" ]; then
  setsid python3 scripts/gpu/hostmon.py "$W/hostmon.jsonl" > "$W/hostmon.err" 2>&1 < /dev/null &
  echo $! > "$W/hostmon.pid"
  setsid nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu \
    --format=csv -lms 250 > "$W/nvidia-smi.csv" 2>&1 < /dev/null &
  { nproc; lscpu; nvidia-smi; python3 -c "import time; print('mono_ns', time.monotonic_ns(), 'wall_ns', time.time_ns())"; } > "$W/host.txt" 2>&1
fi

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# step NAME SWEEP_FILE [sweep options...]: run one sweep into $W/NAME, adopting the running engine.
step() {
  local name=$1 file=$2; shift 2
  [ -f "$W/$name.done" ] && return 0
  local l; l=$(left)
  [ "$l" -lt 40 ] && { echo "[$name] no time left in this call"; return 1; }
  mkdir -p "$W/$name/8192/engine"
  for s in "$W"/*/8192/engine/engine.json; do
    [ -f "$s" ] && [ "$s" != "$W/$name/8192/engine/engine.json" ] && cp "$s" "$W/$name/8192/engine/engine.json" && break
  done
  echo "[$name] start $(date +%T), ${l}s left; mono_ns $(python3 -c 'import time;print(time.monotonic_ns())')" | tee -a "$W/steps.log"
  local t=$(date +%s)
  ${PIN_CLIENT:-} python3 -m pdexporter sweep "$file" --out "$W/$name" --keep-engine --deadline $(( l - 15 ))s "$@" 2>&1 \
    | tee -a "$W/$name.console.log" | grep -v "^\s*$" | tail -25
  local rc=${PIPESTATUS[0]}
  echo "[$name] rc $rc after $(( $(date +%s) - t ))s" | tee -a "$W/steps.log"
  [ "$rc" -eq 0 ] && touch "$W/$name.done"
  return "$rc"
}

engine_pids() { pgrep -f "vllm.entrypoints.cli.main serve"; pgrep -f "VLLM::" ; }

pin_engine() {  # $1: core list for every thread of every vLLM process
  for pid in $(engine_pids | sort -u); do taskset -a -cp "$1" "$pid" > /dev/null 2>&1; done
  echo "engine pinned to $1: $(engine_pids | sort -u | tr '\n' ' ')" | tee -a "$W/steps.log"
}

pack() {
  cp "$W/steps.log" "$OUT/" 2>/dev/null
  (cd "$W" && tar czf "$OUT/modes.tar.gz" --exclude=engine.log --ignore-failed-read fastA faithful faithful0 fastB \
    launch launch-pinned launch-again steps.log host.txt nvidia-smi.csv 2>/dev/null)
  gzip -c "$W/hostmon.jsonl" > "$OUT/hostmon.jsonl.gz"
  for log in "$W"/*/8192/engine/engine.log; do [ -f "$log" ] && gzip -c "$log" > "$OUT/engine.log.gz"; done
  ls -la "$OUT"
}
trap pack EXIT

MODES=${MODES_FILE:-sweeps/h200-modes.yaml} LAUNCH=${LAUNCH_FILE:-sweeps/h200-launch.yaml}
step fastA "$MODES" --mode fast || exit 0
step faithful "$MODES" || exit 0
step faithful0 "$MODES" --cooldown 0 || exit 0
step fastB "$MODES" --mode fast || exit 0
step launch "$LAUNCH" || exit 0
[ "$NCPU" -ge 8 ] || { echo "$NCPU cores: too few to pin apart"; exit 0; }
if [ ! -f "$W/launch-pinned.done" ]; then pin_engine "0-$(( NCPU - 5 ))"; fi
PIN_CLIENT="taskset -c $(( NCPU - 4 ))-$(( NCPU - 1 ))" step launch-pinned "$LAUNCH" || exit 0
if [ ! -f "$W/launch-again.done" ]; then pin_engine "0-$(( NCPU - 1 ))"; fi
step launch-again "$LAUNCH" || exit 0
echo "all steps done"
