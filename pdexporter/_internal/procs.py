"""Processes by pid, the Linux way: is one alive, and which one is it (pids get reused)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive", "process_start_ticks", "same_process"]


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: with the pid, it names one process (pids get reused; this
    does not change when a process renames itself, as some engines' workers do)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    # A zombie (exited, not reaped) still answers kill(0); /proc says which it is.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
        return status != "Z"
    except (OSError, IndexError):
        return True


def same_process(pid: int, start_ticks: int | None) -> bool:
    """The process `pid` is alive and is the one that started at `start_ticks` (when known)."""
    if pid <= 0 or not pid_alive(pid):
        return False
    now = process_start_ticks(pid)
    return start_ticks is None or now is None or now == start_ticks
