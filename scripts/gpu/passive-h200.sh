#!/usr/bin/env bash
# Passive mode against injection on one H200 with vLLM 0.22 (issue 17): a synthetic production load
# beside `pdexporter run --passive` for PASSIVE_S seconds, vLLM sending its request traces to the
# exporter; then the cells the passive run filled, measured by injection on the same engine, and the
# comparison. About 10 minutes of device time after the engine is up, over two or three calls: every
# call runs this same script; a step that finished is not run again, and the engine (started in its
# own session) is adopted by the next call.
#
#   bash scripts/gpu/passive-h200.sh SECONDS_FOR_THIS_CALL [PASSIVE_S=300] [RATE=2]
#
# Needs the vLLM bundle in /root/stage (../shared/gpu/README.md), built with what vLLM's tracing and
# pdexporter need beside vLLM (vLLM 0.22 imports both OTLP exporters, gRPC and HTTP, or traces nothing):
#   bash ../shared/gpu/build-vllm-bundle.sh .gpu-stage opentelemetry-sdk==1.45.2 \
#     opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp==1.45.2 \
#     opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2 \
#     opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-proto==1.45.2 \
#     googleapis-common-protos==1.70.0 grpcio==1.74.0 tenacity==9.2.1
# (versions: whatever matches the bundle's opentelemetry-api; the script checks the imports first and
# says which one is missing). Without them the passive run still works from /metrics alone, and the
# comparison says so (events by source).
#
# Results (packed into $OUT at the end of every call): passive-h200.tar.gz with passive/ (records, raw
# windows), passive-table/ (export-table --mode passive), injected/ (records), comparison.md/.json,
# load.json, exporter and engine logs, steps.log; and comparison.md beside it.
set -u
BUDGET=${1:-540}
PASSIVE_S=${2:-300}
RATE=${3:-2}
T0=$(date +%s)
W=${PASSIVE_WORK:-/root/passive}
B=8192
PORT=8000
EXPORTER=18742
URL=http://127.0.0.1:$PORT
mkdir -p "$W"
source scripts/gpu/unpack-bundle.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(date +%T)] $*" | tee -a "$W/steps.log"; }

pack() {
  (cd "$W" && tar czf "$OUT/passive-h200.tar.gz" --ignore-failed-read passive passive-table injected comparison.md \
     comparison.json load.json steps.log exporter.log load.log vllm.log imports.txt 2>/dev/null)
  cp "$W/comparison.md" "$OUT/" 2>/dev/null
  cp "$W/steps.log" "$OUT/" 2>/dev/null
}
trap pack EXIT

# 0. What this machine has: vLLM's tracing needs both OTLP exporters; pdexporter needs its own deps.
if [ ! -f "$W/imports.txt" ]; then
  python3 - > "$W/imports.txt" 2>&1 <<'EOF'
import importlib
for name in ("vllm", "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
             "opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
             "pdexporter.exporter.runner"):
    try:
        importlib.import_module(name)
        print("ok     ", name)
    except Exception as exc:  # noqa: BLE001
        print("MISSING", name, type(exc).__name__, exc)
EOF
  cat "$W/imports.txt"
fi
grep -q "MISSING pdexporter" "$W/imports.txt" && { log "pdexporter cannot run here (see imports.txt)"; exit 1; }
grep -q "MISSING opentelemetry.exporter.otlp.proto.grpc" "$W/imports.txt" \
  && log "vLLM will send no traces (an OTLP exporter is missing): passive runs from /metrics alone"

# 1. vLLM 0.22 at B = 8192, sending one llm_request span per finished request to the exporter.
if ! curl -sf "$URL/health" > /dev/null; then
  log "starting vLLM (B=$B, traces to http://127.0.0.1:$EXPORTER/v1/traces)"
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf VLLM_USE_FLASHINFER_SAMPLER=0 setsid python3 -m vllm.entrypoints.cli.main \
    serve /tmp/model/qwen3-coder-30b-a3b --served-model-name qwen3-coder-30b-a3b --load-format dummy \
    --max-model-len 200000 --max-num-batched-tokens $B --enable-chunked-prefill --enable-prefix-caching \
    --gpu-memory-utilization 0.9 --host 127.0.0.1 --port $PORT \
    --otlp-traces-endpoint "http://127.0.0.1:$EXPORTER/v1/traces" >> "$W/vllm.log" 2>&1 < /dev/null &
  until curl -sf "$URL/health" > /dev/null; do
    [ "$(left)" -lt 30 ] && { log "vLLM not up yet; the next call adopts it"; exit 0; }
    sleep 2
  done
  log "vLLM healthy after $(( $(date +%s) - T0 )) s of this call"
fi

# 2. The passive run beside the load (needs PASSIVE_S + 60 s of this call).
if [ ! -f "$W/passive.done" ]; then
  if [ "$(left)" -lt $(( PASSIVE_S + 60 )) ]; then log "passive run needs $(( PASSIVE_S + 60 )) s: next call"; exit 0; fi
  rm -rf "$W/passive"
  log "passive: run --passive for $PASSIVE_S s beside $RATE req/s"
  python3 -m pdexporter run --passive --target "$URL" --chunk-size $B --decode-batch-size 4 \
    --listen 127.0.0.1:$EXPORTER --out "$W/passive" --duration "${PASSIVE_S}s" --attribution-wait 20s \
    > "$W/exporter.log" 2>&1 &
  RUN=$!
  sleep 15  # the exporter's warm-up and probes first
  python3 -m pdexporter load --target "$URL" --rate "$RATE" --duration "$(( PASSIVE_S - 40 ))s" --seed 17 \
    --out "$W/load.json" > "$W/load.log" 2>&1
  wait $RUN && touch "$W/passive.done"
  log "passive: $(ls "$W"/passive/$B/*.json 2>/dev/null | wc -l) cells; exporter rc $?"
  python3 -m pdexporter export-table "$W/passive" --mode passive --out "$W/passive-table" --no-plots \
    > "$W/passive-table.log" 2>&1
fi

# 3. The same cells by injection on the same engine (no load), then the comparison.
[ -f "$W/passive.done" ] || exit 0
python3 scripts/gpu/passive_vs_injected.py "$W/passive" --target "$URL" --out "$W/injected" --report "$W" \
  --min-events 5 --cells 12 --reps 3 --deadline "$(( $(left) - 20 ))" 2>&1 | tee -a "$W/steps.log" | tail -40
