#!/usr/bin/env bash
# Issue 32: how long vLLM takes to start on one H200 for each chunk size of the seed grid, with
# torch.compile's / Triton's / Inductor's caches empty (cold) and filled (warm), and the caches
# themselves packed so that a later GPU session can start warm (scripts/gpu/engine-cache.sh load).
# From the repository root on the GPU machine, after the three calls that carry the vLLM bundle:
#
#   bash scripts/gpu/engine-starts-h200.sh cold [DEADLINE_S]   # sweeps/h200-starts.yaml: 4 starts
#   bash scripts/gpu/engine-starts-h200.sh warm [DEADLINE_S]   # B = 16384 once more, then pack
#
# `cold` may need a second call (it says "incomplete"); complete records are skipped and the
# engine it left running is adopted. Leaves in $OUT: starts.tgz (records, raw, trimmed engine
# logs, sweep.json with phase times), caches.txt (what each cache holds) and, after `warm`,
# engine-cache.tar.xz.NN (parts of at most 15 MiB).
set -u
cd "$(dirname "$0")/../.."
stage=${1:?cold or warm}
deadline=${2:-540}
OUT=${OUT:?set OUT to the folder whose files come back}
SWEEP=sweeps/h200-starts.yaml
R=${R:-/root/r}
mkdir -p "$R" "$OUT"
# shellcheck source=/dev/null
source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=/tmp/site
# caches of their own (the engine inherits the sweep's environment; its command stays the grid's):
# empty at the first start whatever ran on this machine before, and packed alone afterwards
C=/root/ecache
export VLLM_CACHE_ROOT=$C/vllm TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
caches() {
  for d in $C/vllm $C/triton $C/inductor; do
    [ -d "$d" ] && echo "$(du -sm "$d" | cut -f1) MiB $(find "$d" -type f | wc -l) files $d" || echo "absent $d"
  done
}
echo "== caches before $stage ($(date -u +%T))"; caches | tee -a "$OUT/caches.txt"
# an engine another script left running (dense-h200.sh keeps its last one) holds the GPU and the
# port; a cold run cut short by its deadline left its own, which the next cold call adopts
[ "$stage" = cold ] && [ -d "$R/starts" ] || pkill -f '[v]llm.entrypoints.cli.main'; for _ in $(seq 60); do pgrep -f '[v]llm.entrypoints.cli.main' >/dev/null || break; sleep 1; done
case $stage in
  cold)
    timeout $((deadline + 45)) python3 -m pdexporter sweep "$SWEEP" --out "$R/starts" --deadline "${deadline}s" \
      > "$R/starts-cold.log" 2>&1
    rc=$?;;
  warm)
    timeout $((deadline + 45)) python3 -m pdexporter sweep "$SWEEP" --out "$R/starts-warm" --chunk-index 3 \
      --deadline "${deadline}s" > "$R/starts-warm.log" 2>&1
    rc=$?;;
  *) echo "stage: cold or warm"; exit 2;;
esac
echo "sweep rc=$rc" | tee -a "$R/starts-$stage.log"
echo "== caches after $stage ($(date -u +%T))"; caches | tee -a "$OUT/caches.txt"
# shellcheck source=/dev/null
source scripts/gpu/engine-logs.sh && trim_engine_logs 2000 "$R/starts" "$R/starts-warm"
tar czf "$OUT/starts.tgz" --exclude=engine.log -C "$R" $(cd "$R" && ls -d starts starts-warm starts-cold.log starts-warm.log 2>/dev/null)
if [ "$stage" = warm ]; then
  # the caches a later session carries back in (tar paths relative to /)
  tar cf - -C / ${C#/} \
    | xz -T0 -6 | split -b 15M -d - "$OUT/engine-cache.tar.xz."
  ls -la "$OUT"/engine-cache.tar.xz.* | tee -a "$OUT/caches.txt"
fi
grep -E "engine_start|complete|incomplete|configurations" "$R"/starts*.log | tail -n 12
python3 - "$R" <<'PY'
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("starts*/sweep.json")):
    for inv in json.loads(p.read_text())["invocations"]:
        starts = {c: v["wall_s"]["engine_start"] for c, v in inv.get("chunks", {}).items()}
        print(p.parent.name, inv["status"], f"{inv['complete_configs']}/{inv['total_configs']}",
              f"wall {inv['wall_s']} s", "engine_start s:", starts)
PY
