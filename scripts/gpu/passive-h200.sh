#!/usr/bin/env bash
# Passive mode with vLLM's request traces on one H200 (issue 23), against injection on the same engine:
#   1. the engine's OpenTelemetry imports checked (doctor's code) before tracing is turned on: an
#      incomplete install takes vLLM 0.22 down with --otlp-traces-endpoint (every request HTTP 500);
#   2. vLLM 0.22 at B = 8192 sending its request spans to `pdexporter run --passive`'s receiver;
#   3. `pdexporter load --rate RATE` for PASSIVE_S seconds beside the exporter (4 probes), and
#      `doctor --traces` once during it (do spans arrive, with what delay);
#   4. the injected sweep on the same engine once the load stopped (sweeps/passive-h200.yaml);
#   5. export-table --mode passive --injected (the event model, its error vs minutes of traffic) and
#      scripts/gpu/passive_compare.py (trace-based vs cadence-based attribution, same events).
#
#   bash scripts/gpu/passive-h200.sh BUDGET_S [PASSIVE_S=600] [RATE=1.5]
#
# From the environment: SEED (the load's, default 17) and MIX (its prompt mix, default sharegpt-like);
# INJECTED=DIR takes the injected sweep of an earlier passive run on the same engine (its
# PASSIVE_WORK/injected) instead of measuring one again, so two runs at different rates, seeds and
# mixes share one reference (scripts/gpu/validation.sh passive-two); STOP_ENGINE=1 stops the engine
# once this run's analysis is written (the next step of the campaign needs the GPU).
#
# Every call runs this same script within BUDGET_S (<= 590 for a 600 s device call); a step that
# finished is not run again, and the engine, the exporter and the load (each in its own session)
# go on between calls and are adopted by the next. Two calls back to back, ~14.5 minutes of wall
# time for PASSIVE_S = 600: vLLM start ~2-2.5 min, exporter up ~15 s, 10 min of traffic + 20 s of
# attribution, the sweep ~1 min (D 4-12; D 1, 2 if the call has time), the analysis ~0.5 min; plus
# ~1 min to unpack the bundle when /tmp/site is not there yet. PASSIVE_S = 1800 for the 30-minute
# model takes a third call (~35 minutes in all). Measured on one H200 with PASSIVE_S = 180
# (results/h200-vllm0.22-qwen3-coder-30b-a3b-passive/RUN.md): vLLM healthy 140 s into the first
# call, the passive step 215 s (180 s of load + the exporter's 35 s tail), the injected sweep of
# 42 configs x 2 repetitions 62 s; export-table and passive_compare.py (in parallel) ~25 s and ~40 s
# on 2 CPU cores.
#
# Needs on the machine: the vLLM bundle in /root/stage (../shared/gpu/README.md) and the
# OpenTelemetry wheels vLLM's tracing imports, carried as .gpu-stage-otel/otel-site.tar.gz (built by
# scripts/gpu/build-otel-stage.sh; the bundle has opentelemetry-api only).
# Dry run on the embedded engine (no GPU, real time):  OUT=/tmp/out ENGINE=sim bash scripts/gpu/passive-h200.sh 590 60
#
# Results in $OUT (5 files): passive-h200.tar.gz (records, tables, comparison, logs), SUMMARY.md
# (RUN.md-ready), comparison.json, passive_convergence.png, steps.log.
set -u
BUDGET=${1:-590}
PASSIVE_S=${2:-600}
RATE=${3:-1.5}
SEED=${SEED:-17}
MIX=${MIX:-sharegpt-like}
INJECTED=${INJECTED:-}
ENGINE=${ENGINE:-vllm}
T0=$(date +%s)
W=${PASSIVE_WORK:-/root/passive}
B=8192
PORT=${ENGINE_PORT:-8000}
EXPORTER=${EXPORTER_PORT:-18742}
TRACES_PORT=${TRACES_PORT:-18743}  # the exporter's trace receiver: a port of its own (docs/security.md)
URL=http://127.0.0.1:$PORT
REFERENCE=results/h200-vllm0.22-qwen3-coder-30b-a3b
OUT=${OUT:?set OUT}
mkdir -p "$W" "$OUT"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(date +%T)] $*" | tee -a "$W/steps.log"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

pack() {
  (cd "$W" && tar czf "$OUT/passive-h200.tar.gz" --ignore-failed-read passive passive-table injected comparison.md plots \
     comparison.json SUMMARY.md load.json steps.log exporter.log exporter-metrics.txt load.log engine.log sweep.log \
     imports.txt doctor-traces.txt export-table.log 2>/dev/null)
  for f in SUMMARY.md comparison.json steps.log; do cp "$W/$f" "$OUT/" 2>/dev/null; done
  cp "$W/passive-table/plots/passive_convergence.png" "$OUT/" 2>/dev/null
  true
}
trap pack EXIT

# 0. The parts: the vLLM bundle, then the OpenTelemetry wheels into the same site directory.
if [ "$ENGINE" = vllm ]; then
  source scripts/gpu/unpack-bundle.sh  # (the OpenTelemetry wheels too: unpack-bundle.sh)
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 COLUMNS=200  # the CLIs' tables and summaries unwrapped in the logs

[ -f "$W/analysis.done" ] && { log "$W: this run is done (analysis written)"; exit 0; }

# 1. Before tracing is turned on: does the engine's Python import what vLLM 0.22's tracing imports?
if [ ! -f "$W/imports.txt" ]; then
  ENGINE=$ENGINE python3 - > "$W/imports.txt" 2>&1 <<'EOF'
import os
from pdexporter.doctor.checks import tracing_imports_check
from pdexporter.doctor.gather import tracing_imports
embedded = os.environ["ENGINE"] == "sim"  # the embedded engine exports with pdexporter's own SDK
check = tracing_imports_check(tracing_imports(None if embedded else "python3", "the engine's python", embedded=embedded))
print(check.status, check.why)
EOF
  log "tracing imports: $(cat "$W/imports.txt")"
fi
TRACES=()
TRACING=off
if grep -q "^ok" "$W/imports.txt"; then
  TRACES=(--otlp-traces-endpoint "http://127.0.0.1:$TRACES_PORT/v1/traces")
  TRACING=on
else
  log "tracing stays off (it would take vLLM down): passive runs from /metrics and the cadence alone"
fi

# 2. The engine at B, sending one llm_request span per finished request to the exporter.
if ! curl -sf "$URL/health" > /dev/null; then
  # the Triton / Inductor caches of the committed pack (and of this machine's earlier engines)
  # shellcheck source=/dev/null
  [ "$ENGINE" = vllm ] && { source scripts/gpu/engine-cache.sh || true; }
  log "starting $ENGINE (B=$B, traces $TRACING)"
  if [ "$ENGINE" = vllm ]; then
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf VLLM_USE_FLASHINFER_SAMPLER=0 setsid python3 -m vllm.entrypoints.cli.main \
      serve /tmp/model/qwen3-coder-30b-a3b --served-model-name qwen3-coder-30b-a3b --load-format dummy \
      --max-model-len 200000 --max-num-batched-tokens $B --enable-chunked-prefill --enable-prefix-caching \
      --gpu-memory-utilization 0.9 --host 127.0.0.1 --port $PORT "${TRACES[@]}" >> "$W/engine.log" 2>&1 < /dev/null &
  else
    setsid python3 -m pdexporter sim serve --profile h200-qwen3-coder-30b-a3b --chunk-size $B --host 127.0.0.1 \
      --port $PORT "${TRACES[@]}" >> "$W/engine.log" 2>&1 < /dev/null &
  fi
  echo $! > "$W/engine.pid"
  until curl -sf "$URL/health" > /dev/null; do
    [ "$(left)" -lt 30 ] && { log "engine not up yet; the next call adopts it"; exit 0; }
    alive "$W/engine.pid" || { log "the engine exited (engine.log)"; tail -5 "$W/engine.log"; exit 1; }
    sleep 2
  done
  log "engine healthy after $(( $(date +%s) - T0 )) s of this call"
fi

# 3. run --passive beside the load (both in their own sessions: they outlive this call).
if [ ! -f "$W/passive.started" ]; then
  rm -rf "$W/passive"
  setsid python3 -m pdexporter run --passive --target "$URL" --chunk-size $B --decode-batch-size 4 \
    --listen 127.0.0.1:$EXPORTER --traces-listen 127.0.0.1:$TRACES_PORT --out "$W/passive" --duration "$(( PASSIVE_S + 35 ))s" --attribution-wait 20s \
    > "$W/exporter.log" 2>&1 < /dev/null &
  echo $! > "$W/exporter.pid"
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$EXPORTER/metrics" 2>/dev/null | grep -q '^pdexporter_up 1' && break
    sleep 1
  done
  setsid python3 -m pdexporter load --target "$URL" --rate "$RATE" --duration "${PASSIVE_S}s" --seed "$SEED" \
    --mix "$MIX" --out "$W/load.json" > "$W/load.log" 2>&1 < /dev/null &
  echo $! > "$W/load.pid"
  date +%s > "$W/passive.started"
  log "passive: run --passive + load at $RATE req/s (seed $SEED, $MIX) for $PASSIVE_S s started"
  # do the engine's spans reach the exporter, and how late? (reads the running exporter's counters)
  (sleep 20; python3 -m pdexporter doctor --target "$URL" --chunk-size $B --traces \
     --traces-receiver "127.0.0.1:$TRACES_PORT" --traces-wait 20 > "$W/doctor-traces.txt" 2>&1) &
fi
if [ ! -f "$W/passive.done" ]; then
  while alive "$W/exporter.pid" || alive "$W/load.pid"; do
    [ "$(left)" -lt 25 ] && { log "passive run still going ($(( $(date +%s) - $(cat "$W/passive.started") )) s in): the next call waits for it"; exit 0; }
    # the exporter's own counters (every run of slow steps by outcome and source, the live model's
    # gauges): the last scrape before it stops is kept, the records hold the published events only
    curl -sf "http://127.0.0.1:$EXPORTER/metrics" > "$W/exporter-metrics.tmp" 2>/dev/null \
      && mv "$W/exporter-metrics.tmp" "$W/exporter-metrics.txt"
    sleep 5
  done
  touch "$W/passive.done"
  log "passive: $(ls "$W"/passive/$B/*.json 2>/dev/null | wc -l) cells; $(grep -h "traces arrive" "$W/doctor-traces.txt" 2>/dev/null | head -1)"
fi

# 4. The injected table of the same engine, its load gone (resumes across calls: complete records are skipped),
#    or an earlier run's on this engine (INJECTED).
if [ -n "$INJECTED" ] && [ ! -f "$W/injected.done" ]; then
  [ -f "$INJECTED/../injected.done" ] || log "INJECTED=$INJECTED: that sweep did not finish; its cells so far are used"
  rm -rf "$W/injected" && cp -a "$INJECTED" "$W/injected" && touch "$W/injected.done"
  log "injected: $(ls "$W"/injected/$B/*.json 2>/dev/null | wc -l) cells from $INJECTED"
fi
if [ ! -f "$W/injected.done" ]; then
  budget=$(( $(left) - 50 ))
  if [ "$budget" -gt 60 ]; then
    log "injected sweep on the same engine (deadline ${budget}s)"
    python3 -m pdexporter sweep sweeps/passive-h200.yaml --target "$URL" --chunk-size $B --out "$W/injected" \
      --deadline "${budget}s" >> "$W/sweep.log" 2>&1 && touch "$W/injected.done"
    log "injected: $(ls "$W"/injected/$B/*.json 2>/dev/null | wc -l) cells"
  else
    log "no time left for the injected sweep in this call: the next call runs it"; exit 0
  fi
fi

# 5. The event model and its convergence; trace-based vs cadence-based attribution.
# The injected records of this run where there are any (a sweep cut short leaves some); the
# committed injected table of the same engine only fills cells this run's sweep did not reach,
# and only where this tree has it (a device tree may leave results/ out).
INJ=()
ls "$W"/injected/$B/D*_P*.json > /dev/null 2>&1 && INJ=(--injected "$W/injected")
python3 -m pdexporter export-table "$W/passive" --mode passive "${INJ[@]}" --out "$W/passive-table" \
  --no-parquet > "$W/export-table.log" 2>&1 &
TABLE=$!
REF=()
[ "$ENGINE" = vllm ] && [ ! -f "$W/injected.done" ] && [ -d "$REFERENCE" ] && REF=(--reference "$REFERENCE")
python3 scripts/gpu/passive_compare.py "$W/passive" --injected "$W/injected" "${REF[@]}" --out "$W" \
  > /dev/null 2>> "$W/steps.log" || log "passive_compare failed"
wait $TABLE || log "export-table failed (export-table.log)"
{
  echo "# Passive mode on $ENGINE (traces $TRACING), against injection on the same engine (issue 23)"
  echo
  echo "- engine: $ENGINE at B = $B; \`pdexporter load --rate $RATE --seed $SEED --mix $MIX\` for $PASSIVE_S s beside"
  echo "  \`run --passive\` (4 probes); versions: $(python3 -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null || echo "embedded engine (MODELLED)")"
  echo "- tracing imports (checked before tracing was turned on): $(cat "$W/imports.txt")"
  echo "- spans arriving (doctor --traces during the load): $(grep -h "traces arrive" "$W/doctor-traces.txt" 2>/dev/null | tr -s ' │' ' ' | head -c 400)"
  echo "- exporter: $(tail -3 "$W/exporter.log" 2>/dev/null | tr '\n' ' ' | head -c 600)"
  echo "- load: $(tail -1 "$W/load.log" 2>/dev/null)"
  echo
  echo '```'
  grep -h -A12 "passive event model" "$W/export-table.log" 2>/dev/null | grep -v "^$" | head -12
  echo '```'
  echo
  cat "$W/comparison.md" 2>/dev/null
} > "$W/SUMMARY.md"
touch "$W/analysis.done"
log "done in this call after $(( $(date +%s) - T0 )) s"
if [ -n "${STOP_ENGINE:-}" ]; then  # this run's engine or the one it adopted (the same port)
  pkill -f "(vllm.entrypoints.cli.main|pdexporter sim) serve .*--port $PORT" 2>/dev/null
  for _ in $(seq 30); do curl -sf "$URL/health" > /dev/null || break; sleep 1; done
  log "engine stopped"
fi
