#!/usr/bin/env bash
# GPU session 4 on one H200 (nvidia-h200): issue 21's small-P region on both arms and the fine P
# sweep, then issue 22's SGLang in both scheduling modes. One step per device call; each call
# carries one part (the vLLM bundle's, then SGLang's) and runs what it can:
#
#   bash scripts/gpu/session4.sh stage N         copy .gpu-stage/N/* to /root/stage      (carry .gpu-stage/N)
#   bash scripts/gpu/session4.sh sgl-stage N     copy .gpu-stage-sgl/N/* to /root/stage-sgl (carry .gpu-stage-sgl/N)
#   bash scripts/gpu/session4.sh colocated [S]   vLLM B = 8192: sweeps/h200-small-p.yaml (small P + fine P), deadline S s
#   bash scripts/gpu/session4.sh decodebench [S] vLLM + DecodeBenchConnector: sweeps/h200-decodebench-small-p.yaml
#   bash scripts/gpu/session4.sh sglang          SGLang 0.5.15.post1, both modes (scripts/gpu/sglang-h200.sh)
#
# A step may start with a stage: `session4.sh sgl-stage 1 && session4.sh decodebench`. Results come
# back as $OUT/<step>.tgz (records + raw, engine logs trimmed) and $OUT/<step>.log.
set -u
cd "$(dirname "$0")/../.."
step=${1:?step}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
R=/root/r
mkdir -p "$R"

unpack() {
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  # pdexporter's own dependencies the GPU image lacks (tenacity, opentelemetry-sdk, ...): carry .gpu-stage-otel
  if [ -f .gpu-stage-otel/otel-site.tar.gz ] && [ ! -f /tmp/site/.otel-stage ]; then
    tar -C /tmp/site -xzf .gpu-stage-otel/otel-site.tar.gz && touch /tmp/site/.otel-stage
  fi
  export PYTHONPATH=/tmp/site
  python3 -c "import pdexporter.cli" || { echo "pdexporter does not import on this machine"; exit 1; }
}

pack() {  # pack NAME DIR...: results without the full engine logs, with a trimmed copy of each
  local name=$1; shift
  for log in $(find "$@" -name engine.log 2>/dev/null); do
    { head -c 300000 "$log"; echo; echo "# ... (cut) ... last iteration lines:"; grep -a "Iteration(" "$log" | tail -n 4000; } \
      > "${log%.log}.trimmed.log"
  done
  tar czf "$OUT/$name.tgz" --exclude=engine.log "$@" 2>/dev/null
  ls -la "$OUT"
}

sweep() {  # sweep NAME FILE DEADLINE
  local name=$1 file=$2 deadline=$3
  unpack
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$R/$name-gpu.csv"
  timeout $((deadline + 40)) python3 -m pdexporter sweep "$file" --out "$R/$name" --deadline "${deadline}s" \
    > "$R/$name.log" 2>&1
  echo "$name rc=$?" >> "$R/$name.log"
  cp "$R/$name.log" "$R/$name-gpu.csv" "$OUT/"
  tail -n 30 "$R/$name.log"
  pack "$name" "$R/$name"
}

case "$step" in
  stage)
    mkdir -p /root/stage && cp ".gpu-stage/$2/"* /root/stage/ && ls -la /root/stage ;;
  sgl-stage)
    mkdir -p /root/stage-sgl && cp ".gpu-stage-sgl/$2/"* /root/stage-sgl/ && ls -la /root/stage-sgl ;;
  colocated)
    sweep small-p sweeps/h200-small-p.yaml "${2:-420}" ;;
  decodebench)
    sweep db-small-p sweeps/h200-decodebench-small-p.yaml "${2:-360}" ;;
  sglang)
    unpack
    bash scripts/gpu/sglang-h200.sh ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
