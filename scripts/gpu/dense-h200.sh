#!/usr/bin/env bash
# A dense model measured on one H200 (issue 25), vLLM 0.22, dummy weights, one sweep file in one go.
# MODEL (a shipped config, pdexporter/sim/configs/$MODEL.json, also the model folder's and the served
# name) and SWEEP come from the environment; the defaults are the first dense run's: Llama-3.1-8B-Instruct's
# shapes, the grid of sweeps/h200-dense-llama-3.1-8b.yaml (126 configurations x 3 repetitions). From the
# repository root on the GPU machine (nvidia-h200), after the three calls that carry the vLLM bundle
# (../shared/gpu/README.md, section 2):
#
#   bash scripts/gpu/dense-h200.sh [DEADLINE_S]     # default 540: stops cleanly before a 600 s call ends
#   MODEL=qwen2.5-32b-instruct SWEEP=sweeps/h200-dense-qwen2.5-32b.yaml bash scripts/gpu/dense-h200.sh 480
#                                                   # the third model (issue 36: results/h200-vllm0.22-qwen2.5-32b-instruct/PLAN.md)
#
# Run the same command again in the next call if it printed "incomplete": complete records are
# skipped and the vLLM it left running is adopted. Expected for the Llama grid: ~10.5 min of sweep
# (three engine starts ~80-100 s each, 378 windows at ~0.6 s, baselines and warm-ups), i.e. two
# calls of 540 s; the first covers B = 8192 and 2048 (the short calibration grid and the held-out D
# and P), the second B = 4096 (the held-out chunk size). Leaves in $OUT: dense.tgz (records, raw
# timestamps, engine start-up and iteration lines), sweep.log, gpu.csv.
#
#   SIM=1 OUT=/tmp/out bash scripts/gpu/dense-h200.sh   # the same flow on the embedded engine (no GPU, ~1 min):
#                                                       # the profile h200-$MODEL, shipped or else projected
#                                                       # here from $MODEL's config.json (the learned rule from
#                                                       # the calibrated references, as dense_report.py predict)
set -u
cd "$(dirname "$0")/../.."
deadline=${1:-540}
OUT=${OUT:?set OUT to the folder whose files come back}
SWEEP=${SWEEP:-sweeps/h200-dense-llama-3.1-8b.yaml}
MODEL=${MODEL:-llama-3.1-8b-instruct}
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
  profile=h200-$MODEL
  if [ ! -f "pdexporter/sim/profiles/$profile.yaml" ]; then  # no shipped profile: project one from config.json
    python3 -m pdexporter sim profile-from-config "$MODEL" --gpu H200 --name "$profile" \
      --served-model-name "$MODEL" --out "$R/$profile.yaml" > /dev/null || exit 1
    profile=$R/$profile.yaml
  fi
  echo "SIM=1: the embedded engine with the profile $profile (MODELLED), virtual clock"
  python3 -m pdexporter sim sweep "$SWEEP" --profile "$profile" --out "$R/dense" > "$R/sweep.log" 2>&1
  rc=$?
  echo "SIM run, no GPU" > "$OUT/gpu.csv"
else
  # shellcheck source=/dev/null
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  export PYTHONPATH=/tmp/site  # (the first `python3` that imports pdexporter runs after this: pydantic is in the bundle)
  if [ ! -f "/tmp/model/$MODEL/config.json" ] || [ ! -f "/tmp/model/$MODEL/tokenizer/tokenizer.json" ]; then
    python3 scripts/gpu/make_model.py "/tmp/model/$MODEL" --config "$MODEL" || exit 1
  fi
  # fail fast if vLLM's tokenizer loader does not take the word-level tokenizer: the folder the
  # sweep's command serves it from (--tokenizer, else the model folder; scripts/gpu/make_model.py)
  tok=$(grep -o -- '--tokenizer [^ ]*' "$SWEEP" | head -n 1 | cut -d' ' -f2)
  python3 -c "
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained('${tok:-/tmp/model/$MODEL}')
assert t.decode([5]).strip() == 't5' and t('t7 t9')['input_ids'][-2:] == [7, 9], 'tokenizer'
print('tokenizer ok, vocab', len(t))" || exit 1
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.csv"
  # on another GPU (GPU=H100, MAX_MODEL_LEN), a copy of the sweep that says so (records' `gpu`; before session 30
  # the H100 dense run's records said H200 until session 31 rewrote them from its gpu.csv)
  # shellcheck source=/dev/null
  source scripts/gpu/grid-for-gpu.sh && SWEEP=$(grid_for_gpu "$SWEEP" "$R")
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
