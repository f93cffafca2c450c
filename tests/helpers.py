"""Helpers shared by tests (importable as `tests.helpers`)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]


def gpu_script(name: str):  # type: ignore[no-untyped-def]
    """scripts/gpu/NAME.py (run on the GPU machine, not a package module) loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_dry_run(tmp_path: Path, script: str, sweep: str, reps: int, **env: str) -> subprocess.CompletedProcess[str]:
    """scripts/gpu/SCRIPT's dry run (SIM=1: the embedded engine, virtual time) with a 120-s deadline, on a copy of
    sweeps/SWEEP cut from its committed `reps: REPS` to 2 repetitions; OUT and R under `tmp_path`, `env` on top.
    Asserts the run succeeded (its output's tails on failure) and returns it."""
    text = (REPO / "sweeps" / sweep).read_text()
    assert f"\nreps: {reps}\n" in text, f"sweeps/{sweep} no longer has {reps} repetitions"
    short = tmp_path / sweep
    short.write_text(text.replace(f"\nreps: {reps}\n", "\nreps: 2\n"))
    full = {**os.environ, "SIM": "1", "OUT": str(tmp_path / "out"), "R": str(tmp_path / "r"), "SWEEP": str(short),
            **env}
    proc = subprocess.run(["bash", f"scripts/gpu/{script}", "120"], cwd=REPO, env=full, capture_output=True,
                          text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "complete: 6 of 6 configurations" in proc.stdout
    return proc


def _listen_ports() -> range:
    """Where a test's server may listen: below the kernel's ephemeral range (Linux: 32768-60999), from which every
    client connection of the tests running beside it takes its own port. A port the kernel hands out as free
    (bind to 0) lies inside that range, so between the check and the server's bind another worker's connection
    could take it (a sweep's second engine once found 127.0.0.1:49376 in use: test_multi_gpu_sweep)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(20000, max(min(low, 32768), 21000))


def free_ports(n: int = 1) -> int:
    """A port p with p .. p + n - 1 free (each bound and released: best effort), chosen at random outside the
    kernel's ephemeral range (`_listen_ports`)."""
    ports, pick = _listen_ports(), random.SystemRandom()  # not `random`: forked workers share its state
    for _ in range(200):
        base = pick.randrange(ports.start, ports.stop - n)
        held: list[socket.socket] = []
        try:
            for i in range(n):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", base + i))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise RuntimeError(f"no {n} free ports side by side in {ports}")


def free_port() -> int:
    """A free port for a test's server (`free_ports`)."""
    return free_ports(1)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def seed_record_example() -> dict[str, Any]:
    """The seed's "Per-Run Record" example, verbatim (a fresh copy each call)."""
    return json.loads((FIXTURES / "seed" / "per-run-record.json").read_text())


def children_of(pid: int) -> list[int]:
    """Direct children of a process (Linux: /proc/PID/task/*/children)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                out += [int(c) for c in handle.read().split()]
    except OSError:
        pass
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout_s: float, step_s: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    """Poll `predicate` until it holds (True) or `timeout_s` passed (False)."""
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


async def until(predicate: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.05) -> None:
    """Await until `predicate` holds, polling every `step_s`; fails the test naming `what` after `timeout_s`."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(step_s)


def cli_env() -> dict[str, str]:
    """The environment for `python -m pdexporter` children: this checkout first on the path."""
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """`pdexporter ARGV` in this process: (exit code, stdout, stderr) as pytest's capsys caught them."""
    from pdexporter.cli import main

    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_here(capsys, monkeypatch, *, columns: int | None = None,  # type: ignore[no-untyped-def]
             cwd: Path = REPO) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A runner of `pdexporter ARGS` in this process (`cli.main`, what `python -m pdexporter` calls)
    that returns what the finished process would have: its exit code, stdout and stderr, as a
    `subprocess.CompletedProcess`. In `cwd` (`run(..., cwd=DIR)` for one command); `columns`: the
    width a child given `COLUMNS` would print at (`cli._common.console` is made at import, before
    COLUMNS is set here). For tests of what a command says and writes, not of its process: a
    second of CPU less than a child (the interpreter, numpy, pydantic, aiohttp are not loaded again)."""
    if columns is not None:
        from pdexporter.cli._common import console

        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.setattr(console, "width", columns)

    def run(*args: str, cwd: Path = cwd) -> subprocess.CompletedProcess[str]:
        monkeypatch.chdir(cwd)
        code, out, err = run_cli(capsys, *args)
        return subprocess.CompletedProcess(["pdexporter", *args], code, out, err)

    return run


def cli_command(*words: str) -> Any:
    """The click command `pdexporter WORDS` (e.g. "sim", "serve") as `pdexporter` builds it
    (`cli.command_app`), or None where this checkout has no such command: looked up in the command
    tree, not by starting an interpreter (a second of CPU each)."""
    import typer.main

    from pdexporter.cli import COMMANDS, command_app

    if words[0] not in COMMANDS:
        return None
    found: Any = typer.main.get_command(command_app(words[0]))
    for word in words:
        found = getattr(found, "commands", {}).get(word)
    return found


class ExpireAfterFirstConfig:
    """A sweep deadline clock (`Deadline(clock=...)`): far from the deadline until the first record
    exists, then past it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self) -> float:
        return 2e6 if any(self.root.glob("*/D*_P*.json")) else 0.0
