#!/usr/bin/env bash
# The router threshold, live from production traffic, on one H200 (issue 33, item 4):
#   1-2. vLLM 0.22 at B = 8192 sending its request spans to `pdexporter run --passive`'s receiver
#        (the OpenTelemetry imports checked first, as scripts/gpu/passive-h200.sh does);
#   3. `run --passive --decision results/h200x2-arms/decision.json --threshold-every 60s` (4 probes)
#      beside two loads in one run: `pdexporter load --rate RATE1` for LOAD1_S, then RATE2 for LOAD2_S;
#      every 15 s the exporter's threshold series go to thresholds.tsv and /thresholds.yaml to
#      thresholds/N.yaml (with its Age and events);
#   4. the injected table of the same engine once the load stopped (sweeps/passive-h200.yaml), its
#      two-arm decision.json with the committed pair's arm, and `pdexporter thresholds` of it: the
#      batch threshold the live one is compared with (summary.py below: within its interval?).
#
#   bash scripts/gpu/live-thresholds-h200.sh BUDGET_S [LOAD1_S=300] [RATE1=1] [LOAD2_S=300] [RATE2=2.5] \
#       [MIX1=sharegpt-like] [MIX2=sharegpt-like]     # `pdexporter load --mix` of each phase
#
# Every call runs this same script within BUDGET_S (<= 590 for a 600 s device call); a finished
# step is not run again; the engine, the exporter and the loads go on between calls (own sessions).
# Expected on one H200 (passive-h200.sh's figures): vLLM ~2.5 min, 10 min of traffic, the injected
# sweep ~1 min, the analysis ~1 min: two calls back to back.
# Dry run on the embedded engine (no GPU, real time, no injected sweep):
#   OUT=/tmp/out ENGINE=sim SKIP_INJECTED=1 bash scripts/gpu/live-thresholds-h200.sh 590 90 1 90 2.5
# Results in $OUT: live-thresholds.tar.gz (everything), SUMMARY.md (RUN.md-ready), thresholds.tsv, steps.log.
set -u
BUDGET=${1:-590}
LOAD1_S=${2:-300}
RATE1=${3:-1}
LOAD2_S=${4:-300}
RATE2=${5:-2.5}
MIX1=${6:-sharegpt-like}
MIX2=${7:-sharegpt-like}
ENGINE=${ENGINE:-vllm}
T0=$(date +%s)
W=${LIVE_WORK:-/root/live-thresholds}
B=8192
PORT=${ENGINE_PORT:-8000}
EXPORTER=${EXPORTER_PORT:-18742}
TRACES_PORT=${TRACES_PORT:-18743}
URL=http://127.0.0.1:$PORT
DECISION=results/h200x2-arms/decision.json
PAIR=results/h200x2-vllm0.22-qwen3-coder-30b-a3b-pd
OUT=${OUT:?set OUT}
mkdir -p "$W/thresholds" "$OUT"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(date +%T)] $*" | tee -a "$W/steps.log"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

pack() {
  (cd "$W" && tar czf "$OUT/live-thresholds.tar.gz" --ignore-failed-read thresholds thresholds.tsv passive injected \
     batch SUMMARY.md steps.log exporter.log load1.log load2.log load1.json load2.json load2.started passive.started engine.log sweep.log imports.txt 2>/dev/null)
  for f in SUMMARY.md thresholds.tsv steps.log; do cp "$W/$f" "$OUT/" 2>/dev/null; done
  true
}
trap pack EXIT

# 0-2. The parts, the tracing check and the engine at B sending its spans to the exporter (traced-engine.sh).
source scripts/gpu/traced-engine.sh
start_traced_engine

# 3. run --passive --decision beside two loads, one after the other; the threshold series sampled.
TOTAL_S=$(( LOAD1_S + LOAD2_S ))
if [ ! -f "$W/passive.started" ]; then
  rm -rf "$W/passive"
  setsid python3 -m pdexporter run --passive --target "$URL" --chunk-size $B --decode-batch-size 4 \
    --listen 127.0.0.1:$EXPORTER --traces-listen 127.0.0.1:$TRACES_PORT --out "$W/passive" \
    --duration "$(( TOTAL_S + 35 ))s" --attribution-wait 20s --decision "$DECISION" --threshold-every 60s \
    > "$W/exporter.log" 2>&1 < /dev/null &
  echo $! > "$W/exporter.pid"
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$EXPORTER/metrics" 2>/dev/null | grep -q '^pdexporter_up 1' && break
    sleep 1
  done
  # the two loads in one session: RATE1, then RATE2 (the phase boundary goes into steps.log)
  setsid bash -c "python3 -m pdexporter load --target '$URL' --rate '$RATE1' --duration '${LOAD1_S}s' --seed 17 --mix '$MIX1' --out '$W/load1.json' \
      > '$W/load1.log' 2>&1; date +%s > '$W/load2.started'; \
    python3 -m pdexporter load --target '$URL' --rate '$RATE2' --duration '${LOAD2_S}s' --seed 18 --mix '$MIX2' --out '$W/load2.json' \
      > '$W/load2.log' 2>&1" < /dev/null > /dev/null 2>&1 &
  echo $! > "$W/load.pid"
  date +%s > "$W/passive.started"
  printf 'unix_s\tphase\tdecode_batch_size\tbound\ttokens\n' > "$W/thresholds.tsv"
  log "live thresholds: run --passive --decision + load $RATE1 req/s ($MIX1) for $LOAD1_S s, then $RATE2 ($MIX2) for $LOAD2_S s"
fi
if [ ! -f "$W/passive.done" ]; then
  n=$(ls "$W/thresholds" | grep -c "yaml$")
  while alive "$W/exporter.pid" || alive "$W/load.pid"; do
    [ "$(left)" -lt 25 ] && { log "live run still going: the next call samples on"; exit 0; }
    now=$(date +%s)
    phase=$RATE1; [ -f "$W/load2.started" ] && phase=$RATE2
    curl -sf "http://127.0.0.1:$EXPORTER/metrics" 2>/dev/null | python3 -c '
import sys
from prometheus_client.parser import text_string_to_metric_families as families
for family in families(sys.stdin.read()):
    if family.name == "pdexporter_offload_threshold_tokens":
        for s in family.samples:
            print(sys.argv[1], sys.argv[2], s.labels["decode_batch_size"], s.labels["bound"], s.value, sep="\t")
' "$now" "$phase" >> "$W/thresholds.tsv"
    if curl -sf -D "$W/thresholds/headers.tmp" -o "$W/thresholds/body.tmp" "http://127.0.0.1:$EXPORTER/thresholds.yaml"; then
      n=$((n + 1)); { tr -d '\r' < "$W/thresholds/headers.tmp" | grep -i '^age\|^x-pdexporter' | sed 's/^/# header: /'
                     echo "# sampled at $now, load $phase req/s"; cat "$W/thresholds/body.tmp"; } > "$W/thresholds/$n.yaml"
    fi
    sleep 15
  done
  touch "$W/passive.done"
  log "live run done: $(ls "$W/thresholds" | grep -c yaml) /thresholds.yaml samples"
fi

# 4. The batch threshold: the injected table of the same engine beside the committed pair's arm.
if [ "${SKIP_INJECTED:-0}" != 1 ] && [ ! -f "$W/injected.done" ]; then
  budget=$(( $(left) - 60 ))
  if [ "$budget" -gt 60 ]; then
    log "injected sweep on the same engine (deadline ${budget}s)"
    python3 -m pdexporter sweep sweeps/passive-h200.yaml --target "$URL" --chunk-size $B --out "$W/injected" \
      --deadline "${budget}s" >> "$W/sweep.log" 2>&1 && touch "$W/injected.done"
  else
    log "no time left for the injected sweep in this call: the next call runs it"; exit 0
  fi
fi
if [ -f "$W/injected.done" ]; then
  python3 -m pdexporter export-table "$W/injected" --offloaded "$PAIR" --out "$W/batch" --no-plots --no-parquet \
    > "$W/batch.log" 2>&1 && python3 -m pdexporter thresholds --model "$W/batch/decision.json" -B $B --out "$W/batch" \
    >> "$W/batch.log" 2>&1 || log "the batch thresholds failed (batch.log)"
  BATCH="$W/batch/offload_thresholds.json"
else
  BATCH=""
fi
python3 -c "import sys; from pdexporter.analysis.live_run import live_run_summary as s; print(s(*sys.argv[1:]))" \
  "$W" "$BATCH" "$DECISION" "$ENGINE" > "$W/SUMMARY.md"
cat "$W/SUMMARY.md" | tee -a "$W/steps.log"
log "done in this call after $(( $(date +%s) - T0 )) s"
