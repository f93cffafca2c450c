"""Secrets never reach a file or log pdexporter writes: values of environment variables and of
`NAME=value` words or `--name value` flags whose name looks secret are replaced by `***`; so is
every later occurrence of such a value (`redact_text`: a secret variable substituted into a
command, echoed by an engine), and the user:password of a URL (`redact_url`, in every error line:
`errors.PdexporterError`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "REDACTED", "engine_flags", "redact_argv", "redact_env", "redact_text", "redact_url", "secret_name",
    "secret_values",
]

REDACTED = "***"
# A name is secret when one of its words (split at `-`, `_`, `.` and camel case) is one of these,
# or holds `cred`, `secret`, `passw`, or starts or ends with `key` or ends with `token` (DB_CREDS,
# HFTOKEN, apiKeys, MY_SECRET_X). "tokens" (a count, as in --max-num-batched-tokens) and the
# tokenizer are not tokens.
_SECRET_WORDS = frozenset({"key", "keys", "apikey", "token", "secret", "password", "passwd", "pwd", "auth",
                           "authorization", "credential", "credentials", "creds", "cred", "pat", "bearer",
                           "passphrase", "sig", "signature"})
_SECRET_PARTS = ("cred", "secret", "passw")
_NOT_SECRET = frozenset({"tokens", "tokenizer", "tokenizers", "tokenization", "keyword", "keywords"})
_ASSIGN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#@\s]+)@")


def secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[-_.\s]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]
    for w in words:
        if w in _NOT_SECRET:
            continue
        if w in _SECRET_WORDS or any(part in w for part in _SECRET_PARTS):
            return True
        if w.startswith("key") or w.endswith(("key", "keys", "token")):
            return True
    return False


def redact_url(text: str) -> str:
    """`https://user:pass@host/...` -> `https://user:***@host/...` (the user named, as Grafana's
    messages do), and `https://token@host` -> `https://***@host` (a bare userinfo is often a
    token), wherever a URL appears in `text`."""
    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user}:{REDACTED}@" if colon else f"{match.group(1)}{REDACTED}@"

    return _USERINFO.sub(hide, text)


def secret_values(*, variables: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                  argv: Iterable[str] = ()) -> list[str]:
    """The values that came from a secret-looking name: variables, environment, `--flag value`,
    `--flag=value` and `NAME=value` words."""
    found = [str(v) for k, v in {**(variables or {}), **(env or {})}.items() if secret_name(k) and v]
    words = list(argv)
    for i, word in enumerate(words):
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if secret_name(name):
                if eq and value:
                    found.append(value)
                elif not eq and i + 1 < len(words) and not words[i + 1].startswith("--"):
                    found.append(words[i + 1])
        else:
            match = _ASSIGN.match(word)
            if match and secret_name(match["name"]) and match["value"]:
                found.append(match["value"])
    return found


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if secret_name(k) and v else v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """`API_KEY=x` -> `API_KEY=***`, `--api-key x` and `--api-key=x` -> `***`; the rest unchanged."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if secret_name(name):
                if eq:
                    out.append(f"--{name}={REDACTED}")
                else:
                    out.append(word)
                    hide_next = True
                continue
            out.append(word)
            continue
        match = _ASSIGN.match(word)
        if match and secret_name(match["name"]):
            out.append(f"{match['name']}={REDACTED}")
        else:
            out.append(word)
    return out


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """Remove known secret values (tokens the process holds) from free text, and URL userinfo.
    Values shorter than 4 characters are left alone (they would hide ordinary words)."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return redact_url(text)


def engine_flags(argv: Sequence[str]) -> dict[str, str]:
    """`--name value`, `--name=value` and bare `--flag` (-> "true") of a command line."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if eq:
                flags[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[name] = argv[i + 1]
                i += 1
            else:
                flags[name] = "true"
        i += 1
    return flags
