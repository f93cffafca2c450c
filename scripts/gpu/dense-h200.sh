#!/usr/bin/env bash
# A dense model measured on one H200 (issue 25): Llama-3.1-8B-Instruct's shapes with dummy weights,
# vLLM 0.22, the grid of sweeps/h200-dense-llama-3.1-8b.yaml (126 configurations x 3 repetitions),
# in one go. From the repository root on the GPU machine (nvidia-h200), after the three calls that
# carry the vLLM bundle (../shared/gpu/README.md, section 2):
#
#   bash scripts/gpu/dense-h200.sh [DEADLINE_S]     # default 540: stops cleanly before a 600 s call ends
#
# Run the same command again in the next call if it printed "incomplete": complete records are
# skipped and the vLLM it left running is adopted. Expected: ~10.5 min of sweep for the whole grid
# (three engine starts ~80-100 s each, 378 windows at ~0.6 s, baselines and warm-ups), i.e. two
# calls of 540 s; the first covers B = 8192 and 2048 (the short calibration grid and the held-out D
# and P), the second B = 4096 (the held-out chunk size). Leaves in $OUT: dense.tgz (records, raw
# timestamps, engine start-up and iteration lines), sweep.log, gpu.csv.
#
#   SIM=1 OUT=/tmp/out bash scripts/gpu/dense-h200.sh   # the same flow on the embedded engine (no GPU, ~1 min):
#                                                       # the projected profile h200-llama-3.1-8b-instruct
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-540}
OUT=${OUT:?set OUT to the folder whose files come back}
SWEEP=sweeps/h200-dense-llama-3.1-8b.yaml
MODEL=llama-3.1-8b-instruct
R=${R:-/root/r}
if [ -n "${SIM:-}" ] && [ -z "${R_SIM:-}" ]; then
  R=$(mktemp -d)
  trap 'rm -rf "$R"' EXIT
elif [ -n "${SIM:-}" ]; then
  R=$R_SIM
fi
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0

if [ -n "${SIM:-}" ]; then
  echo "SIM=1: the embedded engine with the projected profile h200-$MODEL (MODELLED), virtual clock"
  python3 -m pdexporter sim sweep "$SWEEP" --profile "h200-$MODEL" --out "$R/dense" > "$R/sweep.log" 2>&1
  rc=$?
  echo "SIM run, no GPU" > "$OUT/gpu.csv"
else
  # shellcheck source=/dev/null
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  export PYTHONPATH=/tmp/site  # (the first `python3` that imports pdexporter runs after this: pydantic is in the bundle)
  if [ ! -f "/tmp/model/$MODEL/config.json" ]; then
    python3 scripts/gpu/make_model.py "/tmp/model/$MODEL" --config "$MODEL" || exit 1
  fi
  # fail fast if vLLM's tokenizer loader does not take the word-level tokenizer
  python3 -c "
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained('/tmp/model/$MODEL')
assert t.decode([5]).strip() == 't5' and t('t7 t9')['input_ids'][-2:] == [7, 9], 'tokenizer'
print('tokenizer ok, vocab', len(t))" || exit 1
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.csv"
  timeout $((deadline + 45)) python3 -m pdexporter sweep "$SWEEP" --out "$R/dense" --deadline "${deadline}s" \
    --keep-engine > "$R/sweep.log" 2>&1
  rc=$?
fi
echo "sweep rc=$rc" >> "$R/sweep.log"

# engine logs cut to their start-up and the iteration lines (the full ones are 4-5 MB per chunk size)
# shellcheck source=/dev/null
source scripts/gpu/engine-logs.sh && trim_engine_logs 4000 "$R/dense"
tar czf "$OUT/dense.tgz" --exclude=engine.log -C "$R" dense
cp "$R/sweep.log" "$OUT/sweep.log"
total=$(python3 -c "from pdexporter.sweep.spec import load_sweep; print(len(list(load_sweep('$SWEEP').points())))")
done_n=$(find "$R/dense" -name 'D*_P*.json' -path '*/[0-9]*/*' -not -path '*/raw/*' | wc -l)
tail -n 12 "$R/sweep.log"
ls -la "$OUT"
if [ "$done_n" -ge "$total" ]; then
  echo "complete: $done_n of $total configurations (rc=$rc)"
else
  echo "incomplete: $done_n of $total configurations (rc=$rc): run the same command again in the next call"
fi
