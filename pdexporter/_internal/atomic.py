"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Results are the product; a sweep killed mid-write must not leave a truncated record behind.
Write to a temporary file in the same directory, fsync, then `os.replace` (atomic on POSIX).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give; mkstemp's 0600 would hide results from others


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


def atomic_write_json_gz(path: str | os.PathLike[str], obj: Any) -> Path:
    raw = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
    # mtime=0 keeps the bytes reproducible for identical content.
    return atomic_write_bytes(path, gzip.compress(raw, compresslevel=6, mtime=0))


def read_json_gz(path: str | os.PathLike[str]) -> Any:
    with gzip.open(path, "rb") as handle:
        return json.loads(handle.read())
