"""Secrets read from files and the environment (`_internal.secretfile`; issue 24): one line of text,
a final line break dropped, a bounded read of a regular file, and every problem one line naming
the option and the file (never the value, never a traceback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pdexporter.client.client import resolve_api_key
from pdexporter.errors import ConfigError


@pytest.mark.parametrize("content", [b"sk-abc\n", b"sk-abc\r\n", b"sk-abc", b"  sk-abc \n"])
def test_one_final_line_break_and_spaces_are_dropped(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    assert resolve_api_key(path) == "sk-abc"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"sk-abc\r\nsk-def\r\n", "more than one line"),  # the audit's CR/LF file: a 103-line traceback
        (b"sk-abc\nsk-def", "more than one line"),
        (b"sk-\rabc", "more than one line"),
        (b"sk-\x00abc", "holds a control character"),
        (b"\n", "empty"),
        (b"\xff\xfe", "not UTF-8 text"),
        (b"x" * 70_000, "larger than 64 KiB"),
    ],
)
def test_bad_key_files_are_one_line_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"^--api-key-file {path}: {message}") as info:
        resolve_api_key(path)
    assert "\n" not in str(info.value) and "sk-" not in str(info.value)


def test_dev_zero_and_fifos_are_refused_without_reading_them(tmp_path: Path) -> None:
    """`--api-key-file /dev/zero` read for ever (the audit); a FIFO would block."""
    with pytest.raises(ConfigError, match="^--api-key-file /dev/zero: not a regular file$"):
        resolve_api_key("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file$"):
        resolve_api_key(fifo)
    with pytest.raises(ConfigError, match="no such file$"):
        resolve_api_key(tmp_path / "missing")


def test_a_token_typed_where_its_file_goes_is_not_echoed() -> None:
    """`--api-key-file sk-...` (the secrets audit): the value names no file and is likely the key."""
    with pytest.raises(ConfigError) as info:
        resolve_api_key("sk-AUDIT-TYPO-4d5e6f")
    assert str(info.value).startswith("--api-key-file: no such file (the value given is not shown")
    assert "sk-AUDIT" not in str(info.value)


def test_a_symlinked_secret_file_is_read(tmp_path: Path) -> None:
    """A Kubernetes Secret's mounted file is a symlink into `..data/`."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "key").write_text("sk-abc\n")
    (tmp_path / "key").symlink_to(tmp_path / "data" / "key")
    assert resolve_api_key(tmp_path / "key") == "sk-abc"


def test_environment_keys_follow_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("PDEXPORTER_API_KEY", "sk-abc\n")
    assert resolve_api_key() == "sk-abc"
    monkeypatch.setenv("PDEXPORTER_API_KEY", "sk-abc\r\nX-Injected: 1")
    with pytest.raises(ConfigError, match=r"^\$PDEXPORTER_API_KEY: more than one line"):
        resolve_api_key()
