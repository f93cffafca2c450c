"""Secrets never reach a file or log pdexporter writes: values of environment variables and of
`NAME=value` words or `--name value` flags whose name looks secret are replaced by `***`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "REDACTED", "engine_flags", "redact_argv", "redact_env", "redact_text", "secret_name",
]

REDACTED = "***"
# Words of a name (split at `-`, `_`, and camel case) that make it secret; "tokens" (a count, as in
# --max-num-batched-tokens) is not "token".
_SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "auth", "authorization",
                           "credential", "credentials", "pat", "bearer"})
_ASSIGN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)


def secret_name(name: str) -> bool:
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().replace("-", "_").split("_")
    return any(w in _SECRET_WORDS for w in words)


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
    """Remove known secret values (tokens the process holds) from free text."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


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
