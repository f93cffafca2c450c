"""`pid_alive` on real processes: a running one, a zombie, a reaped one; and the moment between its two looks
(`kill(pid, 0)` and `/proc/<pid>/stat`) where the zombie's parent reaps it (a loaded CI runner hit it: the
launcher test's engine read as alive after its stop)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pdexporter._internal.procs import pid_alive


def test_running_zombie_and_reaped_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_alive(child.pid)
    finally:
        child.kill()
    for _ in range(100):  # killed, not yet waited for: a zombie, which is not alive
        if not pid_alive(child.pid):
            break
        time.sleep(0.05)
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)


def test_a_process_reaped_between_the_two_looks_is_not_alive(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    stat = f"/proc/{child.pid}/stat"
    real = Path.read_text

    def reaped_meanwhile(self: Path, *args: object, **kwargs: object) -> str:
        if str(self) == stat:  # kill(pid, 0) found it; now it is gone
            raise FileNotFoundError(stat)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    try:
        monkeypatch.setattr(Path, "read_text", reaped_meanwhile)
        assert not pid_alive(child.pid)
        monkeypatch.undo()
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()

