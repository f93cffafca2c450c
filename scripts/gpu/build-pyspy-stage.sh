#!/usr/bin/env bash
# Build, on this (CPU) machine, the py-spy binary scripts/gpu/gil-dumps.sh carries to the GPU machine (py-spy is not in
# the vLLM bundle, and the GPU machine reaches no package index): the py-spy wheel's static x86_64 binary, gzipped
# (8 MB unpacked would take the stage-3 call over the 64 MiB a call may carry; gil-dumps.sh unpacks it there).
#   usage (from the project root):  bash scripts/gpu/build-pyspy-stage.sh [DEST=.gpu-stage-pyspy]
set -euo pipefail
DEST=${1:-.gpu-stage-pyspy}
VERSION=0.4.3  # the version GPU session 39 ran
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
  -d "$WORK" "py-spy==$VERSION"
python3 - "$WORK" <<'PY'
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
(wheel,) = work.glob("py_spy-*.whl")
with zipfile.ZipFile(wheel) as z:
    (name,) = [n for n in z.namelist() if n.endswith("/scripts/py-spy")]
    (work / "py-spy").write_bytes(z.read(name))
PY
mkdir -p "$DEST"
gzip -9c "$WORK/py-spy" > "$DEST/py-spy.gz"
ls -la "$DEST"
