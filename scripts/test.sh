#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine, then the suite itself.
#   bash scripts/test.sh [pytest args...]
# The suite runs in two passes (README "Tests and benchmarks"): every test not marked `realtime`
# on PDX_TEST_WORKERS pytest-xdist workers (default 4: most tests wait on subprocesses, sockets
# and timers, so 4 keep 2 cores busy), then the `realtime` tests alone, so that no other test
# loads the machine while they compare the real-time engine's cadence with its model. The pytest
# arguments go to both passes. PDX_TEST_SKIP_INSTALL=1 skips the apt and pip steps.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${PDX_TEST_SKIP_INSTALL:-0}" != 1 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
  need=()
  command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing Debian packages: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  python3 -m pip install -q -e '.[test]'
fi
python3 -m ruff check .  # lint first (config: pyproject.toml): either failing fails the run
python3 -m mypy
# Bytecode caches: where PYTHONDONTWRITEBYTECODE is set (this project's shared machine sets it),
# each of the suite's hundreds of Python processes compiled pdexporter again, and each pytest
# worker rewrote every test module's asserts again (collection 9.9 s instead of 4.7 s). The
# caches go outside the checkout, under PYTHONPYCACHEPREFIX.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/pdexporter-tests/pycache}"
fi
# pytest-benchmark switches itself off under xdist (a warning per worker); no test uses its fixture.
parallel=0
python3 -m pytest -n "${PDX_TEST_WORKERS:-4}" --dist loadgroup -p no:benchmark -m "not realtime" "$@" || parallel=$?
alone=0
python3 -m pytest -m realtime "$@" || alone=$?
# 5: a pass that selected no test (arguments naming only tests of the other pass)
if [ "$parallel" -eq 5 ] && [ "$alone" -ne 5 ]; then parallel=0; fi
if [ "$alone" -eq 5 ] && [ "$parallel" -ne 5 ]; then alone=0; fi
if [ "$parallel" -ne 0 ]; then exit "$parallel"; fi
exit "$alone"
