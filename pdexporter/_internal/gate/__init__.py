"""The start gate's hook (`sitecustomize.py` here) and where it lives. The directory goes first on
an engine's PYTHONPATH (`hook_dir`); see `sitecustomize` for what it does."""

from __future__ import annotations

from pathlib import Path

from pdexporter._internal.gate.sitecustomize import GATE_ENV, wait_gate

__all__ = ["GATE_ENV", "hook_dir", "wait_gate"]


def hook_dir() -> Path:
    """The directory to put first on an engine's PYTHONPATH."""
    return Path(__file__).resolve().parent
