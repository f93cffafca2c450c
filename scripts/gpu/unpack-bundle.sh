#!/usr/bin/env bash
# Source on the GPU machine once every part of the vLLM bundle is in /root/stage
# (../shared/gpu/README.md): unpacks it to /tmp/site and /tmp/model, once per machine.
if [ ! -d /tmp/site/vllm ]; then
  cat /root/stage/part.* > /root/bundle.tar.xz || exit 1
  python3 -c "import tarfile; tarfile.open('/root/bundle.tar.xz').extractall('/tmp/unpack')" || exit 1
  mkdir -p /tmp/site /tmp/model && mv /tmp/unpack/site/* /tmp/site/ && mv /tmp/unpack/model/* /tmp/model/ && rm -rf /tmp/unpack
fi
