#!/usr/bin/env bash
# Build, on this (CPU) machine, the OpenTelemetry wheels vLLM 0.22's tracing imports and the H200
# image lacks (the vLLM bundle carries opentelemetry-api 1.45.2 only), as one folder to carry:
#   DEST/otel-site.tar.gz   (~7 MB: extracted into /tmp/site by scripts/gpu/passive-h200.sh)
# vllm/tracing/otel.py (0.22) imports, in one try block, the SDK and BOTH OTLP trace exporters:
#   opentelemetry.exporter.otlp.proto.grpc.trace_exporter  (grpcio, googleapis-common-protos)
#   opentelemetry.exporter.otlp.proto.http.trace_exporter  (requests: in the image)
# and the 1.45 exporters moved code into two new packages, opentelemetry-exporter-otlp-common and
# opentelemetry-exporter-http-transport: without them vLLM started healthy, then failed every
# request with HTTP 500 (docs/vllm-facts.md). Versions match the bundle's opentelemetry-api;
# googleapis-common-protos 1.70.0 (generated for protobuf 4.25) runs on the image's protobuf,
# where 1.76 wants protobuf >= 6.33.5. tenacity: pdexporter's own dependency the image lacks.
#   usage (from the project root):  bash scripts/gpu/build-otel-stage.sh [DEST=.gpu-stage-otel]
set -euo pipefail
DEST=${1:-.gpu-stage-otel}
WORK=$(mktemp -d)
PLAT=""
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 any; do PLAT="$PLAT --platform $p"; done
PIPX="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT"
WHEELS="opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-common==0.66b2 \
  opentelemetry-exporter-http-transport==0.66b2 opentelemetry-proto==1.45.2 \
  googleapis-common-protos==1.70.0 grpcio==1.74.0 tenacity==9.2.1"
# shellcheck disable=SC2086
python3 -m pip download -q $PIPX -d "$WORK/whl" $WHEELS
# shellcheck disable=SC2086
python3 -m pip install -q --no-compile --target "$WORK/site" $PIPX "$WORK"/whl/*.whl
mkdir -p "$DEST"
tar -C "$WORK/site" -czf "$DEST/otel-site.tar.gz" .
ls "$WORK/whl" > "$DEST/WHEELS.txt"
rm -rf "$WORK"
top=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
if [ -n "$top" ]; then
  mkdir -p "$top/info"
  grep -qx "/$(basename "$DEST")/" "$top/info/exclude" 2>/dev/null || echo "/$(basename "$DEST")/" >> "$top/info/exclude"
fi
ls -l "$DEST"
echo "done: carry $DEST with the call that runs scripts/gpu/passive-h200.sh (or any earlier one on the same machine)"
