"""Where the suite's CPU goes, per test: a pytest plugin and its summary (issue 32: the suite in ten minutes
on 2 cores beside a CPU burner is a budget of CPU-seconds, not of wall time per test).

    PDX_CPU_USAGE_DIR=/tmp/cpu python -m pytest -p tests.cpu_usage -n 2 -p no:benchmark -m "not realtime"
    python -m tests.cpu_usage /tmp/cpu            # totals, by area, the largest tests

Each test's CPU is this process's (`RUSAGE_SELF`) and that of the subprocesses it reaped (`RUSAGE_CHILDREN`:
engines, CLI runs, Prometheus), measured around the whole test, setup and teardown included (a module
fixture's cost lands on the module's first test, its teardown's on the last). A subprocess left running or not
waited for is not counted. Each worker (pytest-xdist) writes its own file into `PDX_CPU_USAGE_DIR` (an empty
folder: the summary reads every usage file there); without it the plugin records nothing. Session 38's whole
parallel pass: 756 CPU-s (docs/status.md, "Noticed, not done").
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Generator, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

ENV = "PDX_CPU_USAGE_DIR"


class Usage(NamedTuple):
    test: str  # pytest's node id
    self_s: float  # this process's CPU
    children_s: float  # the reaped subprocesses'
    wall_s: float

    @property
    def cpu_s(self) -> float:
        return self.self_s + self.children_s


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


_rows: list[Usage] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    if not os.environ.get(ENV):
        yield
        return
    (own0, kids0), wall0 = _cpu(), time.perf_counter()
    yield
    own1, kids1 = _cpu()
    _rows.append(Usage(item.nodeid, own1 - own0, kids1 - kids0, time.perf_counter() - wall0))


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = os.environ.get(ENV)
    if folder and _rows:
        Path(folder).mkdir(parents=True, exist_ok=True)
        out = Path(folder) / f"usage-{os.getpid()}.jsonl"
        out.write_text("".join(json.dumps(r._asdict()) + "\n" for r in _rows), encoding="utf-8")


def area(test: str) -> str:
    """tests/integration/faults/x.py::t -> tests/integration/faults; tests/unit/a/b.py::t -> tests/unit."""
    parts = test.split("::")[0].split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] == "integration" else "/".join(parts[:2])


def load(folder: Path) -> list[Usage]:
    rows = []
    for path in sorted(folder.glob("usage-*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                rows.append(Usage(**json.loads(line)))
            except (TypeError, ValueError) as exc:
                raise SystemExit(f"{path}:{n}: not a usage row ({exc})") from None
    return rows


def summary(rows: Sequence[Usage], top: int = 25) -> str:
    """Totals, CPU by area, and the `top` tests by CPU, as text."""
    by_area: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        by_area[area(r.test)] += r.cpu_s
    own, kids = sum(r.self_s for r in rows), sum(r.children_s for r in rows)
    lines = [f"{len(rows)} tests: {own + kids:.0f} CPU-s (in-process {own:.0f}, subprocesses {kids:.0f}), "
             f"{sum(r.wall_s for r in rows):.0f} s of wall summed", "", "by area (CPU-s):"]
    lines += [f"  {v:7.1f}  {k}" for k, v in sorted(by_area.items(), key=lambda kv: -kv[1])]
    lines += ["", f"the {top} largest tests (CPU-s = in-process + subprocesses; wall):"]
    for r in sorted(rows, key=lambda r: -r.cpu_s)[:top]:
        lines.append(f"  {r.cpu_s:6.1f} = {r.self_s:5.1f} + {r.children_s:5.1f}  {r.wall_s:5.1f} s  {r.test}")
    return "\n".join(lines)


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(f"usage: python -m tests.cpu_usage DIR  (DIR: the {ENV} of a run)", file=sys.stderr)
        return 2
    rows = load(Path(args[0]))
    if not rows:
        print(f"{args[0]}: no usage-*.jsonl rows (run pytest with -p tests.cpu_usage and {ENV} set)", file=sys.stderr)
        return 1
    print(summary(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
