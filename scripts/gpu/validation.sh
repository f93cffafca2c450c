#!/usr/bin/env bash
# Issue 30's validation campaign on one H200 (nvidia-h200), planned and committed before it ran
# (results/h200-vllm0.22-qwen3-coder-30b-a3b-validation/PLAN.md). One step per device call:
#
#   bash scripts/gpu/validation.sh stage N          copy .gpu-stage/N/* to /root/stage   (carry .gpu-stage/N)
#   bash scripts/gpu/validation.sh colocated [S]    vLLM B = 8192: sweeps/h200-validation.yaml, deadline S s
#                                                   (SWEEP=another file, NAME=its results' name, e.g. the graph
#                                                   flags' sweeps/h200-validation-graphs.yaml, NAME=validation-graphs)
#   bash scripts/gpu/validation.sh reference [S]    the reference points (sweeps/h200-reference.yaml), warm from the engine-cache pack
#   bash scripts/gpu/validation.sh decodebench [S]  + DecodeBenchConnector: sweeps/h200-decodebench-validation.yaml
#   bash scripts/gpu/validation.sh db-then-passive  decodebench (deadline 330 s), then passive for the rest of a 590 s call
#   bash scripts/gpu/validation.sh passive [S]      vLLM + traces, run --passive beside `load --rate 2` for 300 s,
#                                                   then the injected sweep of the same engine (scripts/gpu/passive-h200.sh;
#                                                   carry .gpu-stage-otel; a second call finishes what the first began)
#   bash scripts/gpu/validation.sh passive-two [S]  the same at 2 req/s (seed 17, sharegpt-like, 300 s), then on the same
#                                                   engine at 1 req/s (seed 29, documents-heavy, 240 s) against the first
#                                                   run's injected sweep; the engine stopped at the end. Every call runs the
#                                                   same command until "passive-two: both done"; $OUT/2rps/, $OUT/1rps/
#   bash scripts/gpu/validation.sh passive-spread [S]
#                                                   the injected reference spread over the passive minutes (issue 30
#                                                   item 4): on one engine, 5 x (60 s of run --passive + `load --rate 2`,
#                                                   seed 41+k-1, sharegpt-like; then one repetition of every cell of
#                                                   sweeps/passive-h200.yaml, the exporter and the load stopped); the
#                                                   analysis, the engine stopped. Two 590 s calls (~15 min with the vLLM
#                                                   start); every call runs the same command until "passive-spread: done".
#                                                   SEGMENTS, SEG_S, RATE, SEED, MIX, SWEEP, PASSIVE_WORK override
#                                                   (scripts/gpu/passive-h200.sh, spread mode); $OUT/spread/
#
# On another GPU, GPU=H100 MAX_MODEL_LEN=65536 before the step (scripts/gpu/grid-for-gpu.sh).
# A step may follow a stage in one call: `validation.sh stage 3 && validation.sh colocated 420`.
# Results: $OUT/<step>.tgz (records + raw, engine logs trimmed) and $OUT/<step>.log.
set -u
cd "$(dirname "$0")/../.."
step=${1:?step}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 COLUMNS=200
R=/root/r
mkdir -p "$R"

unpack() {
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  if [ -f .gpu-stage-otel/otel-site.tar.gz ] && [ ! -f /tmp/site/.otel-stage ]; then
    tar -C /tmp/site -xzf .gpu-stage-otel/otel-site.tar.gz && touch /tmp/site/.otel-stage
  fi
  export PYTHONPATH=/tmp/site
  python3 -c "import pdexporter.cli" || { echo "pdexporter does not import on this machine"; exit 1; }
}

pack() {  # pack NAME DIR...: results without the full engine logs, with a trimmed copy of each
  local name=$1; shift
  # shellcheck source=/dev/null
  source scripts/gpu/engine-logs.sh && trim_engine_logs 4000 "$@"
  tar czf "$OUT/$name.tgz" --exclude=engine.log "$@" 2>/dev/null
  ls -la "$OUT"
}

sweep() {  # sweep NAME FILE DEADLINE
  local name=$1 file=$2 deadline=$3
  unpack
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$R/$name-gpu.csv"
  # shellcheck source=/dev/null
  source scripts/gpu/grid-for-gpu.sh
  file=$(grid_for_gpu "$file" "$R" 2> "$R/$name.log")
  local t0; t0=$(date +%s)
  timeout $((deadline + 40)) python3 -m pdexporter sweep "$file" --out "$R/$name" --deadline "${deadline}s" \
    >> "$R/$name.log" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - t0 ))s" >> "$R/$name.log"
  cp "$R/$name.log" "$R/$name-gpu.csv" "$OUT/"
  tail -n 30 "$R/$name.log"
  pack "$name" "$R/$name"
}

case "$step" in
  stage)
    mkdir -p /root/stage && cp ".gpu-stage/$2/"* /root/stage/ && ls -la /root/stage ;;
  colocated)
    sweep "${NAME:-validation}" "${SWEEP:-sweeps/h200-validation.yaml}" "${2:-420}" ;;
  reference)
    # shellcheck source=/dev/null
    source scripts/gpu/engine-cache.sh || exit 1
    sweep reference sweeps/h200-reference.yaml "${2:-200}" ;;
  decodebench)
    sweep db-validation sweeps/h200-decodebench-validation.yaml "${2:-420}" ;;
  db-then-passive)
    t0=$(date +%s)
    bash "$0" decodebench 330
    bash "$0" passive $(( 585 - ($(date +%s) - t0) )) ;;
  passive)
    PASSIVE_WORK=/root/passive-2rps bash scripts/gpu/passive-h200.sh "${2:-590}" 300 2.0 ;;
  passive-two)
    t0=$(date +%s); budget=${2:-590}; out=$OUT
    left() { echo $(( budget - ($(date +%s) - t0) )); }
    OUT=$out/2rps PASSIVE_WORK=/root/passive-2rps bash scripts/gpu/passive-h200.sh "$(left)" "${PASSIVE_S_2RPS:-300}" 2.0
    [ -f /root/passive-2rps/analysis.done ] || exit 0
    [ "$(left)" -gt 40 ] || { echo "passive-two: the 1 req/s run starts in the next call"; exit 0; }
    OUT=$out/1rps PASSIVE_WORK=/root/passive-1rps SEED=29 MIX=documents-heavy INJECTED=/root/passive-2rps/injected \
      STOP_ENGINE=1 bash scripts/gpu/passive-h200.sh "$(left)" "${PASSIVE_S_1RPS:-240}" 1.0
    [ -f /root/passive-1rps/analysis.done ] && echo "passive-two: both done" ;;
  passive-spread)
    w=${PASSIVE_WORK:-/root/passive-spread}
    OUT=$OUT/spread PASSIVE_WORK=$w SEGMENTS=${SEGMENTS:-5} SEED=${SEED:-41} MIX=${MIX:-sharegpt-like} STOP_ENGINE=1 \
      bash scripts/gpu/passive-h200.sh "${2:-590}" "${SEG_S:-60}" "${RATE:-2.0}"
    if [ -f "$w/analysis.done" ]; then echo "passive-spread: done"; else echo "passive-spread: not finished: the same command in the next call goes on"; fi ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
