"""The local launcher on real processes: start, health wait, log, stop, adoption by a later
invocation, and the failure paths. The "engine" is Python's own `http.server` serving a file
named `health` (so GET /health answers 200): launcher mechanics do not need a model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdexporter.errors import EngineError, EngineTimeout
from pdexporter.launch.base import pid_alive
from pdexporter.launch.local import LOG_FILE, STATE_FILE, EngineState, LocalLauncher, render_command
from pdexporter.measure.store import ResultsStore
from tests.helpers import free_port

pytestmark = pytest.mark.integration




@pytest.fixture
def served(tmp_path: Path) -> Path:
    for chunk in (2048, 4096):
        (tmp_path / "www" / str(chunk)).mkdir(parents=True)
        (tmp_path / "www" / str(chunk) / "health").write_text("")
    return tmp_path / "www"


def launcher(store: ResultsStore, served: Path, port: int, **kw: object) -> LocalLauncher:
    command = f"{{python}} -m http.server {port} --bind 127.0.0.1 --directory {served}/{{chunk}}"
    return LocalLauncher(command=command, store=store, url=f"http://127.0.0.1:{port}", health_timeout_s=20,
                         stop_timeout_s=5, **kw)  # type: ignore[arg-type]


async def test_start_adopt_switch_and_stop(tmp_path: Path, served: Path) -> None:
    store, port = ResultsStore(tmp_path / "results"), free_port()
    first = launcher(store, served, port)
    handle = await first.start(2048)
    state = EngineState.read(store.engine_dir(2048) / STATE_FILE)
    assert state is not None and state.chunk_size == 2048 and pid_alive(state.pid)
    assert handle.iteration_log == store.engine_dir(2048) / LOG_FILE and handle.iteration_log.is_file()
    first.release()  # the invocation ends (e.g. at its deadline) and leaves the engine running

    second = launcher(store, served, port)
    messages: list[str] = []
    second.on_message = messages.append
    await second.start(2048)
    assert second.adopted and any("adopting" in m for m in messages)
    assert EngineState.read(store.engine_dir(2048) / STATE_FILE).pid == state.pid  # type: ignore[union-attr]

    await second.start(4096)  # another chunk size: the old engine goes, a new one starts
    assert not pid_alive(state.pid) and not (store.engine_dir(2048) / STATE_FILE).exists()
    new_state = EngineState.read(store.engine_dir(4096) / STATE_FILE)
    assert new_state is not None and new_state.pid != state.pid and not second.adopted
    await second.stop()
    assert not pid_alive(new_state.pid) and not (store.engine_dir(4096) / STATE_FILE).exists()


async def test_a_log_showing_larger_steps_prevents_adoption(tmp_path: Path, served: Path) -> None:
    store, port = ResultsStore(tmp_path / "results"), free_port()
    first = launcher(store, served, port)
    await first.start(2048)
    pid = EngineState.read(store.engine_dir(2048) / STATE_FILE).pid  # type: ignore[union-attr]
    with (store.engine_dir(2048) / LOG_FILE).open("a") as log:
        log.write("Iteration(7): 1 context requests, 8188 context tokens, 4 generation requests, "
                  "4 generation tokens, iteration elapsed time: 2.40 ms\n")
    first.release()
    second = launcher(store, served, port)
    await second.start(2048)
    assert not second.adopted and not pid_alive(pid)
    await second.stop()


async def test_engine_exiting_during_startup_is_one_line(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    command = "{python} -c \"import sys; print('CUDA out of memory'); sys.exit(3)\" {chunk}"
    bad = LocalLauncher(command=command, store=store, url=f"http://127.0.0.1:{free_port()}", health_timeout_s=20)
    with pytest.raises(EngineError, match="engine exited during start-up .*CUDA out of memory"):
        await bad.start(2048)
    assert not (store.engine_dir(2048) / STATE_FILE).exists()
    assert "CUDA out of memory" in (store.engine_dir(2048) / LOG_FILE).read_text()


async def test_health_timeout_stops_the_process_group(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    # A parent that never serves, with a child in the same group: both must go.
    command = ("{python} -c \"import subprocess, sys, time; "
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)\" {chunk}")
    slow = LocalLauncher(command=command, store=store, url=f"http://127.0.0.1:{free_port()}", health_timeout_s=1.5,
                         stop_timeout_s=2)
    with pytest.raises(EngineTimeout, match="not healthy .* within 1.5 s"):
        await slow.start(2048)
    import subprocess

    out = subprocess.run(["pgrep", "-f", "time.sleep\\(60\\)"], capture_output=True, text=True)
    assert out.stdout.strip() == ""


async def test_a_foreign_engine_on_the_url_is_refused(tmp_path: Path, served: Path) -> None:
    store, port = ResultsStore(tmp_path / "results"), free_port()
    other = launcher(ResultsStore(tmp_path / "elsewhere"), served, port)
    await other.start(2048)
    try:
        with pytest.raises(EngineError, match="already answers /health but this sweep did not start it"):
            await launcher(store, served, port).start(2048)
    finally:
        await other.stop()


def test_render_command() -> None:
    r = render_command("A=1 B='x y' {python} -m vllm serve {model} --max-num-batched-tokens {chunk}", 4096,
                       {"model": "/m"})
    assert r.env == {"A": "1", "B": "x y"}
    assert r.argv == (sys.executable, "-m", "vllm", "serve", "/m", "--max-num-batched-tokens", "4096")
    from pdexporter.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown placeholder \{model\}; define it under launcher.vars"):
        render_command("vllm serve {model} {chunk}", 1)


async def test_no_time_to_wait_for_a_start_still_starts_the_engine_for_the_next_run(
    tmp_path: Path, served: Path
) -> None:
    from pdexporter.sweep.controller import Deadline, SweepController
    from pdexporter.sweep.providers import LauncherProvider
    from pdexporter.sweep.spec import parse_sweep

    store, port = ResultsStore(tmp_path / "results"), free_port()
    spec = parse_sweep({"grid": {"chunk_sizes": [2048], "decode_batch_sizes": [0], "new_prefill_tokens": [512]}})
    # 60 s left: less than a start is estimated to take (120 s before any was seen).
    deadline = Deadline(at=60.0, margin_s=5.0, clock=lambda: 0.0)
    report = await SweepController(
        spec, store, LauncherProvider(launcher(store, served, port)), deadline=deadline
    ).run()
    assert report.status == "deadline" and "started in the background" in (report.message or "")
    state = EngineState.read(store.engine_dir(2048) / STATE_FILE)
    assert state is not None and pid_alive(state.pid)
    later = launcher(store, served, port)
    await later.start(2048)
    assert later.adopted
    await later.stop()
    assert not pid_alive(state.pid)


async def test_a_start_that_fails_in_vllms_engine_core_names_the_root_cause(tmp_path: Path) -> None:
    """vLLM's API server ends the log with "Engine core initialization failed. See root cause above.": the
    one-line error carries the engine core's exception instead (the vLLM adapter's `start_failure`)."""
    store = ResultsStore(tmp_path / "results")
    script = tmp_path / "fake_vllm.py"  # a stand-in process that writes vLLM 0.22's two failure lines and exits
    script.write_text(
        "import sys\n"
        "print(\"(EngineCore pid=7) ValueError: To serve at least one request with the model's max seq len \"\n"
        "      \"(200000), (18.31 GiB KV cache is needed, which is larger than the available KV cache memory\")\n"
        "print('(APIServer pid=6) RuntimeError: Engine core initialization failed. See root cause above. '\n"
        "      'Failed core proc(s): {}')\n"
        "sys.exit(1)\n")
    bad = LocalLauncher(command=f"{{python}} {script} {{chunk}}", store=store, url=f"http://127.0.0.1:{free_port()}",
                        health_timeout_s=20)
    with pytest.raises(EngineError) as info:
        await bad.start(2048)
    assert "max seq len (200000)" in str(info.value) and "root cause above" not in str(info.value)
