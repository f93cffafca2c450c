"""One-line messages for pydantic validation errors: `field.path[i]: what is wrong (got value)`.

Shared by every file pdexporter reads (sweep files, records, profiles) so a user sees the same
shape of message whatever they got wrong. Discriminated unions (a sweep's `launcher`, tagged by
`kind`) are named through `unions` so the message shows the field, not pydantic's tag path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

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
        return list(current.model_fields)
    return None


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
    if kind in _WHAT:
        what = _WHAT[kind]
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op, key = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
                   "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}[kind]
        what = f"must be {op} {ctx.get(key)}"
    elif kind == "extra_forbidden":
        allowed = _fields_at(model, loc, unions)
        what = "unknown field" + (f" (expected one of: {', '.join(allowed)})" if allowed else "")
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


def describe_error(error: Mapping[str, Any]) -> str:
    """What is wrong in one pydantic error, without its field or value (`must be >= 1`)."""
    return _describe(error, BaseModel, {})[1]


def format_validation_error(exc: ValidationError, model: type[BaseModel], unions: Unions | None = None) -> str:
    """The first error as `field.path[i]: what is wrong (got value)`."""
    where, what, got, whole = _describe(exc.errors(include_url=False)[0], model, unions or {})
    if whole:
        return what
    return f"{where}: {what}{got}" if where else f"{what}{got}"


def format_option_error(exc: ValidationError, model: type[BaseModel], options: Mapping[str, str]) -> str:
    """The first error as a command-line user sees it: `--option value: what is wrong`, the field
    named by its flag (`options`: field -> flag; others become --field-name)."""
    error = exc.errors(include_url=False)[0]
    where, what, _, whole = _describe(error, model, {})
    if whole or not where:
        return what
    option = options.get(where, "--" + where.replace("_", "-").replace(".", "-"))
    return f"{option} {error.get('input')!r}: {what}"
