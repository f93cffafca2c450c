"""An http(s) URL a user gives (`--target`, `--grafana-url`, `--prometheus`) checked before anything
connects to it: one line naming the option, the URL shown without its user:password, never an HTTP
library's traceback (aiohttp's `InvalidUrlClientError`) that quotes the password."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pdexporter._internal.redact import REDACTED, redact_url, remember_url
from pdexporter.errors import ConfigError

__all__ = ["check_http_url"]


def check_http_url(url: str, flag: str) -> None:
    """One `ConfigError` naming `flag` when `url` is not an http:// or https:// URL with a host (and
    a port, if any, that is a number); its password is remembered first (`_internal.redact`)."""
    remember_url(url)
    scheme, sep, rest = url.partition("://")
    head = re.split(r"[/?#]", rest, maxsplit=1)[0] if sep else ""  # where urlsplit ends the host part
    if sep and "@" in rest and "@" not in head:
        # a '/', '?' or '#' inside the user:password ends the host part early: hide all before the last '@'
        shown = f"{scheme}://{REDACTED}@{rest.rpartition('@')[2]}"
        raise ConfigError(f"{flag} {shown!r}: the user:password holds a '/', '?' or '#'; percent-encode them "
                          "(%2F, %3F, %23)")
    shown = redact_url(url)
    if scheme.lower() not in ("http", "https") or not sep:
        raise ConfigError(f"{flag} {shown!r}: expected an http:// or https:// URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as exc:
        raise ConfigError(f"{flag} {shown!r}: not a valid URL ({redact_url(str(exc))})") from None
    if not parts.hostname:
        raise ConfigError(f"{flag} {shown!r}: no host")
