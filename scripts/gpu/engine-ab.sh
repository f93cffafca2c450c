#!/usr/bin/env bash
# Issues 32 and 30: one engine flag set against another on the same launch-bound cells, an engine per block,
# the two alternating (a b a b ...), so a drift of the host over the minutes is not taken for the flags.
#
# The question it was written for (GPU session 27): the one-chunk eager step (P + D > 512 tokens, vLLM 0.22's
# default max_cudagraph_capture_size) launches every kernel from Python and reads the lent host's two launch
# levels (~45 and ~75 ms of chunk-step excess on both GPUs; criterion 4's exceptions). Does a piecewise CUDA graph
# for those steps remove the levels, and how much of the one-chunk penalty is launch cost?
#
#   ARGS_B='--compilation-config {"cudagraph_capture_sizes":[1,2,4,...,512,528,1040,2064]}' \
#     bash scripts/gpu/engine-ab.sh [DEADLINE_S=540]
# (the whole list: results/h200-vllm0.22-qwen3-coder-30b-a3b-passive-spread/PLAN.md, "Session 28")
#
# From the environment: ARGS_A, ARGS_B (extra `vllm serve` flags of each condition; A defaults to none),
# BLOCKS (default 4: a b a b), CELLS ("D:P ...", default "4:512 4:1024 4:2048 12:512 12:1024 12:2048"), REPS
# (per cell and block, default 8), B (default 8192), PORT (default 8000), MAX_MODEL_LEN (default 200000; 65536
# on an H100). Every other flag is the seed grid's (sweeps/h200.yaml). Each block is one `pdexporter measure --target` per cell
# (faithful mode: its own Phase 1 baseline) into $R/ab/<engine>/b<k>-<a|b>; the engine is stopped after each block.
# A later call with the same command resumes at the first block with a missing cell (a block's engine is started
# again; `measure --resume` keeps what a cut block recorded). Leaves in $OUT: ab.tgz (the blocks, each engine's
# trimmed log, engine.trimmed.log.gz in its folder), ab.log, host-monitor.tgz. Analysis: python3 scripts/gpu/block_ab.py <unpacked>/ab
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-540}
T0=$(date +%s)
OUT=${OUT:?set OUT to the folder whose files come back}
R=${R:-/root/r}
B=${B:-8192}
PORT=${PORT:-8000}
W=$R/ab/qwen3-coder-30b-a3b-b$B
mkdir -p "$W" "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$R/ab/ab.log"; }
left() { echo $((deadline - ($(date +%s) - T0))); }
# ENGINE=sim runs the embedded engine instead, which has no flags of its own: a dry run of this script, no GPU
if [ "${ENGINE:-vllm}" = vllm ]; then
  # shellcheck source=/dev/null
  source scripts/gpu/unpack-bundle.sh || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  # shellcheck source=/dev/null
  source scripts/gpu/engine-cache.sh || exit 1
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
nice -n 5 python3 scripts/gpu/host_monitor.py "$R/ab/host-$(date +%s).jsonl" &
monpid=$!

finish() {
  kill $monpid 2>/dev/null; wait $monpid 2>/dev/null
  (cd "$R/ab" && tar czf "$OUT/host-monitor.tgz" host-*.jsonl host-*.gpu.csv host-*.topology.json 2>/dev/null)
  # shellcheck source=/dev/null
  source scripts/gpu/engine-logs.sh && trim_engine_logs 3000 --gzip "$R/ab"
  tar czf "$OUT/ab.tgz" --exclude=engine.log --exclude='host-*' -C "$R" ab
  cp "$R/ab/ab.log" "$OUT/ab.log"
}

stop_engine() {
  [ -f "$W/engine.pid" ] || return 0
  kill -- -"$(cat "$W/engine.pid")" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$(cat "$W/engine.pid")" 2>/dev/null || break; sleep 0.5; done
  kill -9 -- -"$(cat "$W/engine.pid")" 2>/dev/null
  rm -f "$W/engine.pid"
}

start_engine() {  # start_engine k cond flags...
  local k=$1 cond=$2; shift 2
  local elog=$W/b$k-$cond/engine.log
  mkdir -p "$W/b$k-$cond"
  log "block $k ($cond): starting ${ENGINE:-vllm} B=$B with [$*]"
  local t0; t0=$(date +%s)
  if [ "${ENGINE:-vllm}" = sim ]; then
    setsid python3 -m pdexporter sim serve --profile h200-qwen3-coder-30b-a3b --chunk-size "$B" --host 127.0.0.1 \
      --port "$PORT" >> "$elog" 2>&1 < /dev/null &
  else  # the seed grid's flags (sweeps/h200.yaml), then the condition's
    setsid python3 -m vllm.entrypoints.cli.main serve /tmp/model/qwen3-coder-30b-a3b \
      --served-model-name qwen3-coder-30b-a3b --load-format dummy --max-model-len "${MAX_MODEL_LEN:-200000}" \
      --max-num-batched-tokens "$B" --enable-prefix-caching --enable-chunked-prefill --gpu-memory-utilization 0.9 \
      --host 127.0.0.1 --port "$PORT" --enable-logging-iteration-details "$@" >> "$elog" 2>&1 < /dev/null &
  fi
  echo $! > "$W/engine.pid"
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    sleep 1
    if ! kill -0 "$(cat "$W/engine.pid")" 2>/dev/null; then
      log "the engine exited"; tail -n 20 "$elog"; return 1
    fi
    if [ "$(left)" -lt 20 ]; then log "deadline while the engine was starting"; return 1; fi
  done
  log "block $k ($cond): healthy after $(($(date +%s) - t0)) s; $(grep -h 'Graph capturing finished' "$elog" | tail -1 | sed 's/.*\] //')"
}

cells=${CELLS:-4:512 4:1024 4:2048 12:512 12:1024 12:2048}
reps=${REPS:-8}
status=done
for k in $(seq 1 "${BLOCKS:-4}"); do
  if [ $((k % 2)) -eq 1 ]; then cond=a; flags=${ARGS_A:-}; else cond=b; flags=${ARGS_B:-}; fi
  dir=$W/b$k-$cond
  # the cells this block still lacks repetitions of (`measure --resume` runs only what is missing)
  read -r -a todo <<< "$(python3 - "$dir" "$B" "$reps" $cells <<'PY'
import sys
from pathlib import Path
from pdexporter.measure.store import ResultsStore
store, b, reps = ResultsStore(Path(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
done = {cell: store.load_record(b, *map(int, cell.split(":"))) for cell in sys.argv[4:]}
print(" ".join(cell for cell, record in done.items() if record is None or len(record.reps) < reps))
PY
)"
  [ ${#todo[@]} -eq 0 ] && continue
  if [ "$(left)" -lt 150 ]; then status=deadline; log "block $k: $(left) s left, stopping"; break; fi
  # shellcheck disable=SC2086
  start_engine "$k" "$cond" $flags || { stop_engine; status=failed; break; }
  for cell in "${todo[@]}"; do
    d=${cell%%:*}; p=${cell##*:}
    if [ "$(left)" -lt 25 ]; then status=deadline; break; fi
    timeout $(( $(left) - 5 )) python3 -m pdexporter measure --target "http://127.0.0.1:$PORT" --model qwen3-coder-30b-a3b \
      --gpu "${GPU:-H200}" -B "$B" -D "$d" -P "$p" --reps "$reps" --resume --out "$dir" >> "$R/ab/measure.log" 2>&1 \
      || { log "block $k D=$d P=$p: measure exit $?"; }
    log "block $k ($cond) D=$d P=$p: $(grep -a 'TPOT penalty  ' "$R/ab/measure.log" | tail -1 | tr -s ' │' ' ')"
  done
  stop_engine
  [ "$status" = deadline ] && break
done
log "engine-ab: $status ($(left) s of the deadline left)"
finish
tail -n 30 "$R/ab/ab.log"
[ "$status" = done ] && python3 scripts/gpu/block_ab.py "$R/ab"
true
