"""One writer per results directory (`_internal.dirlock`): two exporters on one --out interleaved
their repetitions in one record (the runtime audit of session 22)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdexporter._internal.dirlock import LOCK_FILE, hold_directory
from pdexporter.errors import ConfigError

HOLD = "import sys, time; from pdexporter._internal.dirlock import hold_directory; hold_directory(sys.argv[1]); " \
       "print('held', flush=True); time.sleep(60)"


def test_a_second_process_is_refused_and_the_lock_goes_with_its_holder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"^--out {out}: another pdexporter \(pid {holder.pid}\) is writing"):
            hold_directory(out)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops a killed process's lock
        try:
            hold_directory(out)
            break
        except ConfigError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    hold_directory(out)  # this process again: nothing to do
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
