"""One-line messages for pydantic validation errors: `field.path[i]: what is wrong (got value)`.

Shared by every file pdexporter reads (sweep files, records, profiles) so a user sees the same
shape of message whatever they got wrong. Discriminated unions (a sweep's `launcher`, tagged by
`kind`) are named through `unions` so the message shows the field, not pydantic's tag path.

A misspelt key is named as such: an unknown field is reported before the field it leaves
missing, with the closest allowed name (`grid.decode_batch_size: unknown field (did you mean
decode_batch_sizes?)`), and where unknown keys are allowed (records) a missing field names the
key that looks like it (`... required field is missing; found decode_batch_sizes (a typo?)`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = [
    "Unions", "close_match", "describe_error", "flag_error", "format_option_error", "format_validation_error",
]

Unions = Mapping[str, Mapping[str, type[BaseModel]]]  # field name -> tag -> model


def _loc_text(loc: tuple[Any, ...], unions: Unions) -> str:
    out = ""
    parts = list(loc)
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        # Discriminated unions put the tag in the location ("launcher.local.url"): drop it.
        if i > 0 and part in unions.get(str(parts[i - 1]), {}):
            continue
        if "[" in str(part) or "function-after" in str(part):
            continue
        out += ("." if out else "") + str(part)
    return out


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...], unions: Unions) -> list[str] | None:
    """Allowed field names of the model that `loc` (minus its last part) points into."""
    current: Any = model
    previous: Any = None
    for part in loc[:-1]:
        if previous is not None and part in unions.get(str(previous), {}):
            current = unions[str(previous)][part]
        elif isinstance(current, type) and issubclass(current, BaseModel) and str(part) in current.model_fields:
            current = current.model_fields[str(part)].annotation
        elif not isinstance(part, int):
            return None
        previous = part
    if isinstance(current, type) and issubclass(current, BaseModel):
        names = list(current.model_fields)
        names += [f.alias for f in current.model_fields.values() if f.alias and f.alias not in names]
        return names
    return None


def close_match(name: str, allowed: Sequence[str]) -> str | None:
    """The allowed name `name` most likely misspells (difflib), if any is close enough."""
    matches = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _first(errors: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The error to report: an unknown field first (a misspelt key also leaves its intended field
    missing, and the unknown one is the cause), else pydantic's first."""
    for error in errors:
        if error.get("type") == "extra_forbidden":
            return error
    return errors[0]


_WHAT = {
    "missing": "required field is missing",
    "int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be an integer",
    "int_parsing_size": "is far too large",
    "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "string_type": "must be a string", "list_type": "must be a list", "dict_type": "must be a mapping",
}


def _describe(error: Mapping[str, Any], model: type[BaseModel], unions: Unions) -> tuple[str, str, str, bool]:
    """(where, what, got, whole): the field path, what is wrong, the value shown; `whole` when
    `what` is already the whole message (a model-level or list check naming its own field)."""
    loc = tuple(error.get("loc", ()))
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    value = error.get("input")
    where = _loc_text(loc, unions)
    got = f" (got {value!r:.60})" if kind not in ("missing", "extra_forbidden") and not isinstance(value, dict) else ""
    if kind == "missing":
        what = _WHAT[kind] + _lookalike(loc, value, model, unions)
    elif kind in _WHAT:
        what = _WHAT[kind]
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op, key = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
                   "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}[kind]
        what = f"must be {op} {ctx.get(key)}"
    elif kind == "extra_forbidden":
        allowed = _fields_at(model, loc, unions) or []
        match = close_match(str(loc[-1]), allowed) if loc else None
        what = "unknown field" + (f" (did you mean {match}?)" if match
                                  else f" (expected one of: {', '.join(allowed)})" if allowed else "")
    elif kind == "literal_error":
        what = f"must be one of {ctx.get('expected')}"
    elif kind == "union_tag_invalid":
        where = f"{where}.kind" if where else "kind"
        what = f"must be one of {ctx.get('expected_tags')}"
        got = f" (got {ctx.get('tag')!r})"
    elif kind == "union_tag_not_found":
        tags = unions.get(where.split(".")[-1] if where else "", {})
        where = f"{where}.kind" if where else "kind"
        what = "required field is missing" + (f" ({', '.join(tags)})" if tags else "")
        got = ""
    elif kind == "too_short":
        what = f"must have at least {ctx.get('min_length')} item(s)"
    elif kind == "value_error":
        what = str(error.get("msg", "")).removeprefix("Value error, ")
        # Model-level checks name their own field ("grid.chunk_sizes: ..."); list checks "[i] = v".
        if what.startswith("[") and where:
            head, _, rest = what.partition(" ")
            return where, f"{where}{head} {rest}", "", True
        if not where or ":" in what.split(" ")[0]:
            return where, what, "", True
        got = ""
    else:
        what = str(error.get("msg", kind))
    return where, what, got, False


def _lookalike(loc: tuple[Any, ...], given: Any, model: type[BaseModel], unions: Unions) -> str:
    """For a missing field: the given key that looks like a misspelling of it (models that allow
    unknown keys, such as records, never report the misspelt one themselves)."""
    if not loc or not isinstance(given, Mapping):
        return ""
    allowed = set(_fields_at(model, loc, unions) or [])
    strangers = [str(k) for k in given if str(k) not in allowed]
    match = close_match(str(loc[-1]), strangers)
    return f"; found {match} (a typo?)" if match else ""


def describe_error(error: Mapping[str, Any]) -> str:
    """What is wrong in one pydantic error, without its field or value (`must be >= 1`)."""
    return _describe(error, BaseModel, {})[1]


def format_validation_error(exc: ValidationError, model: type[BaseModel], unions: Unions | None = None) -> str:
    """The error to report (an unknown field first) as `field.path[i]: what is wrong (got value)`."""
    where, what, got, whole = _describe(_first(exc.errors(include_url=False)), model, unions or {})
    if whole:
        return what
    return f"{where}: {what}{got}" if where else f"{what}{got}"


def flag_error(exc: ValidationError, model: type[BaseModel], flags: Mapping[str, str],
               unions: Unions | None = None) -> str | None:
    """The error as the command line's, when the field it names was set by a flag (`flags`: dotted
    field path -> flag): `--mode 'turbo': must be one of ...`; None when the file is to blame."""
    error = _first(exc.errors(include_url=False))
    where, what, _, whole = _describe(error, model, unions or {})
    if whole:  # a model-level check naming its own field: "listen: ..."
        head, sep, rest = what.partition(": ")
        if not sep or head not in flags:
            return None
        where, what = head, rest
        value: Any = None
    else:
        value = error.get("input")
    for path in sorted(flags, key=len, reverse=True):
        if where == path or where.startswith((path + ".", path + "[")):
            if what.startswith(flags[path] + " "):  # the check named the flag itself
                return what
            shown = f" {value!r}" if value is not None and not isinstance(value, Mapping) else ""
            if error.get("type") == "extra_forbidden":  # e.g. --clock with a file whose launcher has none
                parent, _, name = where.rpartition(".")
                return f"{flags[path]}{shown}: the file's {parent or 'settings'} has no {name}"
            return f"{flags[path]}{shown}: {what}"
    return None


def format_option_error(exc: ValidationError, model: type[BaseModel], options: Mapping[str, str]) -> str:
    """The first error as a command-line user sees it: `--option value: what is wrong`, the field
    named by its flag (`options`: field -> flag; others become --field-name)."""
    error = _first(exc.errors(include_url=False))
    where, what, _, whole = _describe(error, model, {})
    if whole or not where:
        return what
    option = options.get(where, "--" + where.replace("_", "-").replace(".", "-"))
    return f"{option} {error.get('input')!r}: {what}"
