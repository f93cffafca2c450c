#!/usr/bin/env bash
# Re-derive every committed results directory with the code as it is now: the records from their
# raw timestamps (`reanalyse`), then tables, fits, decision.json, criteria, plots and reports, the
# two-arm directories with their thresholds, SGLang against vLLM (`compare`), passive mode against
# injection, and the pair validation. Run it after any change to the window maths or the analysis,
# and commit what changed (tests compare the committed tables with a fresh re-analysis).
#   bash scripts/results.sh            # everything (21 minutes on this 2-core machine, session 26: the
#                                      # passive event models and their bootstraps take most of it)
#   bash scripts/results.sh --no-reanalyse   # derived files only (analysis changes)
set -euo pipefail
cd "$(dirname "$0")/.."
pd() { python3 -m pdexporter "$@"; }
R=results
SEED=$R/h200-vllm0.22-qwen3-coder-30b-a3b
DB=$R/h200-vllm0.22-qwen3-coder-30b-a3b-decodebench
# The small-P region (P 64..4096, issue 21) of each arm, measured in a later session: joined with
# the seed grid, the repetitions of the points both measured pooled (--pool).
COLOCATED=("$SEED" "$SEED-small-p")
OFFLOADED_DB=(--offloaded "$DB" --offloaded "$DB-small-p")
PAIR=$R/h200x2-vllm0.22-qwen3-coder-30b-a3b-pd
PASSIVE=$R/h200-vllm0.22-qwen3-coder-30b-a3b-passive

# Record directories (a chunk-size folder of D*_P*.json below them), the experiments included; the
# events of `run --passive` too, from their quiet-period baselines (`reanalyse` takes a passive run's
# joint/ and merged/ events with its published ones).
mapfile -t record_dirs < <(find "$R" -name 'D*_P*.json' -path '*/[0-9]*/*' | sed -E 's|/[0-9]+/[^/]+$||' | sort -u)
if [ "${1:-}" != "--no-reanalyse" ]; then
  for d in "${record_dirs[@]}"; do
    case "$d" in */joint|*/merged) continue ;; esac
    echo "== reanalyse $d"
    pd reanalyse "$d"
  done
fi
# Directories with a table of their own (not the experiments: their RUN notes quote records only).
for d in "${record_dirs[@]}"; do
  [ -f "$d/interference_table.csv" ] || continue
  echo "== export-table $d"
  pd export-table "$d" --out "$d" >/dev/null
  pd report "$d" --out "$d/report.html" >/dev/null
done
# Held-out campaigns (issue 30, docs/analysis.md): every campaign left out in turn and predicted by
# the models fitted on the others, the validation campaign by the models fitted on all of them; the
# campaign variation measured so is carried into the two-arm decision documents below.
HELD_OUT=$R/h200-held-out
echo "== validate (leave one campaign out)"
pd validate --out "$HELD_OUT" \
  --colocated "$SEED" --colocated $R/h200x2-vllm0.22-qwen3-coder-30b-a3b \
  --colocated $R/h200x2-vllm0.22-qwen3-coder-30b-a3b-cv-rerun --colocated $R/h200-vllm0.22-qwen3-coder-30b-a3b-generalise \
  --colocated "$SEED-small-p" --colocated "$PASSIVE/injected" --colocated "$SEED-validation" \
  --colocated "$SEED-validation-passive/injected" --colocated "$SEED-live-thresholds/injected" \
  --colocated "$SEED-starts" --colocated "$SEED-1gpu" --colocated "$SEED-1gpu-host" --colocated "$SEED-1gpu-warm" --colocated "$SEED-reference-s13" \
  --colocated "$SEED-1gpu-s14" --colocated "$SEED-reference-s14" \
  --colocated "$SEED-1gpu-s15" --colocated "$SEED-reference-s15" --colocated "$SEED-passive-s15/injected" \
  --colocated "$SEED-reference-s18" --colocated "$SEED-passive-s18/injected" \
  --offloaded "$DB" --offloaded "$DB-small-p" --offloaded "$DB-validation" >/dev/null
# The two arms: colocated (one H200) beside DecodeBench (one H200) and beside the 1P1D pair (two).
for arms in "h200-arms-decodebench" "h200x2-arms"; do
  out=$R/$arms
  if [ "$arms" = h200-arms-decodebench ]; then off=("${OFFLOADED_DB[@]}"); else off=(--offloaded "$PAIR"); fi
  echo "== two arms $out"
  pd export-table "${COLOCATED[@]}" --pool "${off[@]}" --campaign-variation "$HELD_OUT/held_out.json" --out "$out" \
    >/dev/null
  pd report "${COLOCATED[@]}" --pool "${off[@]}" --campaign-variation "$HELD_OUT/held_out.json" \
    --out "$out/report.html" >/dev/null
  pd thresholds --model "$out/decision.json" --out "$out" >/dev/null
done
# SGLang beside vLLM at the same points, and its two scheduling modes (docs/engines.md "The H200 run").
SGL=$R/h200-sglang0.5.15-qwen3-coder-30b-a3b
SGLM=$R/h200-sglang0.5.15-mixed-qwen3-coder-30b-a3b
echo "== compare engines"
pd compare "$SEED" "$SGL" --out "$SGL/vs-vllm0.22" >/dev/null
pd compare "$SEED" "$SGLM" --out "$SGLM/vs-vllm0.22" >/dev/null
pd compare "$SGL" "$SGLM" --out "$SGLM/vs-default" >/dev/null
# The same two modes with FlashAttention 3 (SGLang's default on Hopper; GPU session 13) beside triton attention.
SGLF=$R/h200-sglang0.5.15-fa3-qwen3-coder-30b-a3b
SGLFM=$R/h200-sglang0.5.15-fa3-mixed-qwen3-coder-30b-a3b
pd compare "$SGL" "$SGLF" --out "$SGLF/vs-triton" >/dev/null
pd compare "$SGLM" "$SGLFM" --out "$SGLFM/vs-triton" >/dev/null
pd compare "$SEED" "$SGLF" --out "$SGLF/vs-vllm0.22" >/dev/null
pd compare "$SEED" "$SGLFM" --out "$SGLFM/vs-vllm0.22" >/dev/null
# ... and the mixed FA3 table with the prompt length measured after it (P = 16384, GPU session 13 part 2)
pd export-table "$SGLFM" "$SGLFM-p16k" --out "$SGLFM-p16k/joined" >/dev/null
pd report "$SGLFM" "$SGLFM-p16k" --out "$SGLFM-p16k/joined/report.html" >/dev/null
# Passive mode on the H200 beside the injected table of the same engine: the event model (its table's
# intervals carrying the campaign variation), its convergence and trace- against cadence-based
# attribution (the injected table itself is above).
echo "== passive $PASSIVE"
pd export-table "$PASSIVE/passive" --mode passive --injected "$PASSIVE/injected" --campaign-variation "$HELD_OUT/held_out.json" \
  --out "$PASSIVE" >/dev/null
pd report "$PASSIVE/passive" --injected "$PASSIVE/injected" --campaign-variation "$HELD_OUT/held_out.json" \
  --out "$PASSIVE/report.html" >/dev/null
python3 scripts/gpu/passive_compare.py "$PASSIVE/passive" --injected "$PASSIVE/injected" --minutes 0.5 1 1.5 2 2.5 \
  --out "$PASSIVE" >/dev/null
# The passive run of GPU session 15 (2 req/s for 5 minutes): its event model beside its own injected sweep
# (as its GPU script wrote them), and the same events against the session's seed grid (RUN.md there).
PASSIVE15=$R/h200-vllm0.22-qwen3-coder-30b-a3b-passive-s15
echo "== passive $PASSIVE15"
pd export-table "$PASSIVE15/passive" --mode passive --injected "$PASSIVE15/injected" --out "$PASSIVE15/passive-table" \
  --campaign-variation "$HELD_OUT/held_out.json" --no-parquet >/dev/null
python3 scripts/gpu/passive_compare.py "$PASSIVE15/passive" --injected "$PASSIVE15/injected" --out "$PASSIVE15" >/dev/null
VS_GRID=$(mktemp -d)
python3 scripts/gpu/passive_compare.py "$PASSIVE15/passive" --injected "$SEED-1gpu-s15" --minutes 1 2 5 \
  --out "$VS_GRID" >/dev/null
cp "$VS_GRID/comparison.md" "$PASSIVE15/comparison-vs-grid.md"
rm -rf "$VS_GRID"
# The validation campaign's passive run (2026-12-03, 2 req/s for 3 minutes, read by no fit) against its own
# injected sweep, as its GPU script wrote them (its SUMMARY.md is the call's own, as of that day).
VPASSIVE=$SEED-validation-passive
echo "== passive $VPASSIVE"
pd export-table "$VPASSIVE/passive" --mode passive --injected "$VPASSIVE/injected" --out "$VPASSIVE/passive-table" \
  --campaign-variation "$HELD_OUT/held_out.json" --no-parquet >/dev/null
python3 scripts/gpu/passive_compare.py "$VPASSIVE/passive" --injected "$VPASSIVE/injected" --out "$VPASSIVE" >/dev/null
# The passive runs of GPU session 18: 2 req/s (seed 17, sharegpt-like, 5 min) and 1 req/s (seed 29,
# documents-heavy, 4 min) on one engine, both against the interleaved injected sweep measured between them.
PASSIVE18=$R/h200-vllm0.22-qwen3-coder-30b-a3b-passive-s18
for run in "$PASSIVE18" "$PASSIVE18-1rps"; do
  echo "== passive $run"
  pd export-table "$run/passive" --mode passive --injected "$PASSIVE18/injected" --out "$run/passive-table" \
    --campaign-variation "$HELD_OUT/held_out.json" --no-parquet >/dev/null
  python3 scripts/gpu/passive_compare.py "$run/passive" --injected "$PASSIVE18/injected" --out "$run" >/dev/null
done
# ... and each run (session 15's too) fitted at the slow launch level only (passive_model "Launch levels";
# small-prompts.md there: the one-minute injected sweeps read mostly that level)
for pair in "$PASSIVE18:$PASSIVE18" "$PASSIVE18-1rps:$PASSIVE18" "$PASSIVE15:$PASSIVE15"; do
  run=${pair%%:*}; inj=${pair##*:}
  LEVEL=$(mktemp -d)
  python3 scripts/gpu/passive_compare.py "$run/passive" --injected "$inj/injected" --launch-level slow --minutes 1 2 5 \
    --out "$LEVEL" >/dev/null
  cp "$LEVEL/comparison.md" "$run/comparison-launch-slow.md"
  rm -rf "$LEVEL"
done
# ... and the mixed fit scored level-matched beside its headline: each launch-bound injected cell at the level
# its own repetitions' chunk steps show (passive_model "Level-matched scoring"; not the headline figure)
for pair in "$PASSIVE18:$PASSIVE18" "$PASSIVE18-1rps:$PASSIVE18" "$PASSIVE15:$PASSIVE15"; do
  run=${pair%%:*}; inj=${pair##*:}
  LEVEL=$(mktemp -d)
  python3 scripts/gpu/passive_compare.py "$run/passive" --injected "$inj/injected" --launch-level matched \
    --minutes 1 2 5 --out "$LEVEL" >/dev/null
  cp "$LEVEL/comparison.md" "$run/comparison-level-matched.md"
  rm -rf "$LEVEL"
done
# The H100 of GPU session 25 (not an H200: none of `validate`'s campaigns). The passive-spread run: five 60 s
# passive segments at 2 req/s, each followed by one repetition of every injected cell on the same engine; the
# event model scored over the segments' own minutes (--spread), its intervals carrying the H200 campaigns'
# variation (the only one measured); and the MoE profile carried to the H100's datasheet against its injected table.
# GPU session 26 repeated it at 1 req/s (documents-heavy, seeds 51-55), blocks 2 and 4 beside busy loops
# (BURN_BLOCKS; spread.md's launch levels by part), and measured quiet against busy host block by block.
SPREAD100=$R/h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread
for run in "$SPREAD100" "$SPREAD100-1rps"; do
  echo "== passive $run"
  pd export-table "$run/passive" --mode passive --injected "$run/injected" --out "$run/passive-table" \
    --campaign-variation "$HELD_OUT/held_out.json" --no-parquet >/dev/null
  python3 scripts/gpu/passive_compare.py "$run/passive" --injected "$run/injected" --spread "$run/spread.tsv" \
    --out "$run" >/dev/null
  for pair in slow:comparison-launch-slow.md matched:comparison-level-matched.md; do
    LEVEL=$(mktemp -d)
    python3 scripts/gpu/passive_compare.py "$run/passive" --injected "$run/injected" --spread "$run/spread.tsv" \
      --launch-level "${pair%%:*}" --out "$LEVEL" >/dev/null
    cp "$LEVEL/comparison.md" "$run/${pair##*:}"
    rm -rf "$LEVEL"
  done
  python3 scripts/gpu/passive_spread.py "$run" --segments 5 > "$run/spread.md"
done
# ... the 1 req/s run against its quiet blocks only (1, 3 and 5; 2 and 4 ran beside busy loops): the like-for-like
# reference for events that ran on a quiet host (GPU session 27)
QUIET=$(mktemp -d)
python3 scripts/gpu/injected_blocks.py "$SPREAD100-1rps/injected" "$QUIET/injected" --blocks 1 3 5 >/dev/null
python3 scripts/gpu/passive_compare.py "$SPREAD100-1rps/passive" --injected "$QUIET/injected" \
  --spread "$SPREAD100-1rps/spread.tsv" --out "$QUIET" >/dev/null
cp "$QUIET/comparison.md" "$SPREAD100-1rps/comparison-quiet-blocks.md"
rm -rf "$QUIET"
python3 scripts/gpu/block_ab.py $R/h100-vllm0.22-host-burner --out $R/h100-vllm0.22-host-burner/summary.md >/dev/null
python3 scripts/gpu/dense_report.py compare --results "$SPREAD100/injected" --predictions "$SPREAD100/predictions-carry.json" \
  --out "$SPREAD100" --none-fitted >/dev/null
python3 scripts/projection_coverage.py "$SPREAD100/comparison-carry.csv" --regimes "$SEED/decision.json" \
  --out "$SPREAD100/projection_coverage.md" >/dev/null
# ... and the dense Llama-8B run on that H100 (126 configurations; B = 4096 D 6-12 in session 26): its own table, and the two projections
# committed before its records were read (the H200 calibration carried to the H100's datasheet; the learned rule)
DENSE100=$R/h100-vllm0.22-llama-3.1-8b-instruct
echo "== dense $DENSE100"
pd export-table "$DENSE100" --out "$DENSE100" >/dev/null
pd report "$DENSE100" --out "$DENSE100/report.html" >/dev/null
for rule in carry learned; do
  python3 scripts/gpu/dense_report.py compare --results "$DENSE100" --predictions "$DENSE100/predictions-$rule.json" \
    --none-fitted >/dev/null
done
# ... each projection's 90 % band with the H200 campaigns' variation carried (what a projected profile now borrows)
python3 scripts/projection_coverage.py "$DENSE100/comparison-carry.csv" "$DENSE100/comparison-learned.csv" \
  --regimes $R/h200-vllm0.22-llama-3.1-8b-instruct/decision.json --out "$DENSE100/projection_coverage.md" >/dev/null
# ... and the seed grid on one H100 (GPU session 27, issue 32 on the GPU it got): the MoE's H200 profile carried to the
# H100's datasheet against its 196 configurations (nothing fitted on it), and the bands with the H200 variation carried
GRID100=$R/h100-vllm0.22-qwen3-coder-30b-a3b-1gpu
python3 scripts/gpu/dense_report.py compare --results "$GRID100" --predictions "$GRID100/predictions-carry.json" \
  --out "$GRID100" --none-fitted >/dev/null
python3 scripts/projection_coverage.py "$GRID100/comparison-carry.csv" --regimes "$SEED/decision.json" \
  --out "$GRID100/projection_coverage.md" >/dev/null
# ... and its grid on CUDA graphs (GPU session 29): session 28's A/B cells predicted by another H100 campaign's fit with
# the same flags, default against graphs (nothing fitted on the A/B)
python3 scripts/graphs_held_out.py > $R/h100-vllm0.22-qwen3-coder-30b-a3b-1gpu-graphs/held_out_ab.md
# ... and GPU session 30's validation points on graphs at four chunk sizes (another H100 campaign, read by no fit):
# predicted by that grid's fit, as committed before the run and through the code as it is now
python3 scripts/graphs_validation.py > /dev/null
# ... and Qwen3-8B on an H100 (GPU session 31, a model no profile or fit had read): its tables on default flags and
# on graphs (B = 8192 the projected grid, 2048/4096 held out), the projection committed before the run scored on
# both grids, a profile calibrated on B = 8192 predicting 2048/4096, and the B = 8192 grid measured again at the end
Q8=$R/h100-vllm0.22-qwen3-8b
DENSE_REGIMES=$R/h200-vllm0.22-llama-3.1-8b-instruct/decision.json  # a dense model's regimes, for the bands' widths
Q8REFS=h200-qwen3-coder-30b-a3b,h200-llama-3.1-8b-instruct,h200-qwen2.5-32b-instruct,h200-qwen3-14b
# A dense run's analysis, one function a step (the loops below differ only in which runs, projections and grids)
tables() {  # DIR: its table, fits, criteria and decision, and its report
  echo "== dense $1"
  pd export-table "$1" --out "$1" >/dev/null
  pd report "$1" --out "$1/report.html" >/dev/null
}
scored() {  # DIR MODEL PREDICTIONS...: projections committed before the run, scored on its records (comparison*.md)
  local d=$1 m=$2 p
  shift 2
  for p in "$@"; do
    python3 scripts/gpu/dense_report.py --model "$m" compare --none-fitted --results "$d" --predictions "$p" --out "$d" \
      >/dev/null
  done
}
covered() {  # DIR SUFFIX...: the share of its measured aggregates inside the projections' 90 % bands, the H200
  local d=$1 s files=()  # campaigns' variation carried, over its comparison$SUFFIX.csv
  shift
  for s in "$@"; do files+=("$d/comparison$s.csv"); done
  python3 scripts/projection_coverage.py "${files[@]}" --regimes "$DENSE_REGIMES" --out "$d/projection_coverage.md" \
    >/dev/null
}
calibrated() {  # DIR PROFILE TRAIN-GRID NAME [STEM]: a profile calibrated on DIR's records, written as DIR/NAME with
  local stem=${5:-calibration}  # its report DIR/STEM.json (exit 5: the fit refused, its report kept)
  pd sim calibrate "$1" --profile "$2" --train-grid "$3" --out "$1/$4" --report "$1/$stem.json" --jobs 2 \
    > "$1/$stem.txt" 2>&1 || [ $? -eq 5 ]
}
for m in qwen3-8b qwen3-8b-graphs; do
  D=$R/h100-vllm0.22-$m
  tables "$D"
  scored "$D" $m "$D/predictions.json" "$D/predictions-heldout.json"
  covered "$D" "" -heldout
  python3 scripts/gpu/dense_report.py --model $m profile --rule learned --gpu H100 --from $Q8REFS \
    --out "$D/projected-h100-$m.yaml" >/dev/null
  # refused where the fit predicts the held-out chunk sizes worse than the projection (graphs)
  calibrated "$D" "$D/projected-h100-$m.yaml" sweeps/h200-dense-$m.yaml "calibrated-h100-$m.yaml"
  # post hoc (session 36): trained on B = 2048 and 8192, predicting B = 4096 (both refused)
  calibrated "$D" "$D/projected-h100-$m.yaml" "$D/train-2048-8192.yaml" "calibrated-2048-8192-h100-$m.yaml" \
    calibration-2048-8192
done
# ... and Qwen2.5-7B-Instruct on an H100 (GPU session 33, a sixth model no profile or fit had read), then Llama-3.2-3B-
# Instruct (the seventh, GPU session 34; its held-out grids on a second H100 machine, no repeat): their tables on both
# flag sets, the three projections committed before each run (A the learned rule, then a piecewise wait, then an H100
# host's eager launch) scored on both grids, a profile calibrated on B = 8192, and the repeat at the end where run;
# then Qwen3-4B (the eighth, GPU session 42; two projections committed before it, no piecewise wait)
for base in qwen2.5-7b-instruct llama-3.2-3b-instruct qwen3-4b; do
  Q=$R/h100-vllm0.22-$base
  if [ ! -d "$Q/8192" ]; then echo "== $Q: not measured yet (its PLAN.md)"; continue; fi
  for m in $base $base-graphs; do
    D=$R/h100-vllm0.22-$m
    tables "$D"
    sfx=() pred=()  # the projections committed for this model, in this order
    for s in "" -wait -h100host -heldout -heldout-wait -heldout-h100host; do
      if [ -f "$D/predictions$s.json" ]; then sfx+=("$s") pred+=("$D/predictions$s.json"); fi
    done
    scored "$D" $m "${pred[@]}"
    covered "$D" "${sfx[@]}"
    # refused where the fit predicts the held-out chunk sizes worse than the projection (Qwen2.5-7B default,
    # Llama-3.2-3B default, Qwen3-4B default); the 3B's and the 4B's graphs fits read a piecewise launch floor
    calibrated "$D" "$D/projected-h100-$base.yaml" "sweeps/h200-dense-${m/-instruct/}.yaml" "calibrated-h100-$m.yaml"
    if [ -f "$Q/train-2048-8192.yaml" ]; then
      # post hoc: trained on two chunk sizes (B = 2048 and 8192), predicting B = 4096 (Qwen2.5-7B default: refused)
      calibrated "$D" "$D/projected-h100-$base.yaml" "$Q/train-2048-8192.yaml" "calibrated-2048-8192-h100-$m.yaml" \
        calibration-2048-8192
    fi
  done
  if [ -d "$Q-end/8192" ]; then
    pd export-table "$Q-end" --out "$Q-end" >/dev/null
    python3 scripts/repeat_drift.py "$Q" "$Q-end" --out "$Q-end/drift.md"
  fi
done
# ... and GPU session 35's two small-prompt sweeps of the seventh model on a third H100 host (B = 8192, D 1/4/12 x
# P 64-1024; the second with --no-async-scheduling, a diagnostic): scored against the projections committed before
# session 34, set against session 34's first machine, and synchronous against asynchronous scheduling
S=$R/h100-vllm0.22-llama-3.2-3b-instruct
L3=llama-3.2-3b-instruct
for v in smallp smallp-sync; do
  tables "$S-$v"
  scored "$S-$v" $L3 "$S"/predictions{,-wait,-h100host}.json
  covered "$S-$v" "" -wait -h100host
done
python3 scripts/repeat_drift.py "$S" "$S-smallp" --out "$S-smallp/drift-from-s34.md"
python3 scripts/repeat_drift.py "$S-smallp" "$S-smallp-sync" --out "$S-smallp-sync/sync-vs-async.md"
# ... and GPU session 36's one H100 machine (the seventh model's one-machine set, PLAN.md): both flag sets' grids with
# their held-out chunk sizes, the projections committed before session 34 scored on them, a calibration on B = 8192
# scored on the same machine's B = 2048/4096, each grid measured again (default B = 8192 three engines, the held-out
# chunk sizes two, graphs B = 8192 two), and the small-prompt sweeps against session 35's host
for v in s36 s36-end s36-end2 graphs-s36 graphs-s36-end smallp-s36 smallp-sync-s36; do
  tables "$S-$v"
done
for g in "" -graphs; do
  scored "$S$g-s36" $L3$g "$S$g"/predictions{,-heldout}{,-wait,-h100host}.json
  covered "$S$g-s36" "" -wait -h100host -heldout -heldout-wait -heldout-h100host
done
# refused where the fit predicts the held-out chunk sizes worse than the projection (s36, graphs-s36)
for v in s36:"" s36-end:"" graphs-s36:-graphs; do
  D=$S-${v%%:*} g=${v#*:}
  calibrated "$D" "$S$g/projected-h100-$L3.yaml" "sweeps/h200-dense-llama-3.2-3b$g.yaml" "calibrated-h100-$L3$g.yaml"
  # post hoc: trained on B = 2048 and 8192, predicting B = 4096 (graphs: refused)
  calibrated "$D" "$S$g/projected-h100-$L3.yaml" "$D/train-2048-8192.yaml" "calibrated-2048-8192-h100-$L3$g.yaml" \
    calibration-2048-8192
done
python3 scripts/repeat_drift.py "$S-s36" "$S-s36-end" --out "$S-s36-end/drift.md"
python3 scripts/repeat_drift.py "$S-s36-end" "$S-s36-end2" --out "$S-s36-end2/drift.md"
python3 scripts/repeat_drift.py "$S-graphs-s36" "$S-graphs-s36-end" --out "$S-graphs-s36-end/drift.md"
python3 scripts/repeat_drift.py "$S-smallp" "$S-smallp-s36" --out "$S-smallp-s36/drift-from-s35.md"
python3 scripts/repeat_drift.py "$S-smallp-s36" "$S-smallp-sync-s36" --out "$S-smallp-sync-s36/sync-vs-async.md"
# ... and GPU session 37's three engines of one H100 (the levels sweep on two default-flag engines, then on graphs):
# where the one-chunk step's level lives (levels.md), the projections committed before session 34 on their medians,
# and the two default-flag engines against each other
for v in levels:"" levels-second:"" levels-graphs:-graphs; do
  D=$S-${v%%:*} g=${v#*:}
  tables "$D"
  scored "$D" $L3$g "$S$g"/predictions{,-h100host}.json
  covered "$D" "" -h100host
  python3 scripts/eager_levels.py "$D" --out "$D/levels.md" >/dev/null
done
python3 scripts/repeat_drift.py "$S-levels" "$S-levels-second" --out "$S-levels-second/drift.md"
# the one-chunk eager cells of every repeat: how far the median and the mean of the repetitions moved
python3 scripts/mean_vs_median.py "$S-levels" "$S-levels-second" "$S-s36" "$S-s36-end" "$S-s36-end" "$S-s36-end2" \
  "$S-graphs-s36" "$S-graphs-s36-end" "$Q8" "$Q8-end" "$R/h100-vllm0.22-qwen2.5-7b-instruct" \
  "$R/h100-vllm0.22-qwen2.5-7b-instruct-end" "$S-smallp" "$S-smallp-s36" --out "$S-levels-second/mean-vs-median.md" \
  >/dev/null
# ... and GPU session 39's H100 (the anatomy: two engines with vLLM's torch profiler opened three times each, then a
# third engine with py-spy's dumps of its engine core): the levels outside the profiler's windows, and who ran in the
# engine core process while the eager steps were slow (anatomy.md per profiled engine is step_anatomy.py's, made on
# the GPU machine from traces too big to bring back)
A=$S-anatomy
for e in first second; do
  python3 scripts/eager_levels.py "$A/$e" --control 4096 --windows "$A/$e/windows.jsonl" --out "$A/$e/levels.md" >/dev/null
  python3 scripts/gpu/gil_dumps.py "$A/$e" --out "$A/$e/thread.md" >/dev/null
done
python3 scripts/eager_levels.py "$A/gil" --control 4096 --out "$A/gil/levels.md" >/dev/null
python3 scripts/gpu/gil_dumps.py "$A/gil" --out "$A/gil/gil.md" >/dev/null
# ... and GPU session 40's H100 (the counters plan: a guest without a PMU, so task-clock only; one engine's levels)
C=$S-counters/c1
python3 scripts/eager_levels.py "$C" --control 4096 --out "$C/levels.md" >/dev/null
python3 scripts/gpu/gil_dumps.py "$C" --out "$C/counters.md" >/dev/null
# ... and the H200 dense runs' projections, committed before their runs, scored against their records as they are now
# (session 32: the Llama's had been scored on its records before later re-derivations)
python3 scripts/gpu/dense_report.py compare >/dev/null
python3 scripts/gpu/dense_report.py compare --predictions $R/h200-vllm0.22-llama-3.1-8b-instruct/predictions-learned.json \
  >/dev/null
python3 scripts/gpu/dense_report.py --model qwen2.5-32b-instruct compare >/dev/null
python3 scripts/gpu/dense_report.py --model qwen3-14b compare >/dev/null
pd export-table "$Q8-end" --out "$Q8-end" >/dev/null
python3 scripts/repeat_drift.py "$Q8" "$Q8-end" --out "$Q8-end/drift.md"
echo "== validate-pd"
pd validate-pd "$SEED" --decode-bench "$DB" --pair "$PAIR" --out "$PAIR" >/dev/null
# ... and the index of the directories (results/INDEX.md), made from what each holds
python3 scripts/results_index.py --out "$R/INDEX.md"
git status --short "$R" | wc -l | xargs echo "files changed under $R:"
