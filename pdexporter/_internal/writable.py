"""An output path checked before a command starts its work: one line if it cannot be written.

Every command that writes (`--out` of run, measure, sweep, sim sweep, export-table, compare, report,
...) calls `check_writable` first, so a folder nobody can write is a one-line error at once, not
a traceback at the first record (or, for `run`, at its first window). Nothing is created: the
nearest folder that exists is probed with a temporary file, removed at once.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pdexporter.errors import ConfigError

__all__ = ["check_writable"]


def _nearest_existing(path: Path) -> Path:
    """`path` itself, or the closest of its parents that exists (the one `mkdir -p` would write in)."""
    return next((p for p in (path, *path.parents) if os.path.lexists(p)), Path(path.anchor or "."))


def _reason(path: Path, directory: bool) -> str | None:
    """Why `path` (absolute; a folder where `directory`, else a file) cannot be written; None when
    it can."""
    if os.path.lexists(path):
        if directory != path.is_dir():
            return "a file, not a folder" if directory else "a folder, not a file"
        folder = path if directory else path.parent
    else:
        folder = _nearest_existing(path.parent)
        if not folder.is_dir():
            return f"{folder} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".pdx-writable-", suffix=".tmp", dir=folder)
    except OSError as exc:
        text = os.strerror(exc.errno) if exc.errno else str(exc)
        return text if folder == path else f"{folder}: {text}"
    os.close(fd)
    os.unlink(probe)
    return None


def check_writable(path: Path | str, what: str = "--out", *, directory: bool = True,
                   suffixes: tuple[str, ...] = ()) -> Path:
    """`path` back when this process can create or write it (a folder where `directory`, else a
    file); else `ConfigError`, one line: `--out /x: not writable (Permission denied)`. `what`
    names where the path came from (a flag, a sweep file's field). `suffixes`: the kinds of file the
    command writes (`.html`): an existing file of another kind (a record's `.json`) is not
    overwritten (the bad-input audit: `report --out RESULTS/6144/D1_P512.json` replaced a record)."""
    target = Path(path).expanduser()
    reason = _reason(target.absolute(), directory)
    if reason is not None:
        raise ConfigError(f"{what} {path}: not writable ({reason})")
    if suffixes and target.is_file() and target.suffix.lower() not in suffixes:
        raise ConfigError(f"{what} {path}: an existing {target.suffix or 'extension-less'} file, and this writes "
                          f"{suffixes[0]}: give a new path (nothing was overwritten)")
    return target
