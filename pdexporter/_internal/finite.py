"""JSON and YAML numbers as pdexporter writes them: finite, and of a size a number can have.

Python's `json` reads `NaN`, `Infinity` and `1e999` (as inf) and integers of 4,300 digits; YAML
reads `.nan` and `.inf`. pdexporter never writes any of them (`_internal.atomic` refuses NaN), so
a file that holds one was edited or corrupted, and a table, a fit or a verdict built on it is a
58-78-line traceback or, worse, a verdict (issue 31: a `decision.json` with NaN coefficients was
"decided"). `loads_finite` reads JSON and `first_not_finite` finds such a value in anything
already read; both name where it is (`reps[0].baseline.tpot_p50_ms`), for the one-line error the
caller makes of it with the file's name.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = [
    "MAX_INT_DIGITS", "NotFinite", "YamlProblem", "first_not_finite", "load_yaml_strict", "loads_finite",
    "not_finite_problem",
]

MAX_INT_DIGITS = 30  # far above a nanosecond timestamp (19 digits); a float beyond 1e308 is inf


class NotFinite(ValueError):
    """A number that is not finite, or too large; `where` is its path in the document."""

    def __init__(self, where: str, text: str, too_large: bool = False) -> None:
        self.where, self.text, self.too_large = where, text, too_large
        what = "too large a number" if too_large else "not a finite number"
        super().__init__(f"{where or 'the document'}: {text}: {what}")


class _Bad:
    """What the JSON parser returns for a number refused (its text kept, for the message)."""

    __slots__ = ("text", "too_large")

    def __init__(self, text: str, too_large: bool = False) -> None:
        self.text, self.too_large = text, too_large


def _float(text: str) -> float | _Bad:
    value = float(text)
    return value if math.isfinite(value) else _Bad(text, too_large=True)


def _int(text: str) -> int | _Bad:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_INT_DIGITS else _Bad(f"{text[:12]}... ({digits} digits)", too_large=True)


def _path(where: str, key: object) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else str(key))


_INT_LIMIT = 10**MAX_INT_DIGITS
_NUMBER_TYPES = frozenset({int, float})
_INTS = {int}


def _all_numbers_fine(items: list[Any] | tuple[Any, ...]) -> bool:
    """Every item a finite float or an int of fewer than `MAX_INT_DIGITS` digits, checked in C
    (a raw file's lists of timestamps): False also when unsure, and the items are walked one by one."""
    if not items:
        return False
    kinds = set(map(type, items))
    if kinds == _INTS:  # timestamps: only their size to check
        return max(items) < _INT_LIMIT and min(items) > -_INT_LIMIT
    if not kinds <= _NUMBER_TYPES:
        return False
    try:  # a NaN or an infinity makes the sum one (and a sum past 1e308 is walked item by item)
        return math.isfinite(sum(items)) and max(items) < _INT_LIMIT and min(items) > -_INT_LIMIT
    except (OverflowError, ValueError):  # an int too large for a float
        return False


def _at(node: Any) -> str:
    """The path of a node of `first_not_finite`'s walk: its (parent, key) chain, formatted only
    for the value it reports (a raw file has ~150 keys a repetition: formatting each cost more
    than the check)."""
    keys = []
    while isinstance(node, tuple):
        node, key = node
        keys.append(key)
    at = node
    for key in reversed(keys):
        at = _path(at, key)
    return at


def _bad_number(item: Any, node: Any) -> NotFinite | None:
    """`item` as `first_not_finite` judges a leaf (a subclass of int or float included)."""
    if isinstance(item, _Bad):
        return NotFinite(_at(node), item.text, item.too_large)
    if isinstance(item, float) and not math.isfinite(item):
        return NotFinite(_at(node), repr(item))
    if isinstance(item, int) and not isinstance(item, bool) and abs(item) >= _INT_LIMIT:
        return NotFinite(_at(node), f"an integer of {len(str(abs(item)))} digits", too_large=True)
    return None


def first_not_finite(value: Any, where: str = "") -> NotFinite | None:
    """The first number in `value` (dicts, lists, numbers) that is NaN, infinite or too large."""
    stack: list[tuple[Any, Any]] = [(where, value)]
    while stack:
        node, item = stack.pop()
        kind = type(item)
        if kind is dict:
            if not _all_numbers_fine(list(item.values())):  # a flat dict of fine numbers: a /metrics snapshot
                stack.extend(((node, k), v) for k, v in reversed(list(item.items())))
        elif kind is list or kind is tuple:
            if not _all_numbers_fine(item):
                stack.extend(((node, i), v) for i, v in reversed(list(enumerate(item))))
        elif kind is str or item is None:
            continue
        else:
            bad = _bad_number(item, node)
            if bad is not None:
                return bad
            if isinstance(item, dict):  # a subclass: walked as above, by the one rule
                stack.append((node, dict(item)))
            elif isinstance(item, (list, tuple)):
                stack.append((node, list(item)))
    return None


def not_finite_problem(value: Any) -> str | None:
    """`first_not_finite` as the text of a one-line error, or None."""
    bad = first_not_finite(value)
    return None if bad is None else str(bad)


def loads_finite(text: str | bytes) -> Any:
    """`json.loads`, refusing NaN, Infinity, floats past 1e308 and integers past
    `MAX_INT_DIGITS` digits: `NotFinite` naming where (`json.JSONDecodeError` as usual)."""
    data = json.loads(text, parse_constant=_Bad, parse_float=_float, parse_int=_int)
    bad = first_not_finite(data)
    if bad is not None:
        raise bad
    return data


class YamlProblem(ValueError):
    """A YAML document pdexporter refuses: `line` (1-based) and what is wrong there."""

    def __init__(self, line: int, text: str) -> None:
        self.line, self.text = line, text
        super().__init__(f"line {line}: {text}")


def _strict_loader() -> type:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice (YAML keeps the last one, silently), a
        number that is not finite (`.nan`, `.inf`) and an integer past `MAX_INT_DIGITS` digits
        (a 5000-digit P was a traceback from Python's int)."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise YamlProblem(line, f"key {key!r} given twice (first at line {seen[key]}); "
                                            "YAML would keep only the last")
                if isinstance(key, (str, int, float, bool)):
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            digits = len(str(node.value).lstrip("+-").replace("_", ""))
            if digits > MAX_INT_DIGITS:
                raise YamlProblem(node.start_mark.line + 1, f"a number of {digits} digits: too large")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: Any) -> Any:
            value = super().construct_yaml_float(node)
            if not math.isfinite(value):
                raise YamlProblem(node.start_mark.line + 1, f"{node.value}: not a finite number")
            return value

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)
    return StrictLoader


def load_yaml_strict(text: str) -> Any:
    """`yaml.safe_load`, refusing duplicate keys, non-finite numbers and integers too long to be
    numbers (`YamlProblem`, naming the line; `yaml.YAMLError` as usual)."""
    import yaml

    return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
