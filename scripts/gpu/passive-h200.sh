#!/usr/bin/env bash
# Passive mode with vLLM's request traces on one H200 (issue 23), against injection on the same engine:
#   1. the engine's OpenTelemetry imports checked (doctor's code) before tracing is turned on: an
#      incomplete install takes vLLM 0.22 down with --otlp-traces-endpoint (every request HTTP 500);
#   2. vLLM 0.22 at B = 8192 sending its request spans to `pdexporter run --passive`'s receiver;
#   3. `pdexporter load --rate RATE` for PASSIVE_S seconds beside the exporter (4 probes), and
#      `doctor --traces` once during it (do spans arrive, with what delay);
#   4. the injected sweep on the same engine once the load stopped (sweeps/passive-h200.yaml);
#   5. export-table --mode passive --injected (the event model, its error vs minutes of traffic) and
#      scripts/gpu/passive_compare.py (trace-based vs cadence-based attribution, same events).
#
#   bash scripts/gpu/passive-h200.sh BUDGET_S [PASSIVE_S=600] [RATE=1.5]
#
# From the environment: MAX_MODEL_LEN (vLLM's, default 200000; 65536 on an H100), SEED (the load's,
# default 17) and MIX (its prompt mix, default sharegpt-like);
# INJECTED=DIR takes the injected sweep of an earlier passive run on the same engine (its
# PASSIVE_WORK/injected) instead of measuring one again, so two runs at different rates, seeds and
# mixes share one reference (scripts/gpu/validation.sh passive-two); STOP_ENGINE=1 stops the engine
# once this run's analysis is written (the next step of the campaign needs the GPU).
#
# Every call runs this same script within BUDGET_S (<= 590 for a 600 s device call); a step that
# finished is not run again, and the engine, the exporter and the load (each in its own session)
# go on between calls and are adopted by the next. Two calls back to back, ~14.5 minutes of wall
# time for PASSIVE_S = 600: vLLM start ~2-2.5 min, exporter up ~15 s, 10 min of traffic + 20 s of
# attribution, the sweep ~1 min (D 4-12; D 1, 2 if the call has time), the analysis ~0.5 min; plus
# ~1 min to unpack the bundle when /tmp/site is not there yet. PASSIVE_S = 1800 for the 30-minute
# model takes a third call (~35 minutes in all). Measured on one H200 with PASSIVE_S = 180
# (results/h200-vllm0.22-qwen3-coder-30b-a3b-passive/RUN.md): vLLM healthy 140 s into the first
# call, the passive step 215 s (180 s of load + the exporter's 35 s tail), the injected sweep of
# 42 configs x 2 repetitions 62 s; export-table and passive_compare.py (in parallel) ~25 s and ~40 s
# on 2 CPU cores.
#
# Spread mode (SEGMENTS=K; validation.sh passive-spread, issue 30 item 4): the injected reference spread
# over the passive run's own minutes. On one engine, K times: passive segment k (`run --passive` with its
# probes + `load --rate RATE --seed SEED+k-1 --mix MIX` for PASSIVE_S seconds: a new seed each segment, so
# the prompts stay cold for the prefix cache), then injected block k with the exporter and the load
# stopped (their probes would share the engine with the sweep's and change its D): the same sweep with
# `--reps k`, which adds repetition k (0-based k-1, its `block` field) to every cell of SWEEP's grid (a
# sweep resumes from the repetitions a record holds: sweep.plan.config_status). The segments share one
# passive directory (a restarted exporter appends each event as the next repetition of its cell:
# exporter.passive_live.save_event), so the analysis is step 5 with `--spread spread.tsv`: the event
# model's minutes are the segments' traffic minutes, the injected blocks between left out. Markers per segment and
# block (passive-k.started/.done, injected-k.done); spread.tsv logs each segment's and each sweep
# invocation's start and end (epoch s) and rc; scripts/gpu/passive_spread.py relates them to the
# records (spread.md: events per segment, repetitions per block, the checks). On the H200 (SEGMENTS=5,
# PASSIVE_S=60): ~135 s a segment + block (exporter up ~15 s, 60 s of load, the exporter's ~20 s tail,
# one repetition of 42 cells ~35-40 s), ~11 min for five; ~15 min with the engine's start and the
# analysis: two 590 s calls. Dry run (3 segments of 20 s, a two-cell SWEEP): scripts/gpu/README.md.
#   SEGMENTS=5 STOP_ENGINE=1 bash scripts/gpu/passive-h200.sh BUDGET_S 60 2.0     (validation.sh passive-spread)
# SWEEP=FILE replaces sweeps/passive-h200.yaml (a smaller grid for a dry run); INJECTED is refused.
# BURN_BLOCKS="2 4" (spread mode): during those blocks BURN_N (default nproc - 4) busy loops at nice 19
# keep the host's other CPUs busy (the quiet-host test: does an idle host take the fast launch level less
# often than one serving traffic?); each such block adds `burn k start end N` to spread.tsv.
#
# Needs on the machine: the vLLM bundle in /root/stage (../shared/gpu/README.md) and the
# OpenTelemetry wheels vLLM's tracing imports, carried as .gpu-stage-otel/otel-site.tar.gz (built by
# scripts/gpu/build-otel-stage.sh; the bundle has opentelemetry-api only).
# Dry run on the embedded engine (no GPU, real time):  OUT=/tmp/out ENGINE=sim bash scripts/gpu/passive-h200.sh 590 60
#
# Results in $OUT (5 files; spread mode 6): passive-h200.tar.gz (spread mode passive-spread.tar.gz: records,
# tables, comparisons incl. comparison-launch-slow.md and comparison-level-matched.md, logs), SUMMARY.md
# (RUN.md-ready), comparison.json, passive_convergence.png, steps.log (spread mode: spread.md too).
set -u
BUDGET=${1:-590}
PASSIVE_S=${2:-600}
RATE=${3:-1.5}
SEED=${SEED:-17}
MIX=${MIX:-sharegpt-like}
INJECTED=${INJECTED:-}
SEGMENTS=${SEGMENTS:-}  # spread mode: K passive segments, each followed by one injected block
SWEEP=${SWEEP:-sweeps/passive-h200.yaml}
ENGINE=${ENGINE:-vllm}
T0=$(date +%s)
W=${PASSIVE_WORK:-/root/passive}
B=8192
PORT=${ENGINE_PORT:-8000}
EXPORTER=${EXPORTER_PORT:-18742}
TRACES_PORT=${TRACES_PORT:-18743}  # the exporter's trace receiver: a port of its own (docs/security.md)
URL=http://127.0.0.1:$PORT
REFERENCE=results/h200-vllm0.22-qwen3-coder-30b-a3b
OUT=${OUT:?set OUT}
K=${SEGMENTS:-1}
TAR=passive-h200
if [ -n "$SEGMENTS" ]; then
  [ -n "$INJECTED" ] && { echo "SEGMENTS and INJECTED: a spread run measures its own injected blocks"; exit 2; }
  TAR=passive-spread
fi
mkdir -p "$W" "$OUT"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(date +%T)] $*" | tee -a "$W/steps.log"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
sfx() { [ -n "$SEGMENTS" ] && echo "-$1"; }  # spread mode: segment / block k's markers and logs

pack() {
  (cd "$W" && tar czf "$OUT/$TAR.tar.gz" --ignore-failed-read passive passive-table injected comparison.md plots \
     comparison.json comparison-launch-slow.md comparison-level-matched.md SUMMARY.md load*.json steps.log \
     exporter*.log exporter-metrics*.txt load*.log engine.log sweep.log imports.txt doctor-traces.txt \
     export-table.log spread.tsv spread.md spread.json 2>/dev/null)
  for f in SUMMARY.md comparison.json steps.log spread.md; do cp "$W/$f" "$OUT/" 2>/dev/null; done
  cp "$W/passive-table/plots/passive_convergence.png" "$OUT/" 2>/dev/null
  true
}
BURNERS=()
burn_stop() { [ "${#BURNERS[@]}" -gt 0 ] && kill "${BURNERS[@]}" 2>/dev/null; BURNERS=(); true; }
trap 'burn_stop; pack' EXIT

[ -f "$W/analysis.done" ] && { log "$W: this run is done (analysis written)"; exit 0; }

# 0-2. The parts, the tracing check and the engine at B sending its spans to the exporter (traced-engine.sh).
source scripts/gpu/traced-engine.sh
start_traced_engine

# 3. run --passive beside the load (both in their own sessions: they outlive this call). Spread mode:
#    segment k of K, seed SEED+k-1, its events appended to the same passive directory.
segment() {
  local k=$1 s seed
  s=$(sfx "$k"); seed=$(( SEED + k - 1 ))
  if [ ! -f "$W/passive$s.started" ]; then
    [ "$k" = 1 ] && rm -rf "$W/passive"  # a new run; a later segment's exporter appends to its records
    setsid python3 -m pdexporter run --passive --target "$URL" --chunk-size $B --decode-batch-size 4 \
      --listen 127.0.0.1:$EXPORTER --traces-listen 127.0.0.1:$TRACES_PORT --out "$W/passive" --duration "$(( PASSIVE_S + 35 ))s" --attribution-wait 20s \
      > "$W/exporter$s.log" 2>&1 < /dev/null &
    echo $! > "$W/exporter.pid"
    for _ in $(seq 120); do
      curl -sf "http://127.0.0.1:$EXPORTER/metrics" 2>/dev/null | grep -q '^pdexporter_up 1' && break
      sleep 1
    done
    setsid python3 -m pdexporter load --target "$URL" --rate "$RATE" --duration "${PASSIVE_S}s" --seed "$seed" \
      --mix "$MIX" --out "$W/load$s.json" > "$W/load$s.log" 2>&1 < /dev/null &
    echo $! > "$W/load.pid"
    date +%s > "$W/passive$s.started"
    log "passive${s:+ segment $k/$K}: run --passive + load at $RATE req/s (seed $seed, $MIX) for $PASSIVE_S s started"
    # do the engine's spans reach the exporter, and how late? (reads the running exporter's counters)
    [ "$k" = 1 ] && (sleep 20; python3 -m pdexporter doctor --target "$URL" --chunk-size $B --traces \
       --traces-receiver "127.0.0.1:$TRACES_PORT" --traces-wait 20 > "$W/doctor-traces.txt" 2>&1) &
  fi
  if [ ! -f "$W/passive$s.done" ]; then
    while alive "$W/exporter.pid" || alive "$W/load.pid"; do
      [ "$(left)" -lt 25 ] && { log "passive run${s:+ segment $k} still going ($(( $(date +%s) - $(cat "$W/passive$s.started") )) s in): the next call waits for it"; exit 0; }
      # the exporter's own counters (every run of slow steps by outcome and source, the live model's
      # gauges): the last scrape before it stops is kept, the records hold the published events only
      curl -sf "http://127.0.0.1:$EXPORTER/metrics" > "$W/exporter-metrics.tmp" 2>/dev/null \
        && mv "$W/exporter-metrics.tmp" "$W/exporter-metrics$s.txt"
      sleep 5
    done
    touch "$W/passive$s.done"
    [ -n "$SEGMENTS" ] && printf 'segment\t%s\t%s\t%s\t0\n' "$k" "$(cat "$W/passive$s.started")" "$(date +%s)" >> "$W/spread.tsv"
    log "passive${s:+ segment $k}: $(ls "$W"/passive/$B/*.json 2>/dev/null | wc -l) cells$([ "$k" = 1 ] && \
      echo "; $(grep -h "traces arrive" "$W/doctor-traces.txt" 2>/dev/null | head -1)")"
  fi
}

# 4. The injected table of the same engine, its load gone (resumes across calls: complete records are skipped),
#    or an earlier run's on this engine (INJECTED). Spread mode: block k, `--reps k` (repetition k of every
#    cell); a block the deadline stopped is finished by the next call before segment k+1 starts.
block() {
  local k=$1 s reserve=65 budget t rc  # the analysis follows the last block (~45 s on 16 cores)
  s=$(sfx "$k")
  if [ -n "$INJECTED" ] && [ ! -f "$W/injected.done" ]; then
    [ -f "$INJECTED/../injected.done" ] || log "INJECTED=$INJECTED: that sweep did not finish; its cells so far are used"
    rm -rf "$W/injected" && cp -a "$INJECTED" "$W/injected" && touch "$W/injected.done"
    log "injected: $(ls "$W"/injected/$B/*.json 2>/dev/null | wc -l) cells from $INJECTED"
  fi
  [ -f "$W/injected$s.done" ] && return 0
  [ -n "$SEGMENTS" ] && [ "$k" -lt "$K" ] && reserve=20  # the next segment, not the analysis, follows
  local reps=() attempt
  [ -n "$SEGMENTS" ] && reps=(--reps "$k")
  for attempt in 1 2; do
    budget=$(( $(left) - reserve ))
    if [ "$budget" -le 60 ]; then  # (a fresh sweep takes its warm-up for 30 s before it knows better)
      log "no time left for the injected sweep${s:+ block $k} in this call: the next call runs it"; exit 0
    fi
    local burn=0 b
    if [ -n "$SEGMENTS" ] && [[ " ${BURN_BLOCKS:-} " == *" $k "* ]]; then
      burn=${BURN_N:-$(( $(nproc) - 4 ))}
      for b in $(seq "$burn"); do nice -n 19 sh -c 'while :; do :; done' & BURNERS+=($!); done
    fi
    log "injected sweep${s:+ block $k/$K (repetition $k of every cell)} on the same engine (deadline ${budget}s)$(
      [ "$burn" -gt 0 ] && echo ", $burn busy loops at nice 19 beside it")"
    t=$(date +%s)
    python3 -m pdexporter sweep "$SWEEP" --target "$URL" --chunk-size $B --out "$W/injected" "${reps[@]}" \
      --deadline "${budget}s" >> "$W/sweep.log" 2>&1
    rc=$?
    burn_stop
    [ "$burn" -gt 0 ] && printf 'burn\t%s\t%s\t%s\t%s\n' "$k" "$t" "$(date +%s)" "$burn" >> "$W/spread.tsv"
    [ "$rc" = 0 ] && touch "$W/injected$s.done"
    [ -n "$SEGMENTS" ] && printf 'block\t%s\t%s\t%s\t%s\n' "$k" "$t" "$(date +%s)" "$rc" >> "$W/spread.tsv"
    log "injected: $(ls "$W"/injected/$B/*.json 2>/dev/null | wc -l) cells${s:+ (block $k: rc $rc, $(( $(date +%s) - t )) s)}"
    # spread mode, 4: cells failed after their retries (sweep.log): once more at once, as the sweep advises
    [ -n "$SEGMENTS" ] && [ "$rc" = 4 ] && [ "$attempt" = 1 ] || break
  done
  if [ -n "$SEGMENTS" ] && [ "$rc" != 0 ]; then
    # 5: the deadline (the next call resumes the block); 4 twice: on without them (the next block's
    # --reps k+1 tries them again; after the last, passive_spread.py's check names them)
    [ "$rc" = 5 ] && { log "block $k stopped at its deadline: the next call finishes it"; exit 0; }
    touch "$W/injected$s.done"
  fi
  true
}

for k in $(seq "$K"); do
  segment "$k"
  block "$k"
done

# 5. The event model and its convergence; trace-based vs cadence-based attribution (and the fit at the slow
# launch level, and the mixed fit scored level-matched: passive_model "Launch levels").
# The injected records of this run where there are any (a sweep cut short leaves some); the
# committed injected table of the same engine only fills cells this run's sweep did not reach,
# and only where this tree has it (a device tree may leave results/ out).
[ "$(left)" -gt 60 ] || { log "no time left for the analysis in this call: the next call writes it"; exit 0; }
INJ=()
ls "$W"/injected/$B/D*_P*.json > /dev/null 2>&1 && INJ=(--injected "$W/injected")
python3 -m pdexporter export-table "$W/passive" --mode passive "${INJ[@]}" --out "$W/passive-table" \
  --no-parquet > "$W/export-table.log" 2>&1 &
TABLE=$!
REF=()
[ "$ENGINE" = vllm ] && [ ! -f "$W/injected$(sfx "$K").done" ] && [ -d "$REFERENCE" ] && REF=(--reference "$REFERENCE")
SPREAD=()
[ -n "$SEGMENTS" ] && SPREAD=(--spread "$W/spread.tsv")  # minutes of traffic: the segments' own
LEVELS=()
for level in slow matched; do
  python3 scripts/gpu/passive_compare.py "$W/passive" --injected "$W/injected" "${REF[@]}" "${SPREAD[@]}" \
    --launch-level $level --minutes 1 2 5 --out "$W/level-$level" > /dev/null 2>> "$W/steps.log" &
  LEVELS+=($!)
done
python3 scripts/gpu/passive_compare.py "$W/passive" --injected "$W/injected" "${REF[@]}" "${SPREAD[@]}" --out "$W" \
  > /dev/null 2>> "$W/steps.log" || log "passive_compare failed"
[ -n "$SEGMENTS" ] && { python3 scripts/gpu/passive_spread.py "$W" --segments "$K" > "$W/spread.md" 2>> "$W/steps.log" \
  || log "passive_spread: $(tail -1 "$W/spread.md")"; }
wait $TABLE || log "export-table failed (export-table.log)"
for pid in "${LEVELS[@]}"; do wait "$pid" || log "passive_compare (a launch level) failed"; done
cp "$W/level-slow/comparison.md" "$W/comparison-launch-slow.md" 2>/dev/null
cp "$W/level-matched/comparison.md" "$W/comparison-level-matched.md" 2>/dev/null
{
  echo "# Passive mode on $ENGINE (traces $TRACING), against injection on the same engine (issue 23)"
  echo
  if [ -n "$SEGMENTS" ]; then
    echo "- spread (issue 30 item 4): $K passive segments of $PASSIVE_S s, each followed by one repetition of every"
    echo "  cell of \`$SWEEP\` (block k = repetition k, the exporter and the load stopped); the event model's"
    echo "  minutes are the segments' traffic minutes (spread.tsv), the blocks between them left out"
    echo "- engine: $ENGINE at B = $B; \`pdexporter load --rate $RATE --seed $SEED..$(( SEED + K - 1 )) --mix $MIX\` for $PASSIVE_S s"
    echo "  a segment beside \`run --passive\` (4 probes); versions: $(python3 -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null || echo "embedded engine (MODELLED)")"
  else
    echo "- engine: $ENGINE at B = $B; \`pdexporter load --rate $RATE --seed $SEED --mix $MIX\` for $PASSIVE_S s beside"
    echo "  \`run --passive\` (4 probes); versions: $(python3 -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null || echo "embedded engine (MODELLED)")"
  fi
  echo "- tracing imports (checked before tracing was turned on): $(cat "$W/imports.txt")"
  echo "- spans arriving (doctor --traces during the load): $(grep -h "traces arrive" "$W/doctor-traces.txt" 2>/dev/null | tr -s ' │' ' ' | head -c 400)"
  echo "- exporter: $(tail -3 "$W/exporter$(sfx "$K").log" 2>/dev/null | tr '\n' ' ' | head -c 600)"
  for k in $(seq "$K"); do echo "- load$(sfx "$k"): $(tail -1 "$W/load$(sfx "$k").log" 2>/dev/null)"; done
  echo
  echo '```'
  grep -h -A12 "passive event model" "$W/export-table.log" 2>/dev/null | grep -v "^$" | head -12
  echo '```'
  echo
  [ -n "$SEGMENTS" ] && { echo "## Segments and blocks (scripts/gpu/passive_spread.py)"; echo; cat "$W/spread.md"; echo; }
  cat "$W/comparison.md" 2>/dev/null
  for f in comparison-launch-slow comparison-level-matched; do
    [ -f "$W/$f.md" ] && { echo; echo "## $f.md (passive_compare.py --launch-level ${f##*-}; not the headline)"; echo; cat "$W/$f.md"; }
  done
} > "$W/SUMMARY.md"
touch "$W/analysis.done"
log "done in this call after $(( $(date +%s) - T0 )) s"
if [ -n "${STOP_ENGINE:-}" ]; then
  if alive "$W/engine.pid"; then  # this run's engine: its own session, stopped by its id
    kill -- -"$(cat "$W/engine.pid")" 2>/dev/null
  else  # the engine it adopted (the same port)
    pkill -f "(vllm.entrypoints.cli.main|pdexporter sim) serve .*--port $PORT" 2>/dev/null
  fi
  for _ in $(seq 30); do  # its port closed, and its process gone where it was this run's (GPU memory freed)
    curl -sf "$URL/health" > /dev/null || alive "$W/engine.pid" || break
    sleep 1
  done
  log "engine stopped"
fi
