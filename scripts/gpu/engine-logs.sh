#!/usr/bin/env bash
# Source on the GPU machine: `trim_engine_logs LINES [--gzip] DIR...` writes beside every engine.log
# under DIR a trimmed copy (its first 300 kB: the start-up, then its last LINES iteration lines),
# engine.trimmed.log (engine.trimmed.log.gz with --gzip), for the results that come back without
# the full logs (`tar --exclude=engine.log`).
trim_engine_logs() {
  local lines=$1; shift
  local gz=""
  if [ "${1:-}" = --gzip ]; then gz=1; shift; fi
  local log
  for log in $(find "$@" -name engine.log 2>/dev/null); do
    if [ -n "$gz" ]; then
      _trimmed_engine_log "$log" "$lines" | gzip -9 > "${log%.log}.trimmed.log.gz"
    else
      _trimmed_engine_log "$log" "$lines" > "${log%.log}.trimmed.log"
    fi
  done
}

_trimmed_engine_log() {
  head -c 300000 "$1"; echo; echo "# ... (cut) ... last iteration lines:"; grep -a "Iteration(" "$1" | tail -n "$2"
}
