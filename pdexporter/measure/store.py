"""Where results live on disk, written atomically so that a killed run loses at most itself.

    results/
      {chunk}/D{d}_P{p}.json               the record (seed format + extras), rewritten per rep
      {chunk}/raw/D{d}_P{p}_r{k}.json.gz   raw timestamps of repetition k
      {chunk}/raw/D{d}_baseline.json.gz    raw timestamps of Phase 1 for (chunk, D)
      {chunk}/engine/                      engine logs and iteration lines (launchers)
      window.json                          the window settings of `measure` / `run` (a sweep's are in sweep.json)

A record is rewritten only after its repetition's raw file is safely on disk, so a record never
points at a missing file, and a rerun resumes from the repetitions already recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pdexporter import __version__
from pdexporter._internal.atomic import atomic_write_json, atomic_write_json_gz, clean_stale, read_json_gz
from pdexporter._internal.finite import NotFinite, loads_finite, not_finite_problem
from pdexporter._internal.text import read_utf8
from pdexporter._internal.validation import format_validation_error
from pdexporter.errors import RecordError
from pdexporter.measure.records import RECORD_SCHEMA, RunRecord

__all__ = [
    "RECORD_RE", "WINDOW_FILE", "ResultsStore", "check_schema", "load_record_file",
]

RECORD_RE = re.compile(r"^D(?P<d>\d+)_P(?P<p>\d+)\.json$")
WINDOW_FILE = "window.json"


class ResultsStore:
    def __init__(self, root: str | Path, *, cache_records: bool = False) -> None:
        """`cache_records`: keep every record this store read or wrote in memory and answer later
        reads from there (a sweep reads a record several times per repetition, and is the only
        writer of its results directory while it runs)."""
        self.root = Path(root)
        self._records: dict[Path, RunRecord] | None = {} if cache_records else None

    def cached(self) -> ResultsStore:
        """This store with `cache_records` on (itself when it already has it)."""
        return self if self._records is not None else ResultsStore(self.root, cache_records=True)

    def clean_stale(self) -> list[Path]:
        """Remove temporary files that killed writers left (`_internal.atomic.clean_stale`)."""
        return clean_stale(self.root)

    def chunk_dir(self, chunk_size: int) -> Path:
        return self.root / str(chunk_size)

    def record_path(self, chunk_size: int, d: int, p: int) -> Path:
        return self.chunk_dir(chunk_size) / f"D{d}_P{p}.json"

    def raw_path(self, chunk_size: int, d: int, p: int, rep: int) -> Path:
        return self.chunk_dir(chunk_size) / "raw" / f"D{d}_P{p}_r{rep}.json.gz"

    def baseline_raw_path(self, chunk_size: int, d: int) -> Path:
        return self.chunk_dir(chunk_size) / "raw" / f"D{d}_baseline.json.gz"

    def engine_dir(self, chunk_size: int) -> Path:
        return self.chunk_dir(chunk_size) / "engine"

    def relative(self, chunk_size: int, path: Path) -> str:
        """A path as records store it: relative to the chunk directory."""
        return path.relative_to(self.chunk_dir(chunk_size)).as_posix()

    def save_window(self, fields: Mapping[str, float]) -> Path:
        """Keep the window settings this directory's records are derived with (`window.json`: what
        `reanalyse` re-derives them with, so a later default cannot change them silently). Written once;
        a run with other settings is refused in one line naming the file, the field and both values."""
        path = self.root / WINDOW_FILE
        held = self.load_window()
        if held is None:
            atomic_write_json(path, {"pdexporter_version": __version__, "window": dict(fields)})
            return path
        for name, value in fields.items():
            if name in held and held[name] != value:
                raise RecordError(f"{path}: window.{name} is {held[name]!r} there, this run's is {value!r}: its "
                                  "records were derived with the file's settings (write to another --out)")
        return path

    def load_window(self) -> dict[str, float] | None:
        """The window settings `window.json` holds (None: no such file); a file that does not read is one
        line naming it."""
        path = self.root / WINDOW_FILE
        if not path.is_file():
            return None
        try:
            data = loads_finite(read_utf8(path, RecordError))
            window = data["window"]
            if not isinstance(window, dict) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in window.values()):
                raise TypeError("window: expected an object of numbers")
        except (NotFinite, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise RecordError(f"{path}: not a window settings file ({type(exc).__name__}: {exc})") from None
        return window

    def save_record(self, record: RunRecord) -> Path:
        c = record.config
        path = self.record_path(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens)
        atomic_write_json(path, record.model_dump(mode="json"))
        if self._records is not None:
            self._records[path] = record
        return path

    def save_raw(self, path: Path, payload: dict[str, Any]) -> Path:
        return atomic_write_json_gz(path, payload)

    def load_raw(self, path: Path) -> dict[str, Any]:
        try:
            raw = read_json_gz(path)
        except (OSError, ValueError, EOFError) as exc:
            raise RecordError(f"{path}: unreadable raw timestamps ({exc})") from exc
        if not isinstance(raw, dict):  # a list at the top was an AttributeError in whoever read it
            raise RecordError(f"{path}: not raw timestamps (a JSON object at the top; got a {type(raw).__name__})")
        problem = not_finite_problem(raw)
        if problem:
            raise RecordError(f"{path}: {problem}")
        return raw

    def load_record(self, chunk_size: int, d: int, p: int) -> RunRecord | None:
        path = self.record_path(chunk_size, d, p)
        if self._records is not None and path in self._records:
            return self._records[path]
        if not path.exists():
            return None
        record = load_record_file(path)
        if self._records is not None:
            self._records[path] = record
        return record

    def iter_record_paths(self) -> Iterator[Path]:
        if not self.root.is_dir():
            return
        for chunk_dir in sorted(self.root.iterdir(), key=lambda p: (not p.name.isdigit(), p.name)):
            if chunk_dir.is_dir() and chunk_dir.name.isdigit():
                for path in sorted(chunk_dir.iterdir()):
                    if RECORD_RE.match(path.name):
                        yield path

    def iter_records(self) -> Iterator[RunRecord]:
        for path in self.iter_record_paths():
            yield load_record_file(path)


def load_record_file(path: str | Path) -> RunRecord:
    """Read and validate one record; any problem is one line naming the file and field."""
    path = Path(path)
    text = read_utf8(path, RecordError)
    try:
        data = loads_finite(text)  # no NaN, inf or 5000-digit number
    except NotFinite as exc:
        raise RecordError(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    check_schema(data, path)
    try:
        record = RunRecord.model_validate(data)
    except ValidationError as exc:
        raise RecordError(f"{path}: {format_validation_error(exc, RunRecord)}") from exc
    _check_named(record, path)
    return record


def _check_named(record: RunRecord, path: Path) -> None:
    """A record at `{chunk}/D{d}_P{p}.json` is that configuration's (the bad-input audit: a record
    whose config said D = 7 in D1_P512.json was tabulated as D = 7), and holds a repetition."""
    match = RECORD_RE.match(path.name)
    c = record.config
    if match and path.parent.name.isdigit():
        named = {"chunk_size": int(path.parent.name), "decode_batch_size": int(match["d"]),
                 "new_prefill_tokens": int(match["p"])}
        for field, value in named.items():
            if getattr(c, field) != value:
                raise RecordError(f"{path}: config.{field} is {getattr(c, field)}, but the file's place says {value}")
    if not record.reps:
        raise RecordError(f"{path}: reps: empty (a record holds the repetitions it was made of)")


def check_schema(data: Any, path: str | Path) -> None:
    """Refuse a record written by a later pdexporter (`records.RECORD_SCHEMA`), in one line naming
    the file and both versions: read, it would be rewritten without the keys this one does not
    know (issue 24: such records were read silently and rewritten without them)."""
    if not isinstance(data, dict):
        return
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise RecordError(f"{path}: schema_version: expected a whole number, got {version!r}")
    if version > RECORD_SCHEMA:
        written = (data.get("provenance") or {}).get("pdexporter_version") if isinstance(
            data.get("provenance"), dict) else None
        by = f" by pdexporter {written}" if written else ""
        raise RecordError(f"{path}: written{by} with record schema {version}; pdexporter {__version__} reads schema "
                          f"{RECORD_SCHEMA} and older: upgrade pdexporter to read or extend it")
