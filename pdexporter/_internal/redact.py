"""Secrets never reach a file or log pdexporter writes: values of environment variables and of
`NAME=value` words or `--name value` flags whose name looks secret are replaced by `***`; so is
every later occurrence of such a value (`redact_text`: a secret variable substituted into a
command, echoed by an engine), and the user:password of a URL (`redact_url`, in every error line:
`errors.PdexporterError`).

By value: every secret the process holds (an API key, a bearer token read from a file, a URL's
password, a sweep's secret variables) is *remembered* where it is read (`remember_secret`,
`remember_url`), with the forms it travels in (its `user:password` and their Basic base64, URL-
quoted, JSON-escaped); `redact` hides all of them, any URL userinfo, and the value of any
`Authorization` header or `Bearer` token quoted in a text. The edges pass every outward text
through it: each error line (`errors.PdexporterError`), the CLI's stdout and stderr
(`RedactingStream`, installed by `cli.main`), and the files pdexporter writes (`_internal.atomic`).
An engine's 5xx or 404 page that quotes the request's `Authorization` header is printed, recorded
and logged without it."""

from __future__ import annotations

import base64
import json
import re
import shlex
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit

__all__ = [
    "API_KEY_ENV_VARS", "REDACTED", "RedactingStream", "engine_flags", "forget_secrets", "known_secrets", "redact",
    "redact_argv", "redact_env", "redact_json", "redact_text", "redact_url", "remember_argv", "remember_secret",
    "remember_url", "secret_name", "secret_pattern", "secret_values", "shell_words", "without_own_secrets",
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
# A scheme is read from the first character of its run, once (possessive): a long dotted or hyphenated
# run ("a.b.c..." of 90 KB in a text with an "@") was rescanned from every word boundary in it (12 s).
_USERINFO = re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*+://)([^/?#@\s]+)@")


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


# Where pdexporter reads the bearer token it sends to the engine, in this order (`client.resolve_api_key`).
API_KEY_ENV_VARS = ("PDEXPORTER_API_KEY", "OPENAI_API_KEY")


def without_own_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """An environment for a process pdexporter starts (an engine, its leash): pdexporter's own
    secrets (`PDEXPORTER_*` with a secret-looking name: the engine key it sends, its endpoints'
    bearer tokens; and `OPENAI_API_KEY`, read as that key: a user's OpenAI key from their shell has
    no business in a local engine) left out; the rest, the engine's own (HF_TOKEN), passes. An
    engine that needs one is given it in its command (`OPENAI_API_KEY=... vllm serve ...`)."""
    return {k: v for k, v in env.items()
            if not ((k.startswith("PDEXPORTER_") and secret_name(k)) or k in API_KEY_ENV_VARS)}


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
    return redact(text)


# ---------------------------------------------------------------------------------------------
# By value: the secrets this process holds

_KNOWN: set[str] = set()
_KNOWN_LOCK = threading.Lock()
_SHORTEST = 4  # shorter values are left alone: they would hide ordinary words
_WHOLE_WORD_BELOW = 8  # values shorter than this are hidden only as whole words (not inside others)
# The value of an Authorization header, however it is quoted (`Authorization: Basic ...`,
# `"authorization": "Bearer ..."`, `Authorization=Bearer%20...`), and any `Bearer <token>`. A value ends
# where its characters (RFC 6750's b64token, base64, digest's key=value list) cannot go on: a closing
# bracket after it is the text's, not the secret's, and stays.
_AUTH_HEADER = re.compile(
    r"(?i)(\bauthorization\b[\"']?\s*[:=]\s*[\"']?)((?:bearer|basic|token|digest)(?:\s+|%20))?[^\s\"',;}&)\]>]+"
)
_BEARER = re.compile(r"(?i)(\bbearer(?:\s+|%20))[A-Za-z0-9._~+/=:-]{4,}")


_BEARER_PROSE = frozenset({"token", "tokens", "auth", "authentication", "authorization", "scheme", "header",
                           "headers", "credential", "credentials", "is", "or", "and"})


def _hide_bearer(match: re.Match[str]) -> str:
    """A `Bearer <token>`'s token hidden; the words of prose about one ("a bearer token is
    required", "bearer tokens") stay."""
    token = match.group(0)[len(match.group(1)):]
    return match.group(0) if token.lower() in _BEARER_PROSE else f"{match.group(1)}{REDACTED}"


def _forms(value: str) -> set[str]:
    """The ways a secret travels in text: as is, URL-quoted, JSON-escaped (`\\/`), base64."""
    encoded = base64.b64encode(value.encode()).decode()
    forms = {value, quote(value, safe=""), encoded, quote(encoded, safe="")}
    forms |= {form.replace("/", "\\/") for form in forms}  # as a JSON encoder that escapes / writes it
    # a short number would hide ordinary numbers (a P of 2048) and corrupt tables
    return {f for f in forms if len(f) >= _SHORTEST and not (f.isdigit() and len(f) < _WHOLE_WORD_BELOW)}


def remember_secret(value: str | None) -> None:
    """From now on `redact` hides `value` (and its forms) wherever it appears."""
    if value and len(value) >= _SHORTEST:
        with _KNOWN_LOCK:
            _KNOWN.update(_forms(value))


def remember_credentials(user: str, password: str) -> None:
    """A URL's (or a Basic header's) user and password: the password, and `user:password` with
    its base64 (what an `Authorization: Basic` header carries)."""
    remember_secret(password)
    if password:
        remember_secret(f"{user}:{password}")


def remember_url(url: str | None) -> None:
    """Remember the user:password (or bare token) of `url`, if it has one."""
    if not url or "@" not in url:
        return
    try:
        netloc = urlsplit(url.strip()).netloc
    except ValueError:
        netloc = ""
    userinfo, at, _ = netloc.rpartition("@")
    if not at or not userinfo:
        # a '/', '?' or '#' in the password ends urlsplit's host part early: all before the last '@'
        rest = url.strip().partition("://")[2].split(maxsplit=1)
        userinfo, at, _ = (rest[0] if rest else "").rpartition("@")
        if not at or not userinfo:
            return
    user, colon, password = userinfo.partition(":")
    if colon:
        remember_credentials(user, password)
        remember_credentials(unquote(user), unquote(password))
    else:
        remember_secret(user)
        remember_secret(unquote(user))


_NAMES_A_FILE = ("file", "path", "dir")  # `--api-key-file F`: F names where the secret is, and is shown


def shell_words(text: str) -> list[str]:
    """`text` split as a shell would (`shlex`); at spaces where a quote is left open (what is
    remembered or hidden must not depend on the command being well formed)."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def remember_argv(argv: Sequence[str]) -> None:
    """What a command line holds: URLs' userinfo, and the values of secret-looking flags (not
    of those naming a file that holds a secret: the file's name is not the secret)."""
    words = list(argv)
    for word in words:
        for match in _USERINFO.finditer(word):
            remember_url(word[match.start():])
        if " " in word.strip():  # a command line given as one option's value (`--engine-command "vllm ..."`)
            inner = shell_words(word)
            if len(inner) > 1:
                remember_argv(inner)
    kept = [w for i, w in enumerate(words)
            if not _names_a_file(w) and not (i > 0 and _names_a_file(words[i - 1]) and "=" not in words[i - 1])]
    for value in secret_values(argv=kept):
        remember_secret(value)


def _names_a_file(word: str) -> bool:
    return word.startswith("--") and word[2:].partition("=")[0].lower().endswith(_NAMES_A_FILE)


def known_secrets() -> tuple[str, ...]:
    with _KNOWN_LOCK:
        return tuple(_KNOWN)


def forget_secrets() -> None:
    """For tests: forget what was remembered."""
    with _KNOWN_LOCK:
        _KNOWN.clear()


def _whole_word_only(secret: str) -> bool:
    """A value shorter than `_WHOLE_WORD_BELOW`, or all digits, is hidden only as a whole word."""
    return len(secret) < _WHOLE_WORD_BELOW or secret.isdigit()


def secret_pattern(secret: str) -> str:
    """The regular expression that finds `secret` where `redact` hides it: anywhere, or only as a
    whole word (`_whole_word_only`); encoded, it finds it in bytes too (an engine's log)."""
    escaped = re.escape(secret)
    return rf"(?<![A-Za-z0-9]){escaped}(?![A-Za-z0-9])" if _whole_word_only(secret) else escaped


def _hide_known(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if secret not in text:
            continue
        if _whole_word_only(secret):
            text = re.sub(secret_pattern(secret), REDACTED, text)
        else:
            text = text.replace(secret, REDACTED)  # the common case, without a regular expression
    return text


# A word cut short where a service shows the start of a key and masks the rest
# (`sk-proj-AbC1************wxyz`, `hf_AbCdEf...`, `abc123…`).
# Whole runs only, never backtracking into one (a possessive quantifier, from its first character): a
# long base64 run without a mask after it (a report's embedded image) is read once, not once per start.
_CUT_SHORT = re.compile(r"(?<![A-Za-z0-9_+/-])[A-Za-z0-9_+/-]{6,}+(?=\*{2,}|\.{3}|\u2026)")
_CUT_MARKS = ("**", "...", "\u2026")
_SHORTEST_CUT = 6  # the shortest start of a known secret hidden where it is cut short


def _hide_cut_short(text: str, secrets: Iterable[str]) -> str:
    """The start of a known secret (6+ characters) cut short by a mask or an ellipsis: an engine's
    or a proxy's error page that quotes the key it was sent as `sk-abc123...` or `sk-abc1****wxyz`."""
    if not any(mark in text for mark in _CUT_MARKS):
        return text
    whole = [s for s in secrets if len(s) > _SHORTEST_CUT]

    def hide(match: re.Match[str]) -> str:
        word = match.group(0)
        return REDACTED if any(s.startswith(word) for s in whole) else word

    return _CUT_SHORT.sub(hide, text)


def redact(text: str, extra: Sequence[str] = ()) -> str:
    """`text` with every secret the process holds (module docs), the start of one cut short by a
    mask or an ellipsis, `extra` values, URL userinfo and quoted Authorization values replaced by
    `***`."""
    if not text:
        return text
    known = known_secrets()
    if known or extra:
        secrets = {*known, *(s for s in extra if s and len(s) >= _SHORTEST)}
        text = _hide_cut_short(_hide_known(text, secrets), secrets)
    if "@" in text:
        text = redact_url(text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{REDACTED}", text)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(_hide_bearer, text)
    return text


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


_HINTS = ("@", "uthorization", "UTHORIZATION", "earer", "EARER")  # what `redact` acts on, in any case used


def _might_hold_secret(text: str) -> bool:
    """Cheap (`in` scans, no copy): whether `redact` could change `text`; 8 MB in a few ms."""
    return any(s in text for s in known_secrets()) or any(h in text for h in _HINTS)


def redact_json(text: str) -> str:
    """JSON text with `redact` applied to its strings only (a number that happens to equal a
    secret stays a number: the file stays JSON)."""
    if not _might_hold_secret(text):
        return text

    def one(match: re.Match[str]) -> str:
        value = json.loads(match.group(0))
        hidden = redact(value)
        return match.group(0) if hidden == value else json.dumps(hidden)

    return _JSON_STRING.sub(one, text)


class RedactingStream:
    """A text stream (stdout, stderr) whose writes go through `redact` first; the rest is the
    stream's own (isatty, fileno, encoding: a terminal stays a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @property
    def wrapped(self) -> TextIO:
        return self._stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


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
