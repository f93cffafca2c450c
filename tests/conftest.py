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
