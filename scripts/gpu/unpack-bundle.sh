#!/usr/bin/env bash
# Source on the GPU machine once every part of the vLLM bundle is in /root/stage
# (../shared/gpu/README.md): unpacks it to /tmp/site and /tmp/model, once per machine.
# Hidden folders go too (nixl-cu13 keeps libnixl.so in site/.nixl_cu13.mesonpy.libs), and the
# nixl_ep packages nixl-cu13 1.5.1 brings are removed: vLLM 0.22 imports nixl_ep when it is
# installed and fails without its torch-2.11 extension (MoE expert-parallel all2all; the
# NixlConnector does not need it).
if [ ! -d /tmp/site/vllm ]; then
  cat /root/stage/part.* > /root/bundle.tar.xz || exit 1
  python3 -c "import tarfile; tarfile.open('/root/bundle.tar.xz').extractall('/tmp/unpack')" || exit 1
  mkdir -p /tmp/site /tmp/model && cp -a /tmp/unpack/site/. /tmp/site/ && cp -a /tmp/unpack/model/. /tmp/model/ \
    && rm -rf /tmp/unpack
elif [ -d /tmp/site/nixl_cu13 ] && [ ! -d /tmp/site/.nixl_cu13.mesonpy.libs ]; then
  python3 - <<'PY' || exit 1
import tarfile
with tarfile.open('/root/bundle.tar.xz') as t:
    members = [m for m in t.getmembers() if m.name.startswith('site/.nixl_cu13.mesonpy.libs')]
    t.extractall('/tmp/unpack-hidden', members=members)
PY
  cp -a /tmp/unpack-hidden/site/. /tmp/site/ && rm -rf /tmp/unpack-hidden
fi
rm -rf /tmp/site/nixl_ep /tmp/site/nixl_ep_cu13 /tmp/site/nixl_ep_cu12 /tmp/site/nixl_ep-*.dist-info
# The project's own run-time wheels the bundle lacks (tenacity, the OpenTelemetry SDK and exporters),
# carried as .gpu-stage-otel/otel-site.tar.gz (scripts/gpu/build-otel-stage.sh): every command of the
# project imports tenacity (its HTTP client), so without them nothing runs (GPU session 8 lost two calls).
if [ -f .gpu-stage-otel/otel-site.tar.gz ] && [ ! -f /tmp/site/.otel-stage ]; then
  tar -C /tmp/site -xzf .gpu-stage-otel/otel-site.tar.gz && touch /tmp/site/.otel-stage
fi
PYTHONPATH=/tmp/site python3 -c "import tenacity, pydantic" 2>/dev/null \
  || { echo "tenacity missing in /tmp/site: carry .gpu-stage-otel (scripts/gpu/build-otel-stage.sh) in this call"; return 1 2>/dev/null || exit 1; }
# The bundle is installed with `pip install --no-compile` (../shared/gpu/build-vllm-bundle.sh): without
# this every engine process would compile vLLM's ~3,900 modules it imports again (or once, where the
# machine lets Python write bytecode), inside the first engine start a sweep times. A user's pip
# install compiles them when it installs, so once per machine here, on every core (~9 s of CPU).
if [ ! -f /tmp/site/.byte-compiled ]; then
  t0=$(date +%s.%N)
  python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
  touch /tmp/site/.byte-compiled
  echo "byte-compiled /tmp/site in $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s" \
    "(PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset})"
fi
