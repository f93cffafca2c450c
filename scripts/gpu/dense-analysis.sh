#!/usr/bin/env bash
# After the dense run (results/h200-vllm0.22-llama-3.1-8b-instruct/PLAN.md, "After the run"), with its records
# unpacked into the results directory: the projections' errors, the calibration, leave one model out.
#   bash scripts/gpu/dense-analysis.sh          (PY=python interpreter; ~3 min on 2 cores)
set -u
cd "$(dirname "$0")/../.."
R=results/h200-vllm0.22-llama-3.1-8b-instruct
PY=${PY:-python3}
"$PY" scripts/gpu/dense_report.py compare                                              # the rule before issue 36
"$PY" scripts/gpu/dense_report.py compare --predictions "$R/predictions-learned.json"  # the learned one, MoE only
"$PY" -m pdexporter sim calibrate "$R" --profile h200-llama-3.1-8b-instruct --train-grid sweeps/calibrate-short.yaml \
    --out pdexporter/sim/profiles/h200-llama-3.1-8b-instruct.yaml --report "$R/calibration.json" --jobs 2
echo "calibrate: exit $?"
"$PY" tests/benchmarks/bench_projection.py --jobs 2 --markdown results/h200-vllm0.22-qwen3-14b/projection-lomo.md   # every measured model from the others (four since session 18; the 32B directory keeps the three-model table)
