"""Options and plumbing shared by the commands (target selection, async entry, output)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from pdexporter.engine.client import resolve_api_key
from pdexporter.launch import ExternalLauncher, Launcher, SimLauncher

T = TypeVar("T")

DEFAULT_PROFILE = "h200-qwen3-coder-30b-a3b"

console = Console(stderr=True)

TargetOpt = Annotated[
    str | None,
    typer.Option("--target", help="Base URL of an OpenAI-compatible engine (vLLM). Default: the embedded engine."),
]
ApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option("--api-key-file", help="File holding the bearer token (else $PDEXPORTER_API_KEY or $OPENAI_API_KEY)."),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Served model name (default: the engine's first).")]
ProfileOpt = Annotated[
    str,
    typer.Option("--profile", help="Embedded engine's GPU/model profile (when no --target)."),
]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU name to record for an external engine.")]


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make_launcher(target: str | None, *, chunk_size: int | None, profile: str, gpu: str | None = None,
                  log_dir: Path | None = None) -> Launcher:
    """`--target URL` means an external engine at that chunk size; none means the embedded one."""
    if target:
        return ExternalLauncher(url=target, chunk_size=chunk_size, gpu=gpu)
    return SimLauncher(profile=profile, log_dir=log_dir)


def api_key(api_key_file: Path | None) -> str | None:
    return resolve_api_key(api_key_file)
