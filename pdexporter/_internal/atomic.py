"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Results are the product; a sweep killed mid-write must not leave a truncated record behind.
Write to a temporary file in the same directory, fsync, then `os.replace` (atomic on POSIX).

A writer killed between the two leaves its temporary file. They are named so that they can be
recognised and told apart: `.{target name}.pdx-{writer pid}-{its start time}-{random}.tmp`, and
`clean_stale` (called by every command that writes results, before it does) removes those whose
writer is no longer running, and the nameless ones (`.{target}.{8 random}.tmp`) that pdexporter
wrote before it named them, once they are an hour old.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from pdexporter._internal.procs import process_start_ticks, same_process
from pdexporter._internal.redact import redact, redact_json

__all__ = [
    "LEGACY_TMP_AGE_S", "LEGACY_TMP_RE", "PRIVATE_MODE", "TMP_RE", "atomic_write_bytes", "atomic_write_json",
    "atomic_write_json_gz", "atomic_write_text", "clean_stale", "is_stale_tmp", "open_private_log", "read_json_gz",
]

TMP_RE = re.compile(r"^\..+\.pdx-(?P<pid>\d+)-(?P<start>\d+|x)-[a-z0-9_]+\.tmp$")
LEGACY_TMP_RE = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")  # mkstemp's names, before they carried the writer
LEGACY_TMP_AGE_S = 3600.0
_writer: tuple[int, str] | None = None  # (pid, "pid-start") of this process, once asked


def _writer_tag() -> str:
    """`{pid}-{start ticks}` of this process (recomputed after a fork)."""
    global _writer
    pid = os.getpid()
    if _writer is None or _writer[0] != pid:
        start = process_start_ticks(pid)
        _writer = (pid, f"{pid}-{'x' if start is None else start}")
    return _writer[1]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Results are the product, shared with a team through the group; not with every user of the
# machine (records name the engine's URL, host and command, secrets redacted): 0640 under the
# usual umask 022, never more open than the umask allows. (mkstemp's 0600 hid them from the group.)
_FILE_MODE = 0o640 & ~_umask()
PRIVATE_MODE = 0o600  # an engine's log: vLLM prints its arguments, an API key among them


def open_private_log(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened to append, created 0600 (and made 0600 if it was not): for engine logs."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.pdx-{_writer_tag()}-", suffix=".tmp", dir=target.parent)
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
    """`text` written atomically, every secret the process holds hidden (`_internal.redact`)."""
    return atomic_write_bytes(path, redact(text).encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> Path:
    """`obj` as JSON, written atomically; secrets the process holds hidden in its strings."""
    return atomic_write_bytes(path, (redact_json(json.dumps(obj, indent=indent, allow_nan=False)) + "\n").encode())


def atomic_write_json_gz(path: str | os.PathLike[str], obj: Any) -> Path:
    raw = redact_json(json.dumps(obj, separators=(",", ":"), allow_nan=False)).encode("utf-8")
    # mtime=0 keeps the bytes reproducible for identical content.
    return atomic_write_bytes(path, gzip.compress(raw, compresslevel=6, mtime=0))


def read_json_gz(path: str | os.PathLike[str]) -> Any:
    with gzip.open(path, "rb") as handle:
        return json.loads(handle.read())


def is_stale_tmp(path: Path, now_s: float | None = None) -> bool:
    """A temporary file of `atomic_write_bytes` whose writer is gone (module docs)."""
    match = TMP_RE.match(path.name)
    if match:
        start = match.group("start")
        return not same_process(int(match.group("pid")), None if start == "x" else int(start))
    if LEGACY_TMP_RE.match(path.name):
        try:
            age = (time.time() if now_s is None else now_s) - path.stat().st_mtime
        except OSError:
            return False
        return age > LEGACY_TMP_AGE_S
    return False


def clean_stale(root: str | os.PathLike[str]) -> list[Path]:
    """Remove the stale temporary files under `root` (module docs); returns what was removed."""
    removed: list[Path] = []
    base = Path(root)
    if not base.is_dir():
        return removed
    for dirpath, _, files in os.walk(base):
        for name in files:
            if name.startswith(".") and name.endswith(".tmp"):
                path = Path(dirpath) / name
                if is_stale_tmp(path):
                    try:
                        path.unlink()
                        removed.append(path)
                    except FileNotFoundError:
                        pass
    return removed
