#!/usr/bin/env bash
# Build, on this (CPU) machine, the SGLang wheels stage that scripts/gpu/sglang-h200.sh installs on
# the GPU machine beside the vLLM bundle (docs/engines.md, "The H200 run"): every wheel pinned in
# ../shared/gpu/sglang-requirements.txt (SGLang 0.5.15.post1 and what the bundle lacks), sglang-kernel
# repacked by ../shared/gpu/sglang-strip-kernel.py (615 MB -> ~17 MB: no FlashAttention 3, which
# scripts/gpu/build-sglang-fa3-parts.sh carries on its own), as one tar with the wheels' checksums,
# split into parts a device call can carry (at most 45 MB, one folder a call):
#
#   bash scripts/gpu/build-sglang-stage.sh [DEST=.gpu-stage-sgl]
#
# DEST/N/sgl-wheels.tar.part.NN (N = 1, 2, ...) and DEST/1/sgl-wheels.tar.sha256; on the GPU machine
#   run carry [".gpu-stage-sgl/N"]  command: mkdir -p /root/stage-sgl && cp .gpu-stage-sgl/N/* /root/stage-sgl/
# once per folder, then `bash scripts/gpu/sglang-h200.sh` checks the tar's checksum and each wheel's
# (SHA256SUMS) before it unzips them into /tmp/sgl. The wheels are for the H200 image's Python 3.12 on
# x86_64 (pip download --only-binary, no dependencies resolved: the pins are the whole list).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu-stage-sgl}
REQ=${SGL_REQUIREMENTS:-../shared/gpu/sglang-requirements.txt}
STRIP=${SGL_STRIP:-../shared/gpu/sglang-strip-kernel.py}
for f in "$REQ" "$STRIP"; do [ -f "$f" ] || { echo "build-sglang-stage: $f: no such file"; exit 2; }; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed 's/#.*//' "$REQ" | awk 'NF {print $1}' > "$work/pins.txt"
PLAT=""
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 \
         linux_x86_64 any; do
  PLAT="$PLAT --platform $p"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
  -d "$work/dl" -r "$work/pins.txt"
mkdir -p "$work/wheels"
for wheel in "$work"/dl/*.whl; do
  case "$(basename "$wheel")" in
    sglang_kernel-*) python3 "$STRIP" "$wheel" "$work/wheels/$(basename "$wheel")" > /dev/null ;;
    *) cp "$wheel" "$work/wheels/" ;;
  esac
done
want=$(wc -l < "$work/pins.txt")
got=$(find "$work/wheels" -name '*.whl' | wc -l)
[ "$want" = "$got" ] || { echo "build-sglang-stage: $got wheels for $want pins in $REQ"; exit 1; }
(cd "$work/wheels" && sha256sum -- *.whl > SHA256SUMS && tar cf "$work/sgl-wheels.tar" -- *.whl SHA256SUMS)
(cd "$work" && sha256sum sgl-wheels.tar > sgl-wheels.tar.sha256)
split -b 45M -d "$work/sgl-wheels.tar" "$work/sgl-wheels.tar.part."
rm -rf "$DEST"
n=0
for part in "$work"/sgl-wheels.tar.part.*; do
  n=$((n + 1))
  mkdir -p "$DEST/$n" && mv "$part" "$DEST/$n/"
done
cp "$work/sgl-wheels.tar.sha256" "$DEST/1/"
grep -qx '/.gpu-stage-sgl/' .git/info/exclude 2>/dev/null || echo '/.gpu-stage-sgl/' >> .git/info/exclude
echo "$got wheels, $(du -m "$work/sgl-wheels.tar" | cut -f1) MiB, in $n parts ($DEST/1..$n)"
