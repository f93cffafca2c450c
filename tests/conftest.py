"""Shared fixtures: paths to the real vLLM 0.22 captures, free ports, results dirs."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import free_port

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_FIXTURES = FIXTURES / "vllm-0.22"


@pytest.fixture
def vllm_metrics_text() -> str:
    return (VLLM_FIXTURES / "metrics.txt").read_text()


@pytest.fixture
def vllm_sse_bytes() -> bytes:
    return (VLLM_FIXTURES / "sse-completions.txt").read_bytes()


@pytest.fixture
def port() -> int:
    return free_port()


# Under pytest-xdist's `--dist loadgroup` (scripts/test.sh), the tests that share one instance of a
# module-, class- or package-scoped fixture of this suite (an engine, a Prometheus, a recorded exporter
# session, the re-analysis of one results directory) run on one worker, so that instance is made once;
# every other test goes wherever a worker is free. xdist's own channel for groups (an `xdist_group`
# mark that a worker appends to the test's node id) does nothing since pytest 9.2 made node ids
# structured (pytest-xdist issue 1386): every test of such a module went to any worker, and the
# fixture was made again for nearly every test (h200-vllm0.22's re-analysis, ~25 s, three times). So
# the workers write each test's group into a folder the controller names (PDX_XDIST_GROUPS), and the
# controller's scheduler reads it once every worker has collected.
_GROUPS_ENV = "PDX_XDIST_GROUPS"
_SHARED_SCOPES = ("module", "class", "package")


def _shared_instance(item: pytest.Item, tests_dir: Path) -> str | None:
    """The group of the tests that share `item`'s instances of this suite's wide-scoped fixtures: its
    module, and the parameters of those fixtures (one group per parameter of a parametrized one)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = [name for name, defs in info.name2fixturedefs.items()
              if defs[-1].scope in _SHARED_SCOPES and tests_dir in Path(defs[-1].func.__code__.co_filename).parents]
    if not shared:
        return None
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    params = [f"{name}={indices[name]}" for name in sorted(shared) if name in indices]
    return "@".join([item.nodeid.split("::")[0], *params])


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    if not config.getoption("numprocesses", None):
        return
    folder = tempfile.mkdtemp(prefix="pdx-xdist-groups-")
    os.environ[_GROUPS_ENV] = folder  # the workers, started after this, inherit it
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(trylast=True)  # after the fixtures' own reordering: the groups of the final items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = os.environ.get(_GROUPS_ENV)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if not folder or not worker or not getattr(config.option, "loadgroup", False):
        return
    tests_dir = Path(__file__).parent
    groups = {item.nodeid: group for item in items if (group := _shared_instance(item, tests_dir))}
    # The order the scheduler hands the work out in (every worker sorts alike, so their collections
    # still agree): as collected, but the units holding a test marked `slow` spread evenly over the
    # first 60 % of the run. Last, one would end the run late; all at the start, four CPU-heavy units
    # at once on a loaded 2-core machine ran each past its 300 s timeout.
    unit = {item.nodeid: groups.get(item.nodeid, item.nodeid) for item in items}
    slow = {unit[item.nodeid] for item in items if item.get_closest_marker("slow") is not None}
    units = list(dict.fromkeys(unit[item.nodeid] for item in items))
    rest = [u for u in units if u not in slow]
    position = {u: float(k) for k, u in enumerate(rest)}
    every = 0.6 * len(rest) / max(1, len(slow))
    position.update({u: j * every - 0.5 for j, u in enumerate(u for u in units if u in slow)})
    items.sort(key=lambda item: position[unit[item.nodeid]])
    path = Path(folder) / f"{worker}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups))
    path.with_suffix(".tmp").replace(path)  # whole, before the worker reports its collection


def pytest_collection_finish(session: pytest.Session) -> None:
    """With PDX_LIST_TESTS=FILE, the selected tests' ids go to FILE (one a line): scripts/test.sh's
    warm-up collection (`-m realtime`) hands them to the realtime pass, which then imports only
    their modules instead of collecting the whole suite again."""
    listing = os.environ.get("PDX_LIST_TESTS")
    if listing:
        Path(listing).write_text("".join(f"{item.nodeid}\n" for item in session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    folder = os.environ.get(_GROUPS_ENV)
    if config.getoption("dist", "no") != "loadgroup" or not folder:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureScheduling(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # schedule() asks once every worker has sent its collection
                files = sorted(Path(folder).glob("*.json"))
                self.groups = json.loads(files[0].read_text()) if files else {}
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # the workers' collection is in the order wanted (above), not by size
    return SharedFixtureScheduling(config, log)


@pytest.fixture(autouse=True)
def _secrets_forgotten():  # type: ignore[no-untyped-def]
    """Each test starts with no remembered secret: a test that runs the CLI in-process registers its
    tokens process-wide (`_internal.redact`), and a later test on the same worker would see them
    hidden in its own text (a token "wrong" turned a tmp path's `test_a_wrong_field` into `***`)."""
    from pdexporter._internal.redact import forget_secrets

    forget_secrets()
    yield
    forget_secrets()
