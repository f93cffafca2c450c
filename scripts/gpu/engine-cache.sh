#!/usr/bin/env bash
# Source on the GPU machine to start vLLM with the torch.compile / Triton / Inductor caches an
# earlier session wrote (issue 32; packed by scripts/gpu/engine-starts-h200.sh into
# engine-cache.tar.xz.NN). The pack of GPU session 11 (all four chunk sizes of the seed grid,
# Qwen3-Coder-30B-A3B on vLLM 0.22 / torch 2.11, the grid's flags; since GPU session 27 also the four
# compiled by its H100 seed grid with --max-model-len 65536, a config hash of their own: 7.7 MB) is committed in
# scripts/gpu/engine-cache/, so every later session starts warm without carrying anything (a
# machine of its own keeps vLLM's caches across restarts; ours are new each session). A newer pack
# carried as `.gpu-stage-cache` (ignored by git) takes its place:
#
#   run carry [".gpu-stage-cache"] command: source scripts/gpu/engine-cache.sh && python3 -m pdexporter sweep ...
#
# The engine inherits the variables from the sweep; its command (and so the cache keys: vLLM's
# hash of its config, e.g. torch_compile_cache/5b2793e53d for B = 8192) stays the grid's. A chunk
# size the pack lacks compiles as usual and adds itself to the same folders.
C=/root/ecache
pack=scripts/gpu/engine-cache
ls .gpu-stage-cache/engine-cache.tar.xz.* >/dev/null 2>&1 && pack=.gpu-stage-cache
if [ ! -d "$C/vllm" ] && ls "$pack"/engine-cache.tar.xz.* >/dev/null 2>&1; then
  cat "$pack"/engine-cache.tar.xz.* | xz -d | tar x -C / || return 1 2>/dev/null || exit 1
fi
mkdir -p "$C"
export VLLM_CACHE_ROOT=$C/vllm TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
echo "engine caches: $(du -sm "$C" 2>/dev/null | cut -f1) MiB in $C"
