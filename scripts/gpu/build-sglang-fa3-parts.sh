#!/usr/bin/env bash
# Issue 36: SGLang with FlashAttention 3, the attention kernel SGLang picks by default on Hopper.
# The SGLang bundle (.gpu-stage-sgl, docs/engines.md "The H200 run") carries sglang-kernel 0.4.4
# stripped of `sgl_kernel/flash_ops.abi3.so` (1.68 GB, 551 MB of the 615 MB wheel): FlashAttention 3.
# This builds that one file as parts a device call can carry (at most 45 MB each, beside the tree):
#
#   bash scripts/gpu/build-sglang-fa3-parts.sh [DEST=.gpu-stage-fa3]
#
# DEST/NN/flash_ops.part.NN, one folder a call (carry [".gpu-stage-fa3/NN"], copy to /root/stage-fa3),
# and DEST/00/flash_ops.sha256 (the whole file's checksum, checked on the GPU machine by
# scripts/gpu/sglang-h200.sh when PDX_SGL_ATTENTION=fa3). Compressed with xz, which gains little on
# CUDA fat binaries: measured 2026-12-04, see the last line this prints.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu-stage-fa3}
WHEEL_VERSION=0.4.4  # ../shared/gpu/sglang-requirements.txt: sglang-kernel==0.4.4 (CUDA 13 / torch 2.11)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps "sglang-kernel==$WHEEL_VERSION" -d "$work"
python3 - "$work" <<'PY'
import sys, zipfile, pathlib
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("sglang_kernel-*.whl"))
with zipfile.ZipFile(wheel) as z, open(work / "flash_ops.abi3.so", "wb") as out:
    out.write(z.read("sgl_kernel/flash_ops.abi3.so"))
PY
(cd "$work" && sha256sum flash_ops.abi3.so > flash_ops.sha256)
xz -T0 -6 -c "$work/flash_ops.abi3.so" | split -b 45M -d - "$work/flash_ops.part."
rm -rf "$DEST"
for part in "$work"/flash_ops.part.*; do
  n=${part##*.}
  mkdir -p "$DEST/$n" && mv "$part" "$DEST/$n/"
done
cp "$work/flash_ops.sha256" "$DEST/00/"
grep -qx '/.gpu-stage-fa3/' .git/info/exclude 2>/dev/null || echo '/.gpu-stage-fa3/' >> .git/info/exclude
echo "flash_ops.abi3.so: $(du -m "$work/flash_ops.abi3.so" | cut -f1) MiB, xz $(du -cm "$DEST"/*/flash_ops.part.* | tail -1 | cut -f1) MiB in $(ls -d "$DEST"/*/ | wc -l) parts ($DEST/NN)"
