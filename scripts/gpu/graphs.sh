#!/usr/bin/env bash
# One device call: the launch-bound configurations on a vLLM capturing CUDA graphs up to 2560
# tokens (sweeps/h200-graphs.yaml), the host monitor beside it. Needs the bundle in /root/stage.
#   bash scripts/gpu/graphs.sh SECONDS
set -u
BUDGET=${1:-540}
if [ ! -d /tmp/site/vllm ]; then
  cat /root/stage/part.* > /root/bundle.tar.xz || exit 1
  python3 -c "import tarfile; tarfile.open('/root/bundle.tar.xz').extractall('/tmp/unpack')" || exit 1
  mkdir -p /tmp/site /tmp/model && mv /tmp/unpack/site/* /tmp/site/ && mv /tmp/unpack/model/* /tmp/model/ && rm -rf /tmp/unpack
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/root/graphs; mkdir -p "$W"
setsid python3 scripts/gpu/hostmon.py "$W/hostmon.jsonl" > /dev/null 2>&1 < /dev/null &
pack() {
  (cd /root && tar czf "$OUT/graphs.tar.gz" --exclude=engine.log graphs/out graphs/console.log)
  gzip -c "$W/hostmon.jsonl" > "$OUT/hostmon.jsonl.gz"
  [ -f "$W/out/8192/engine/engine.log" ] && gzip -c "$W/out/8192/engine/engine.log" > "$OUT/engine.log.gz"
  ls -la "$OUT"
}
trap pack EXIT
python3 -m pdexporter sweep sweeps/h200-graphs.yaml --out "$W/out" --deadline $(( BUDGET - 20 )) 2>&1 \
  | tee "$W/console.log" | grep -v "^\s*$" | tail -30
