#!/usr/bin/env bash
# SGLang 0.5.15.post1 on one H200, both scheduling modes, in one device call (docs/engines.md,
# "The H200 run"): install the SGLang wheels beside the vLLM bundle, run sweeps/h200-sglang.yaml
# (default: the decodes pause for each chunk) and then sweeps/h200-sglang-mixed.yaml
# (--enable-mixed-chunk), each with a --deadline so a slow machine still returns partial, resumable
# records; re-analyse every record without SGLang's step log (the penalty a user gets beside an
# SGLang someone else runs); pack records, raw windows, trimmed engine logs and the comparison into
# $OUT/sglang.tar.gz.
#
#   bash scripts/gpu/sglang-h200.sh [BUDGET_S=540]
#
# Needs on the GPU machine: every part of the vLLM bundle in /root/stage (../shared/gpu/README.md:
# site-packages and the model folder /tmp/model/qwen3-coder-30b-a3b) and every part of the SGLang
# wheels (.gpu-stage-sgl/1..3, built from ../shared/gpu/sglang-requirements.txt with
# sglang-kernel stripped by scripts/gpu/build-sglang-stage.sh) copied to /root/stage-sgl (PDX_SGL_STAGE). BUDGET_S bounds the whole script,
# unpacking included; the rest of a 600 s device call is left for packing and the transfer.
#
# PDX_SGL_DRY=1 runs the same steps against the embedded engine imitating SGLang (`pdexporter sim serve
# --engine sglang`, same SGLang flags) instead of SGLang, skipping the unpacking and the install:
# what CI-less checking of this script is possible without a GPU (tests/e2e/test_sglang_cli.py).
# PDX_SGL_WORK (default /root/sgl) is where everything is written; PDX_SGL_PORT the engines' port.
# PDX_SGL_ATTENTION=fa3 runs both modes with FlashAttention 3 (SGLang's default on Hopper) instead of
# triton attention: sgl_kernel's flash_ops.abi3.so, which the stripped bundle lacks, comes from the
# parts of scripts/gpu/build-sglang-fa3-parts.sh copied to /root/stage-fa3 (PDX_SGL_FA3_STAGE), its
# checksum checked; the sweeps are the committed ones with `--attention-backend fa3`, and the work
# folder defaults to /root/sgl-fa3.
# The switches are PDX_SGL_*, not SGL_*: SGLang copies every SGL_* variable of its environment to
# SGLANG_* at import (its deprecated prefix), and SGLANG_PORT sets where it searches for internal ports.
# PDX_SGL_MODES (default "default mixed") picks the modes to run; PDX_SGL_MIXED_SWEEP / PDX_SGL_DEFAULT_SWEEP
# replace a mode's committed sweep file (e.g. sweeps/h200-sglang-mixed-p16k.yaml: one more prompt length).
set -u
for old in SGL_ATTENTION SGL_MODES SGL_WORK SGL_STAGE SGL_FA3_STAGE SGL_DRY SGL_DRY_REPS SGL_PORT SGL_MIXED_SWEEP SGL_DEFAULT_SWEEP; do
  [ -n "${!old:-}" ] && { echo "$old: renamed PDX_$old (SGLang reads SGL_* as its own SGLANG_* variables)"; exit 2; }
done
BUDGET=${1:-540}
T0=$(date +%s)
ATTENTION=${PDX_SGL_ATTENTION:-triton}
case "$ATTENTION" in triton|fa3) ;; *) echo "PDX_SGL_ATTENTION: '$ATTENTION' is not triton or fa3"; exit 2 ;; esac
W=${PDX_SGL_WORK:-/root/sgl$([ "$ATTENTION" = fa3 ] && echo -fa3)}
FA3_STAGE=${PDX_SGL_FA3_STAGE:-/root/stage-fa3}
STAGE=${PDX_SGL_STAGE:-/root/stage-sgl}
DRY=${PDX_SGL_DRY:-0}
PORT=${PDX_SGL_PORT:-8000}
OUT=${OUT:-$W/out}
PACK_RESERVE=25   # seconds kept for the re-analysis and the packing after the last sweep
mkdir -p "$W" "$OUT"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/steps.log"; }

pack() {
  for mode in default mixed; do
    d="$W/$mode"
    [ -d "$d" ] || continue
    # The engine log holds one line per decode step: the windows keep theirs in their raw files,
    # so the log is trimmed to everything but those lines (start-up, prefill lines, errors).
    for log_file in "$d"/*/engine/engine.log; do
      [ -f "$log_file" ] || continue
      grep -v "] Decode batch" "$log_file" > "${log_file%.log}-trimmed.log" 2>/dev/null
      grep -c "] Decode batch" "$log_file" > "${log_file%.log}-decode-lines.txt" 2>/dev/null
    done
  done
  (cd "$W" && tar czf "$OUT/sglang.tar.gz" --ignore-failed-read --exclude='engine.log' --exclude='*.tmp' \
     default mixed steps.log sweep-console.log imports.txt without-log.json 2>/dev/null)
  cp "$W/steps.log" "$OUT/" 2>/dev/null
  cp "$W/without-log.json" "$OUT/" 2>/dev/null
}
trap pack EXIT

# 1. The vLLM bundle (site-packages, model folder) and the SGLang wheels on their own path.
if [ "$DRY" != "1" ]; then
  source scripts/gpu/unpack-bundle.sh || { log "vLLM bundle incomplete in /root/stage"; exit 1; }
  if [ ! -f /tmp/sgl/.installed ]; then
    cat "$STAGE"/sgl-wheels.tar.part.* > /root/sgl-wheels.tar || { log "no SGLang parts in $STAGE"; exit 1; }
    want=$(awk '{print $1}' "$STAGE/sgl-wheels.tar.sha256")
    got=$(sha256sum /root/sgl-wheels.tar | awk '{print $1}')
    [ "$want" = "$got" ] || { log "SGLang wheels incomplete: copy every part of .gpu-stage-sgl to $STAGE"; exit 1; }
    rm -rf /root/sgl-wheels /tmp/sgl && mkdir -p /root/sgl-wheels /tmp/sgl
    tar xf /root/sgl-wheels.tar -C /root/sgl-wheels && (cd /root/sgl-wheels && sha256sum -c --quiet SHA256SUMS) \
      || { log "a wheel does not match its checksum"; exit 1; }
    for wheel in /root/sgl-wheels/*.whl; do python3 -m zipfile -e "$wheel" /tmp/sgl/ || exit 1; done
    touch /tmp/sgl/.installed
    log "SGLang wheels installed in /tmp/sgl ($(ls /root/sgl-wheels/*.whl | wc -l) wheels)"
  fi
  if [ "$ATTENTION" = fa3 ] && [ ! -f /tmp/sgl/sgl_kernel/flash_ops.abi3.so ]; then
    cat "$FA3_STAGE"/*/flash_ops.part.* 2>/dev/null | xz -d > /tmp/sgl/sgl_kernel/flash_ops.abi3.so \
      && (cd /tmp/sgl/sgl_kernel && sha256sum -c --quiet "$(ls "$FA3_STAGE"/*/flash_ops.sha256 | head -1)") \
      || { rm -f /tmp/sgl/sgl_kernel/flash_ops.abi3.so
           log "FlashAttention 3 incomplete: copy every part of .gpu-stage-fa3 to $FA3_STAGE/NN"; exit 1; }
    log "FlashAttention 3 installed ($(du -m /tmp/sgl/sgl_kernel/flash_ops.abi3.so | cut -f1) MiB)"
  fi
  mkdir -p /tmp/tvm-ffi-cache
  # What imports before anything starts (a missing module is one line here, not 3 minutes later).
  PYTHONPATH=/tmp/sgl:/tmp/site SGLANG_IS_FLASHINFER_AVAILABLE=false python3 -c \
    "import sglang, sgl_kernel, transformers; import sglang.srt.entrypoints.http_server; $([ "$ATTENTION" = fa3 ] && echo 'import sgl_kernel.flash_attn;') print('sglang', sglang.__version__, 'transformers', transformers.__version__, 'attention $ATTENTION')" \
    > "$W/imports.txt" 2>&1 || { log "SGLang does not import: $(tail -1 "$W/imports.txt")"; exit 1; }
  log "$(head -1 "$W/imports.txt")"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
  log "dry run: the embedded engine imitating SGLang stands in for it"
fi
export PYTHONUNBUFFERED=1

# The sweep file a mode runs: the committed one, or in the dry run the same with the embedded engine.
sweep_file() {
  local mode=$1 file=${PDX_SGL_DEFAULT_SWEEP:-sweeps/h200-sglang.yaml}
  [ "$mode" = mixed ] && file=${PDX_SGL_MIXED_SWEEP:-sweeps/h200-sglang-mixed.yaml}
  if [ "$DRY" = "1" ]; then
    python3 - "$file" "$W/dry-$mode.yaml" "$PORT" "${PDX_SGL_DRY_REPS:-1}" <<'PY'
import sys, yaml
src, dst, port, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = yaml.safe_load(open(src))
mixed = "--enable-mixed-chunk" in spec["launcher"]["command"]
spec["launcher"]["command"] = (
    "{python} -m pdexporter sim serve --engine sglang --chunked-prefill-size {chunk} --decode-log-interval 1 "
    f"--enable-metrics {'--enable-mixed-chunk ' if mixed else ''}--host 127.0.0.1 --port {port}")
spec["launcher"]["url"] = f"http://127.0.0.1:{port}"
spec["launcher"]["health_timeout_s"] = 90
spec["reps"] = reps
spec["grid"]["decode_batch_sizes"] = spec["grid"]["decode_batch_sizes"][:2]
spec["grid"]["new_prefill_tokens"] = spec["grid"]["new_prefill_tokens"][:2]
yaml.safe_dump(spec, open(dst, "w"), sort_keys=False)
PY
    echo "$W/dry-$mode.yaml"
  else
    sed "s/--port 8000/--port $PORT/; s#http://127.0.0.1:8000#http://127.0.0.1:$PORT#; s/--attention-backend triton/--attention-backend $ATTENTION/" \
      "$file" > "$W/$mode.yaml"
    echo "$W/$mode.yaml"
  fi
}

# Stop the engine a sweep left running (it keeps it at a deadline, for a resume): the next mode
# needs the GPU and the port.
stop_engine() {
  python3 - "$1" <<'PY'
import json, os, signal, sys, time
from pathlib import Path
for state in Path(sys.argv[1]).glob("*/engine/engine.json"):
    pid = json.loads(state.read_text())["pid"]
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 5)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
    print(f"stopped the engine left running (pid {pid})")
PY
}

# 2. Both modes, one after the other: the first gets half of what is left, the second the rest.
status=0
MODES=${PDX_SGL_MODES:-default mixed}
for mode in $MODES; do
  case "$mode" in default|mixed) ;; *) log "PDX_SGL_MODES: '$mode' is not default or mixed"; exit 2 ;; esac
  file=$(sweep_file "$mode")
  if [ "$mode" = default ] && [ "$MODES" != default ]; then share=$(( ($(left) - PACK_RESERVE) / 2 )); else share=$(( $(left) - PACK_RESERVE )); fi
  if [ "$share" -lt 60 ]; then log "$mode: only ${share}s left, not started"; status=5; continue; fi
  log "$mode: sweep $file, deadline ${share}s"
  python3 -m pdexporter sweep "$file" --out "$W/$mode" --deadline "${share}s" >> "$W/sweep-console.log" 2>&1
  code=$?
  log "$mode: sweep exit $code ($( [ $code = 0 ] && echo complete || echo "5: stopped at the deadline, rerun resumes" ))"
  [ $code = 0 ] || status=$code
  stop_engine "$W/$mode" | tee -a "$W/steps.log"
done

# 3. Every record re-analysed without the engine's log, against the log (nothing is rewritten).
python3 - "$W" <<'PY' | tee -a "$W/steps.log"
import json, sys
from pathlib import Path

from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.sweep.reanalyse import compare_sources
from pdexporter.measure.store import ResultsStore, load_record_file

out = {}
for mode in ("default", "mixed"):
    root = Path(sys.argv[1]) / mode
    if not any(root.glob("*/D*_P*.json")):
        continue
    store = ResultsStore(root)
    rows = compare_sources(store, [load_record_file(p) for p in store.iter_record_paths()], ProtocolSettings())
    out[mode] = [{"key": list(r.key), "penalty_log_ms": r.penalty_log_ms, "penalty_cadence_ms": r.penalty_cadence_ms,
                  "reps": r.reps, "reps_same_steps": r.reps_same_steps, "agrees": r.penalty_agrees()} for r in rows]
    agree = sum(r.penalty_agrees() for r in rows)
    print(f"{mode}: penalty without the log agrees with the log on {agree}/{len(rows)} configurations; "
          f"{sum(r.reps_same_steps for r in rows)}/{sum(r.reps for r in rows)} repetitions located the log's chunk steps")
Path(sys.argv[1], "without-log.json").write_text(json.dumps(out, indent=1))
PY
log "done in $(( $(date +%s) - T0 ))s (exit $status)"
exit $status
