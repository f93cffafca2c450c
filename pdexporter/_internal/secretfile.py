"""Secrets pdexporter reads (the engine's API key, the bearer tokens of the exporter's own
endpoints): one line of text, from a bounded regular file or an environment variable.

A file is opened once, checked to be a regular file (a Kubernetes Secret's mounted file is one,
behind its symlinks; `/dev/zero` or a FIFO is not, and would hang or fill memory) and read up to
`MAX_SECRET_BYTES`. One final line break (`\\n` or `\\r\\n`, as editors and `echo` leave it) and
surrounding spaces are dropped; a line break or control character inside is refused, since the
value goes into an HTTP header. Every problem is one line naming the option and the file, never
the value.
"""

from __future__ import annotations

import os
import stat

from pdexporter._internal.redact import remember_secret
from pdexporter.errors import ConfigError

__all__ = ["MAX_SECRET_BYTES", "read_secret_file", "secret_text"]

MAX_SECRET_BYTES = 64 * 1024  # far above any API key or bearer token; a misnamed file is refused, not read


def secret_text(text: str, where: str) -> str:
    """The secret in `text` (module docs); `where` names its origin in an error ("--api-key-file F")."""
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    text = text.strip(" \t")
    if not text:
        raise ConfigError(f"{where}: empty")
    if "\n" in text or "\r" in text:
        raise ConfigError(
            f"{where}: more than one line (a token is one line; only a final line break is dropped)"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ConfigError(f"{where}: holds a control character (a token goes into an HTTP header)")
    remember_secret(text)  # never printed, logged or written from now on (`_internal.redact`)
    return text


def _looks_like_a_path(value: str) -> bool:
    """A file's name has a folder or an extension; a token (`sk-...`, `hf_...`) has neither."""
    return "/" in value or os.sep in value or "." in value


def read_secret_file(path: str | os.PathLike[str], flag: str) -> str:
    """The secret in the regular file `path`; one line naming `flag` and the file when it cannot be."""
    where = f"{flag} {os.fspath(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        if not _looks_like_a_path(os.fspath(path)):  # the token itself, typed where its file goes
            remember_secret(os.fspath(path))
            raise ConfigError(f"{flag}: no such file (the value given is not shown: it names no file and may be "
                              "the secret itself; give the path of a file that holds it)") from None
        raise ConfigError(f"{where}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{where}: not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SECRET_BYTES:
            chunk = os.read(fd, MAX_SECRET_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_SECRET_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_SECRET_BYTES // 1024} KiB, not a token")
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    return secret_text(text, where)
