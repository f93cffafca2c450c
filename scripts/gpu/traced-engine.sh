# Sourced by passive-h200.sh and live-thresholds-h200.sh (not run alone): the engine at B, sending one
# llm_request span per finished request to the exporter's receiver on TRACES_PORT.
#   0. the parts: the vLLM bundle, then the OpenTelemetry wheels into the same site directory;
#   1. before tracing is turned on, does the engine's Python import what vLLM 0.22's tracing imports
#      (doctor's check; an incomplete install takes vLLM down with --otlp-traces-endpoint: every
#      request HTTP 500)? Sets TRACES (the engine's flags) and TRACING (on / off);
#   2. the engine started in its own session (it outlives the call; a later call adopts it), with the
#      Triton / Inductor caches of the committed pack; exits the call when it is not up in time.
# Needs: W, ENGINE (vllm | sim), B, PORT, URL, TRACES_PORT, T0, and the functions left, log, alive;
# MAX_MODEL_LEN (vLLM's, default 200000; 65536 on an H100, whose 80 GB hold ~110K tokens of KV cache).
MAX_MODEL_LEN=${MAX_MODEL_LEN:-200000}

if [ "$ENGINE" = vllm ]; then
  source scripts/gpu/unpack-bundle.sh  # (the OpenTelemetry wheels too: unpack-bundle.sh)
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 COLUMNS=200  # the CLIs' tables and summaries unwrapped in the logs

if [ ! -f "$W/imports.txt" ]; then
  ENGINE=$ENGINE python3 - > "$W/imports.txt" 2>&1 <<'PY'
import os
from pdexporter.doctor.checks import tracing_imports_check
from pdexporter.doctor.gather import tracing_imports
embedded = os.environ["ENGINE"] == "sim"  # the embedded engine exports with pdexporter's own SDK
check = tracing_imports_check(tracing_imports(None if embedded else "python3", "the engine's python", embedded=embedded))
print(check.status, check.why)
PY
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

start_traced_engine() {
  curl -sf "$URL/health" > /dev/null && return 0
  # shellcheck source=/dev/null
  [ "$ENGINE" = vllm ] && { source scripts/gpu/engine-cache.sh || true; }
  log "starting $ENGINE (B=$B, traces $TRACING)"
  if [ "$ENGINE" = vllm ]; then
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf VLLM_USE_FLASHINFER_SAMPLER=0 setsid python3 -m vllm.entrypoints.cli.main \
      serve /tmp/model/qwen3-coder-30b-a3b --served-model-name qwen3-coder-30b-a3b --load-format dummy \
      --max-model-len "$MAX_MODEL_LEN" --max-num-batched-tokens $B --enable-chunked-prefill --enable-prefix-caching \
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
}
