"""One writer per results directory: an advisory lock (`flock`) on `DIR/.pdexporter.lock`, held by the
process for its life (the kernel drops it when the process ends, however it ends). Two exporters on
one `--out` interleaved their repetitions in one record and disturbed each other's windows (the
runtime audit of session 22); the second is now refused in one line naming the first's pid."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pdexporter.errors import ConfigError

__all__ = ["LOCK_FILE", "hold_directory"]

LOCK_FILE = ".pdexporter.lock"
_HELD: dict[Path, int] = {}  # directory -> the open lock file's descriptor (this process's)


def hold_directory(directory: Path | str, what: str = "--out") -> None:
    """Take `directory`'s lock for this process (again: nothing to do); `ConfigError` when another
    process holds it."""
    root = Path(directory).resolve()
    if root in _HELD:
        return
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(f"{what} {directory}: another pdexporter (pid {holder}) is writing there; wait for it to "
                          "end or give another directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[root] = fd
