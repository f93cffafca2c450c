"""Shared fixtures: paths to the real vLLM 0.22 captures, free ports, results dirs."""

from __future__ import annotations

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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's `--dist loadgroup` (scripts/test.sh): the tests of a module that
    shares a module-scoped fixture (an engine, a Prometheus, a recorded exporter session) run on
    one worker, so that fixture is set up once; every other test goes wherever a worker is free."""
    if not getattr(config.option, "loadgroup", False):  # xdist sets it on its workers for --dist loadgroup
        return
    tests_dir = Path(__file__).parent
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group") is not None:
            continue
        for defs in info.name2fixturedefs.values():
            if any(d.scope in ("module", "class", "package") and tests_dir in Path(d.func.__code__.co_filename).parents
                   for d in defs):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
                break


@pytest.fixture(autouse=True)
def _secrets_forgotten():  # type: ignore[no-untyped-def]
    """Each test starts with no remembered secret: a test that runs the CLI in-process registers its
    tokens process-wide (`_internal.redact`), and a later test on the same worker would see them
    hidden in its own text (a token "wrong" turned a tmp path's `test_a_wrong_field` into `***`)."""
    from pdexporter._internal.redact import forget_secrets

    forget_secrets()
    yield
    forget_secrets()
