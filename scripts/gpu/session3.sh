#!/usr/bin/env bash
# GPU session 3 on the two-H200 machine (nvidia-h200-x2), one step per device call (RUN.md files
# under results/ say what each produced). From the repository root on the GPU machine:
#
#   bash scripts/gpu/session3.sh stage N      copy .gpu-stage/N/* to /root/stage (carry .gpu-stage/N)
#   bash scripts/gpu/session3.sh check        unpack the vLLM bundle, check the imports and the GPUs
#   bash scripts/gpu/session3.sh arms         GPU 0: the offloaded arm on one GPU (DecodeBenchConnector, the
#                                             seed's B = 8192 grid); GPU 1: the generalisation grid
#   bash scripts/gpu/session3.sh pair         both GPUs: the 1P1D NIXL pair (prefill GPU 0, decode GPU 1)
#   bash scripts/gpu/session3.sh rerun        both GPUs: the 33 points that failed CV, interleaved
#   bash scripts/gpu/session3.sh grid [S]     both GPUs: the seed grid (sweeps/h200x2.yaml), deadline S seconds
#
# Each measuring step leaves its results as $OUT/<step>.tgz (records + raw, engine logs cut to
# their start-up and the iteration lines around the windows) and its console as $OUT/<step>.log.
set -u
cd "$(dirname "$0")/../.."
step=${1:?step}
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
R=/root/r
mkdir -p "$R"

unpack() {
  source scripts/gpu/unpack-bundle.sh || { echo "bundle incomplete: copy every part first"; exit 1; }
  export PYTHONPATH=/tmp/site
}

pack() {  # pack NAME DIR...: results without the full engine logs (4-5 MB each), then a trimmed copy
  local name=$1; shift
  local keep=()
  for log in $(find "$@" -name engine.log 2>/dev/null); do
    { head -c 300000 "$log"; echo; echo "# ... (cut) ... last iteration lines:"; grep -a "Iteration(" "$log" | tail -n 4000; } \
      > "${log%.log}.trimmed.log"
  done
  tar czf "$OUT/$name.tgz" --exclude=engine.log "$@" 2>/dev/null
  ls -la "$OUT"
}

case "$step" in
  stage)
    mkdir -p /root/stage && cp ".gpu-stage/$2/"* /root/stage/ && ls -la /root/stage ;;
  check)
    unpack
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpus.csv"
    python3 -c "import vllm, nixl, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'nixl ok')"
    python3 -m pdexporter --version
    python3 -m pdexporter sim sweep sweeps/quick.yaml >/dev/null && echo "pdexporter sim sweep ok"
    nproc; free -g | head -2 ;;
  arms)
    unpack
    ( CUDA_VISIBLE_DEVICES=0 timeout 560 python3 -m pdexporter sweep sweeps/h200-decodebench.yaml \
        --out $R/decodebench --deadline 520s > $R/decodebench.log 2>&1; echo "decodebench rc=$?" >> $R/decodebench.log ) &
    ( CUDA_VISIBLE_DEVICES=1 timeout 560 python3 -m pdexporter sweep sweeps/h200-generalise.yaml \
        --out $R/generalise --deadline 520s > $R/generalise.log 2>&1; echo "generalise rc=$?" >> $R/generalise.log ) &
    wait
    cp $R/decodebench.log $R/generalise.log "$OUT/"
    tail -n 25 $R/decodebench.log $R/generalise.log
    pack arms $R/decodebench $R/generalise ;;
  pair)
    unpack
    timeout 570 python3 -m pdexporter sweep sweeps/h200x2-pd.yaml --out $R/pd --deadline 530s > $R/pair.log 2>&1
    echo "pair rc=$?" >> $R/pair.log
    cp $R/pair.log "$OUT/"; tail -n 40 $R/pair.log
    pack pair $R/pd ;;
  rerun)
    unpack
    timeout 575 python3 -m pdexporter sweep sweeps/h200x2-cv-rerun.yaml --out $R/rerun --deadline 540s > $R/rerun.log 2>&1
    echo "rerun rc=$?" >> $R/rerun.log
    cp $R/rerun.log "$OUT/"; tail -n 40 $R/rerun.log
    pack rerun $R/rerun ;;
  grid)
    unpack
    timeout 575 python3 -m pdexporter sweep sweeps/h200x2.yaml --out $R/grid --deadline ${2:-530} > $R/grid.log 2>&1
    echo "grid rc=$?" >> $R/grid.log
    cp $R/grid.log "$OUT/"; tail -n 30 $R/grid.log
    pack grid $R/grid ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
