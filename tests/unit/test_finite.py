"""`_internal.finite.first_not_finite`: its C-speed check of lists (and flat dicts) of plain numbers
finds exactly what the item-by-item walk it replaced found (the same value at the same path, or nothing)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pdexporter._internal.atomic import read_json_gz
from pdexporter._internal.finite import MAX_INT_DIGITS, NotFinite, _Bad, _path, first_not_finite

RESULTS = Path(__file__).resolve().parents[2] / "results"


def walk_every_item(value: Any, where: str = "") -> NotFinite | None:
    """first_not_finite as it was: every item of every list looked at in Python."""
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        at, item = stack.pop()
        if isinstance(item, _Bad):
            return NotFinite(at, item.text, item.too_large)
        if isinstance(item, float) and not math.isfinite(item):
            return NotFinite(at, repr(item))
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 10**MAX_INT_DIGITS:
            return NotFinite(at, f"an integer of {len(str(abs(item)))} digits", too_large=True)
        if isinstance(item, dict):
            stack.extend((_path(at, k), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, (list, tuple)):
            stack.extend((_path(at, i), v) for i, v in reversed(list(enumerate(item))))
    return None


def same(a: NotFinite | None, b: NotFinite | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and (a.where, a.text, a.too_large) == (b.where, b.text, b.too_large))


LIMIT = 10**MAX_INT_DIGITS
numbers = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**19),
    st.integers(min_value=LIMIT - 3, max_value=LIMIT + 3), st.integers(min_value=-LIMIT - 3, max_value=-LIMIT + 3),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=1e307, max_value=1.7e308),
    st.booleans(), st.sampled_from([_Bad("1e999", too_large=True), _Bad("NaN")]),
)
documents = st.recursive(
    st.one_of(numbers, st.text(max_size=3), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=8), st.lists(numbers, max_size=12),
                            st.tuples(inner, inner), st.dictionaries(st.text(max_size=3), inner, max_size=5),
                            st.dictionaries(st.text(max_size=3), numbers, max_size=8)),  # a /metrics snapshot
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(documents)
def test_the_fast_check_finds_what_the_walk_found(doc: Any) -> None:
    assert same(first_not_finite(doc), walk_every_item(doc))


def test_lists_of_numbers_that_only_look_fine_are_walked() -> None:
    cases: list[Any] = [
        [1, 2, LIMIT], [1.0, -LIMIT, 3], [1e308, 1e308, math.nan], [1e308, 1e308],  # a sum past 1e308: fine
        [1, float("inf"), float("-inf")], [3, True, LIMIT], [2**1100, 1.0], [0.5, 10**400],
    ]
    found = [first_not_finite({"probes": [{"t": c}]}) for c in cases]
    assert [str(f) if f else None for f in found] == [str(w) if w else None for w in map(
        lambda c: walk_every_item({"probes": [{"t": c}]}), cases)]
    assert [f is not None for f in found] == [True, True, True, False, True, True, True, True]
    assert found[0] is not None and found[0].where == "probes[0].t[2]" and found[0].too_large


def test_committed_raw_files_are_clean_and_a_nan_put_in_one_is_found_where_it_is() -> None:
    paths = sorted((RESULTS / "h200-vllm0.22-qwen3-coder-30b-a3b").rglob("*.json.gz"))[:40]
    assert len(paths) == 40
    for path in paths:
        raw = read_json_gz(path)
        assert first_not_finite(raw) is None
        probes = [p for p in raw.get("probes", []) if any(isinstance(v, list) and len(v) > 3 for v in p.values())]
        if not probes:
            continue
        key = next(k for k, v in probes[-1].items() if isinstance(v, list) and len(v) > 3)
        probes[-1][key][3] = math.nan
        got, want = first_not_finite(raw), walk_every_item(raw)
        assert got is not None and same(got, want) and got.where.endswith(f".{key}[3]"), (got, want)
