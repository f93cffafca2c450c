"""The start gate (`launch.overlap`): put on an engine's PYTHONPATH, it holds every Python process
of that engine at its first CUDA initialisation until the gate file exists.

An engine started early for the next chunk size does its CPU-side start-up (imports, argument and
model-config parsing, tokenizer, the engine-core process) while the current engine still serves,
and touches the GPU only once the launcher has stopped that engine and created the file named by
`PDEXPORTER_GATE`. The hold is at `torch.cuda._lazy_init`, the one function through which PyTorch
creates a process's CUDA context (Python callers and C++'s `device_lazy_init` alike), so nothing
of the GPU (memory, context, kernels) is used while the gate is closed. Without the variable this
module does nothing; it imports nothing of pdexporter (it runs inside the engine's Python), and it
hands over to the `sitecustomize` it shadows, if the environment has one.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

__all__ = ["GATE_ENV", "wait_gate"]

GATE_ENV = "PDEXPORTER_GATE"
_POLL_S = 0.05


def wait_gate(where: str = "") -> float:
    """Block until the gate file (`$PDEXPORTER_GATE`) exists; the seconds waited (0.0 without a
    gate or with it open). Says on stderr (the engine's log) where it waited and for how long."""
    gate = os.environ.get(GATE_ENV)
    if not gate or os.path.exists(gate):
        return 0.0
    t0 = time.monotonic()
    sys.stderr.write(f"pdexporter gate: pid {os.getpid()} holds {where or 'its start'} until {gate} exists\n")
    sys.stderr.flush()
    while not os.path.exists(gate):
        time.sleep(_POLL_S)
    waited = time.monotonic() - t0
    sys.stderr.write(f"pdexporter gate: pid {os.getpid()} opened after {waited:.1f} s\n")
    sys.stderr.flush()
    return waited


def _caller() -> str:
    """The first frame outside torch: where the engine asked for CUDA."""
    frame = sys._getframe(2)
    while frame is not None and f"{os.sep}torch{os.sep}" in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _gate_module(module: Any) -> None:
    inner = module._lazy_init

    def _lazy_init() -> None:
        if not module.is_initialized():
            wait_gate(f"CUDA initialisation (from {_caller()})")
        inner()

    module._lazy_init = _lazy_init
    # torch.cuda's own submodules (memory, random, graphs, ...) bound the original by name
    prefix = f"{module.__name__}."
    for name, sub in list(sys.modules.items()):
        if name.startswith(prefix) and getattr(sub, "_lazy_init", None) is inner:
            setattr(sub, "_lazy_init", _lazy_init)  # noqa: B010 - a module of torch, typed as ModuleType


def _install() -> None:
    import importlib.abc
    import importlib.machinery

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != "torch.cuda":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            loader, run = spec.loader, spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                _gate_module(module)

            loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Finder())


def _chain() -> None:
    """Run the `sitecustomize` this one shadows (a distribution's), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # Python's start-up, not `pdexporter._internal.gate` importing it
    if os.environ.get(GATE_ENV) and "torch.cuda" not in sys.modules:
        _install()
    try:
        _chain()
    except Exception as exc:  # noqa: BLE001 - a broken distribution hook must not stop the engine
        sys.stderr.write(f"pdexporter gate: the shadowed sitecustomize failed: {exc}\n")
