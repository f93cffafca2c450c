"""Children die with their parent (issue 13): `run`, `measure` and a real-clock `sweep` killed with
SIGKILL must not leave their engine listening, and a local-launcher engine goes with the sweep that
owns it unless that sweep released it on purpose (then a later sweep adopts it).

Real processes throughout: the CLI in a child process, the embedded engine (`pdexporter sim
serve`) as its engine, `kill -9`, and /proc to see what is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdexporter.launch.local import STATE_FILE, EngineState
from tests.helpers import alive, children_of, cli_env, free_port, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
START_S = 90.0  # an engine's start on a loaded 2-core machine


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pdexporter", *args], cwd=cwd, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _listening(pid: int) -> bool:
    """The process has a listening TCP socket (its engine port)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    return True
    return False


def _engine_child(parent: subprocess.Popen[bytes]) -> int:
    """The parent's `sim serve` child, once it listens."""
    found: list[int] = []

    def serving() -> bool:
        assert parent.poll() is None, parent.stderr.read().decode() if parent.stderr else parent.returncode
        found[:] = [c for c in children_of(parent.pid) if _listening(c)]
        return bool(found)

    assert wait_until(serving, START_S), "the engine child never listened"
    return found[0]


def _kill9_and_check(parent: subprocess.Popen[bytes], engine: int) -> None:
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    assert wait_until(lambda: not alive(engine), 15), f"engine pid {engine} outlived its parent's SIGKILL"


def test_run_killed_takes_its_embedded_engine_with_it(tmp_path: Path) -> None:
    parent = _cli("run", "--decode-batch-size", "1", "--inject-every", "off", "--listen", f"127.0.0.1:{free_port()}")
    try:
        _kill9_and_check(parent, _engine_child(parent))
    finally:
        parent.kill()


def test_measure_killed_takes_its_embedded_engine_with_it(tmp_path: Path) -> None:
    parent = _cli("measure", "-B", "2048", "-D", "1", "-P", "256", "--reps", "200", "--out", str(tmp_path))
    try:
        _kill9_and_check(parent, _engine_child(parent))
    finally:
        parent.kill()


def test_real_clock_sweep_killed_takes_its_embedded_engine_with_it(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(textwrap.dedent(f"""\
        grid: {{chunk_sizes: [2048], decode_batch_sizes: [1], new_prefill_tokens: [256]}}
        reps: 200
        output: {tmp_path / 'results'}
        launcher: {{kind: sim, clock: real}}
    """))
    parent = _cli("sweep", str(sweep))
    try:
        _kill9_and_check(parent, _engine_child(parent))
    finally:
        parent.kill()


def _local_sweep(tmp_path: Path, port: int, **extra: str) -> Path:
    sweep = tmp_path / "local.yaml"
    lines = [
        "grid: {chunk_sizes: [2048], decode_batch_sizes: [1], new_prefill_tokens: [256]}",
        "reps: 200",
        f"output: {tmp_path / 'results'}",
        "launcher:",
        "  kind: local",
        f"  command: '{{python}} -m pdexporter sim serve --port {port} --max-num-batched-tokens {{chunk}}'",
        f"  url: http://127.0.0.1:{port}",
        "  stop_timeout_s: 5",
        f"  env: {{PYTHONPATH: '{ROOT}'}}",
    ] + [f"{k}: {v}" for k, v in extra.items()]
    sweep.write_text("\n".join(lines) + "\n")
    return sweep


def _state(tmp_path: Path) -> EngineState:
    path = tmp_path / "results" / "2048" / "engine" / STATE_FILE
    found: list[EngineState] = []

    def written() -> bool:
        state = EngineState.read(path)
        found[:] = [state] if state is not None and _listening(state.pid) else []
        return bool(found)

    assert wait_until(written, START_S), f"no live engine in {path}"
    return found[0]


def _port_closed(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_local_launcher_engine_goes_with_a_sweep_killed_with_sigkill(tmp_path: Path) -> None:
    port = free_port()
    parent = _cli("sweep", str(_local_sweep(tmp_path, port)))
    try:
        state = _state(tmp_path)
        assert state.leash_pid is not None and state.leash_pid in children_of(parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_until(lambda: not alive(state.pid), 20), "the engine outlived its sweep's SIGKILL"
        assert wait_until(lambda: not alive(state.leash_pid or 0), 10)
        assert wait_until(lambda: _port_closed(port), 10)
        log = (tmp_path / "results" / "2048" / "engine" / "engine.log").read_text()
        assert "its owner is gone without releasing engine pid" in log
    finally:
        parent.kill()


def test_a_released_engine_is_adopted_and_then_goes_with_its_new_owner(tmp_path: Path) -> None:
    """A sweep stopped at its deadline releases the engine (kept on purpose); the next sweep adopts
    it, and when that one is killed with SIGKILL the engine goes with it."""
    port = free_port()
    sweep = _local_sweep(tmp_path, port)
    first = subprocess.run([sys.executable, "-m", "pdexporter", "sweep", str(sweep), "--deadline", "25",  # noqa: PLW1510
                            "--reps", "200"], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert first.returncode == 5, first.stderr  # stopped at the deadline
    state = _state(tmp_path)
    assert alive(state.pid), "a released engine must stay for the next run"
    second = _cli("sweep", str(sweep))
    try:
        assert wait_until(lambda: b"adopted by a new owner" in _peek_log(tmp_path), START_S), _peek_log(tmp_path)[
            -2000:
        ]
        assert EngineState.read(tmp_path / "results" / "2048" / "engine" / STATE_FILE).pid == state.pid  # type: ignore[union-attr]
        time.sleep(1.0)
        os.kill(second.pid, signal.SIGKILL)
        second.wait(10)
        assert wait_until(lambda: not alive(state.pid), 20), "the adopted engine outlived its new owner's SIGKILL"
        assert wait_until(lambda: _port_closed(port), 10)
    finally:
        second.kill()
        if alive(state.pid):
            os.killpg(state.pid, signal.SIGKILL)


def _peek_log(tmp_path: Path) -> bytes:
    try:
        return (tmp_path / "results" / "2048" / "engine" / "engine.log").read_bytes()
    except OSError:
        return b""


def test_the_leash_killed_with_sigkill_takes_the_engine_with_it(tmp_path: Path) -> None:
    port = free_port()
    parent = _cli("sweep", str(_local_sweep(tmp_path, port)))
    try:
        state = _state(tmp_path)
        assert state.leash_pid is not None
        os.kill(state.leash_pid, signal.SIGKILL)  # the kernel's parent-death signal stops the engine
        assert wait_until(lambda: not alive(state.pid), 20), "the engine outlived its leash"
    finally:
        parent.kill()
        parent.wait(10)
