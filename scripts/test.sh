#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine, then the suite itself.
#   bash scripts/test.sh [pytest args...]
# Python: the virtual environment it is run in (an activated one: `python3` is a venv's), else
# ./.venv, made here with `python3 -m venv` when missing (git ignores it); PDX_PYTHON=PATH names
# another interpreter. The test extras are installed into that environment (`pip install -e
# '.[test]'`), so what pyproject.toml does not declare is missing there and fails the run;
# .ci/run runs this in a virtual environment it has just made (README "Tests and benchmarks").
# The suite runs in two passes: every test not marked `realtime` on PDX_TEST_WORKERS pytest-xdist
# workers (default 6: most tests wait on subprocesses, sockets and timers; on 2 cores beside a CPU
# burner 4 workers left the pass at 8m27, 6 at 7m42-7m56, session 33), then the `realtime` tests
# alone, so that no other test loads the machine while they compare the real-time engine's cadence
# with its model. The pytest arguments go to both passes.
# PDX_TEST_SKIP_INSTALL=1 skips the apt and pip steps (and makes no ./.venv: without a virtual
# environment, python3 as it is); PDX_TEST_LINT_ONLY=1 stops after ruff and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
in_venv() { "$1" -c 'import sys; raise SystemExit(sys.prefix == sys.base_prefix)' 2>/dev/null; }
# Bytecode caches: where PYTHONDONTWRITEBYTECODE is set (this project's shared machine sets it),
# each of the suite's hundreds of Python processes compiled pdexporter again, and each pytest
# worker rewrote every test module's asserts again (collection 9.9 s instead of 4.7 s). The
# caches go outside the checkout, under PYTHONPYCACHEPREFIX.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/pdexporter-tests/pycache}"
fi
# Under PYTHONPYCACHEPREFIX Python reads bytecode only from there, never from the __pycache__
# folders pip writes beside what it installs: pip's compiling (~17 s of CPU for the test extras in
# a fresh environment) would go unread, so it is left out; what is imported compiles once, into the
# prefix.
compile=()
if [ -n "${PYTHONPYCACHEPREFIX:-}" ]; then compile=(--no-compile); fi
# mypy's cache goes outside the checkout too, so a fresh clone (CI's) checks only what changed; the
# cache is keyed by file contents, so a stale one costs a re-check, never a missed error.
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pdexporter-tests/mypy}"
skip="${PDX_TEST_SKIP_INSTALL:-0}"
make_venv=0
if [ -n "${PDX_PYTHON:-}" ]; then
  python="$PDX_PYTHON"
elif in_venv python3; then
  python="$(command -v python3)"
elif [ -x .venv/bin/python ]; then
  python="$PWD/.venv/bin/python"
elif [ "$skip" != 1 ]; then
  python="$PWD/.venv/bin/python"
  make_venv=1
else
  python=python3
fi
if [ "$skip" != 1 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
  need=()
  command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  # Debian's own python3 makes virtual environments only with python3-venv (ensurepip)
  if [ "$make_venv" = 1 ] && ! python3 -c 'import ensurepip' 2>/dev/null; then need+=(python3-venv); fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing Debian packages: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ "$make_venv" = 1 ]; then
    echo "making a virtual environment in .venv"
    python3 -m venv .venv
  fi
  # A virtual environment's own pip is the one its Python bundles (3.11: pip 23.2), which resolves
  # this project's ~100 dependencies against the configured indexes in ~30 s of CPU; pip 25 or newer
  # does it in ~10 (the whole install 44 -> 27 s on this 2-core machine, the upgrade included). Only
  # inside a virtual environment: a system interpreter's pip is not this script's to change.
  if in_venv "$python" && ! "$python" -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 25)' 2>/dev/null; then
    "$python" -m pip install -q --disable-pip-version-check -U pip
  fi
  "$python" -m pip install -q "${compile[@]}" -e '.[test]'
fi
echo "python: $python ($("$python" --version 2>&1))"
"$python" -m ruff check .  # lint first (config: pyproject.toml): either failing fails the run
"$python" -m mypy
if [ "${PDX_TEST_LINT_ONLY:-0}" = 1 ]; then
  echo "PDX_TEST_LINT_ONLY=1: ruff and mypy passed; no tests run"
  exit 0
fi
# pytest-benchmark switches itself off under xdist (a warning per worker); no test uses its fixture.
# One collection first, in one process: it compiles the package and rewrites every test module's asserts into
# the bytecode caches (~10 s of CPU), which the workers then read (~3 s each) instead of all four compiling the
# same files at once on a fresh clone (~40 s of CPU). Its failures are the parallel pass's own, reported there.
# It collects the `realtime` tests' ids too: with no file or test named on the command line (only options),
# the second pass is given them, so it imports their 7 modules instead of collecting all ~190 again (~8 s).
# (tests/conftest.py writes them to PDX_LIST_TESTS).
realtime_ids=()
only_options=1
for arg in "$@"; do case "$arg" in -*) ;; *) only_options=0 ;; esac; done
listing="$(mktemp)"
PDX_LIST_TESTS="$listing" "$python" -m pytest --collect-only -q -p no:benchmark -m realtime "$@" >/dev/null 2>&1 || true
if [ "$only_options" = 1 ]; then
  while IFS= read -r line; do
    case "$line" in tests/*::*) realtime_ids+=("$line") ;; esac
  done < "$listing"
fi
rm -f "$listing"
parallel=0
"$python" -m pytest -n "${PDX_TEST_WORKERS:-6}" --dist loadgroup -p no:benchmark -m "not realtime" "$@" || parallel=$?
alone=0
"$python" -m pytest -m realtime "$@" "${realtime_ids[@]}" || alone=$?
# 5: a pass that selected no test (arguments naming only tests of the other pass)
if [ "$parallel" -eq 5 ] && [ "$alone" -ne 5 ]; then parallel=0; fi
if [ "$alone" -eq 5 ] && [ "$parallel" -ne 5 ]; then alone=0; fi
if [ "$parallel" -ne 0 ]; then exit "$parallel"; fi
exit "$alone"
