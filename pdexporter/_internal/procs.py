"""Processes by pid, the Linux way: is one alive, and which one is it (pids get reused)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["die_with_parent", "pid_alive", "process_start_ticks", "same_process"]

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when its parent dies, SIGKILL included
    (Linux: prctl(PR_SET_PDEATHSIG); None elsewhere). libc is loaded here, in the parent: the
    child only calls prctl. The kernel sends the signal when the *thread* that forked the child
    ends, so fork from a thread that lives as long as the owner (pdexporter's launchers run on
    the main thread's event loop). A parent that died before prctl ran is caught by the getppid()
    check."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


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
    except FileNotFoundError:  # reaped between the two looks (a zombie's parent waited for it just then)
        return False
    except (OSError, IndexError):
        return True


def same_process(pid: int, start_ticks: int | None) -> bool:
    """The process `pid` is alive and is the one that started at `start_ticks` (when known)."""
    if pid <= 0 or not pid_alive(pid):
        return False
    now = process_start_ticks(pid)
    return start_ticks is None or now is None or now == start_ticks
