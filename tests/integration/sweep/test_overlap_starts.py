"""Overlapped starts (`launch.overlap`, `_internal.gate`): the next chunk size's engine does its
CPU-side start-up while the current one serves and waits before the GPU until that one is stopped.

The gate's hook is tried on real Python processes. There is no GPU here, so `torch` is a test
double (`fake_torch`: a package whose `torch.cuda` keeps PyTorch's lazy-initialisation shape,
`_lazy_init`, `is_initialized`, a submodule that binds `_lazy_init` by name, and writes a file when
"CUDA" is initialised); the engines the launchers start are real processes (an HTTP server behind
that double, and `pdexporter sim serve`, which holds at the gate where vLLM would touch the GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pdexporter._internal.gate import GATE_ENV, hook_dir
from pdexporter.launch.base import pid_alive
from pdexporter.launch.local import GATE_FILE, LOG_FILE, STATE_FILE, EngineState, LocalLauncher
from pdexporter.launch.overlap import OverlappingLauncher
from pdexporter.measure.store import ResultsStore
from tests.helpers import ExpireAfterFirstConfig, free_ports, until

pytestmark = pytest.mark.integration




@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    """A stand-in for torch (see the module docstring); CUDA initialisation writes `$FAKE_CUDA_MARK`."""
    root = tmp_path / "fake_torch"
    (root / "torch" / "cuda").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("from torch import cuda  # noqa: F401\n")
    (root / "torch" / "cuda" / "__init__.py").write_text(textwrap.dedent("""
        import os
        _initialized = False

        def is_initialized():
            return _initialized

        def _lazy_init():
            global _initialized
            if _initialized:
                return
            _initialized = True
            mark = os.environ.get("FAKE_CUDA_MARK")
            if mark:
                open(mark, "a").write(f"{os.getpid()}\\n")

        def current_device():
            _lazy_init()
            return 0

        from torch.cuda import memory  # binds _lazy_init by name, as torch.cuda.memory does
    """))
    (root / "torch" / "cuda" / "memory.py").write_text(textwrap.dedent("""
        from torch.cuda import _lazy_init

        def mem_get_info():
            _lazy_init()
            return (1, 1)
    """))
    return root


def _python(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_the_gate_holds_cuda_initialisation_until_its_file_exists(tmp_path: Path, fake_torch: Path) -> None:
    gate, mark = tmp_path / "gate", tmp_path / "cuda-initialised"
    shadowed = tmp_path / "shadowed"  # a distribution's own sitecustomize, later on the path: still run
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text(f"open({str(tmp_path / 'shadowed-ran')!r}, 'w').close()\n")
    env = {**os.environ, GATE_ENV: str(gate), "FAKE_CUDA_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join([str(hook_dir()), str(fake_torch), str(shadowed)])}
    proc = _python("import torch, sys; print('imported', flush=True); torch.cuda.memory.mem_get_info(); "
                   "print('initialised', flush=True)", env)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == "imported"  # imports run; then it waits at CUDA's
    held = proc.stderr.readline()
    assert "holds CUDA initialisation" in held and str(gate) in held and "<string>" in held, held
    assert not mark.exists() and proc.poll() is None
    gate.touch()
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and out.strip() == "initialised" and "opened after" in err
    assert mark.read_text().split() == [str(proc.pid)]
    assert (tmp_path / "shadowed-ran").exists()


def test_without_a_gate_the_hook_changes_nothing(tmp_path: Path, fake_torch: Path) -> None:
    mark = tmp_path / "cuda-initialised"
    env = {**os.environ, "FAKE_CUDA_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join([str(hook_dir()), str(fake_torch)])}
    env.pop(GATE_ENV, None)
    out = subprocess.run([sys.executable, "-c", "import torch; torch.cuda.current_device(); "
                          "print(torch.cuda._lazy_init.__module__)"], env=env, capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 0 and out.stdout.strip() == "torch.cuda" and out.stderr == ""  # not wrapped
    assert mark.exists()
    # an open gate lets it through without a word
    (tmp_path / "open").touch()
    env[GATE_ENV] = str(tmp_path / "open")
    out = subprocess.run([sys.executable, "-c", "import torch; torch.cuda.current_device()"], env=env,
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0 and out.stderr == ""


def _engine_script(tmp_path: Path) -> Path:
    """An "engine": imports, touches "CUDA" (the fake torch), then serves GET /health."""
    script = tmp_path / "engine.py"
    script.write_text(textwrap.dedent("""
        import http.server, os, sys
        import torch
        torch.cuda.current_device()
        root = os.path.join(os.environ["WWW"])
        handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=root)
        http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
    """))
    (tmp_path / "www").mkdir(exist_ok=True)
    (tmp_path / "www" / "health").write_text("")
    return script


def _lanes(tmp_path: Path, store: ResultsStore, port: int, fake_torch: Path,
           messages: list[str]) -> OverlappingLauncher:
    script = _engine_script(tmp_path)
    env = {"PYTHONPATH": str(fake_torch), "FAKE_CUDA_MARK": str(tmp_path / "cuda"), "WWW": str(tmp_path / "www")}
    urls = [f"http://127.0.0.1:{port + i}" for i in (0, 1)]
    return OverlappingLauncher(tuple(  # type: ignore[arg-type]
        LocalLauncher(command=f"{{python}} {script} {{port}} --chunk {{chunk}}", store=store, url=url,
                      variables={"port": str(port + i)}, env=env, health_timeout_s=30, stop_timeout_s=5,
                      siblings=frozenset(urls) - {url}, gated=True, on_message=messages.append)
        for i, url in enumerate(urls)
    ))


def _held_line(store: ResultsStore, chunk: int) -> bool:
    log = store.engine_dir(chunk) / LOG_FILE
    return log.exists() and "holds CUDA initialisation" in log.read_text()


async def test_the_next_engine_starts_beside_the_current_one_and_waits_before_the_gpu(
    tmp_path: Path, fake_torch: Path
) -> None:
    store, port = ResultsStore(tmp_path / "results"), free_ports(2)
    messages: list[str] = []
    lanes = _lanes(tmp_path, store, port, fake_torch, messages)
    marks = tmp_path / "cuda"
    await lanes.prepare(4096)  # the sweep's order: the next one first, then the current one
    first = await lanes.start(2048)
    await until(lambda: _held_line(store, 4096), 20, "the held engine's gate line")
    held = EngineState.read(store.engine_dir(4096) / STATE_FILE)
    assert held is not None and held.held and pid_alive(held.pid) and held.url != first.url
    assert marks.read_text().split() == [str(EngineState.read(store.engine_dir(2048) / STATE_FILE).pid)]  # type: ignore[union-attr]

    await lanes.stop()  # the sweep is done with 2048
    assert not (store.engine_dir(2048) / STATE_FILE).exists()
    second = await lanes.start(4096)  # its gate opens: no new process
    state = EngineState.read(store.engine_dir(4096) / STATE_FILE)
    assert state is not None and state.pid == held.pid and not state.held and second.url == held.url
    assert (store.engine_dir(4096) / GATE_FILE).exists() and "opened after" in (
        store.engine_dir(4096) / LOG_FILE).read_text()
    assert len(marks.read_text().split()) == 2
    await lanes.stop()
    assert not pid_alive(held.pid)


async def test_held_and_serving_engines_are_adopted_by_the_next_invocation(tmp_path: Path, fake_torch: Path) -> None:
    store, port = ResultsStore(tmp_path / "results"), free_ports(2)
    messages: list[str] = []
    lanes = _lanes(tmp_path, store, port, fake_torch, messages)
    await lanes.prepare(4096)
    await lanes.start(2048)
    await until(lambda: _held_line(store, 4096), 20, "the held engine's gate line")
    pids = {c: EngineState.read(store.engine_dir(c) / STATE_FILE).pid for c in (2048, 4096)}  # type: ignore[union-attr]
    lanes.release()  # a deadline: both left for the next invocation

    again = _lanes(tmp_path, store, port, fake_torch, messages)
    assert again.can_adopt(2048) and again.can_adopt(4096)
    await again.prepare(4096)  # takes the held one over, still held
    assert EngineState.read(store.engine_dir(4096) / STATE_FILE).held  # type: ignore[union-attr]
    await again.start(2048)
    assert again.adopted
    await again.stop()
    await again.start(4096)
    adopted = EngineState.read(store.engine_dir(4096) / STATE_FILE)
    assert again.adopted and adopted is not None and adopted.pid == pids[4096]
    assert not pid_alive(pids[2048])
    await again.stop()
    assert not pid_alive(pids[4096]) and sum("adopting" in m for m in messages) == 2


async def test_a_serving_engine_is_stopped_before_a_held_one_goes_through(tmp_path: Path, fake_torch: Path) -> None:
    """A held engine's gate opens only once no other engine of the results directory is past its
    own: one left serving by an earlier invocation (another lane's port) is stopped first."""
    store, port = ResultsStore(tmp_path / "results"), free_ports(2)
    messages: list[str] = []
    lanes = _lanes(tmp_path, store, port, fake_torch, messages)
    await lanes.start(2048)
    serving = EngineState.read(store.engine_dir(2048) / STATE_FILE)
    lanes.release()
    again = _lanes(tmp_path, store, port, fake_torch, messages)
    await again.prepare(4096)  # held beside the released 2048 engine, which keeps serving
    await until(lambda: _held_line(store, 4096), 20, "the held engine's gate line")
    assert serving is not None and pid_alive(serving.pid)
    await again.start(4096)  # 2048 is not wanted any more: stopped before 4096 touches "CUDA"
    assert not pid_alive(serving.pid)
    await again.stop()


async def test_a_sweep_with_overlapped_starts_on_the_embedded_engine(tmp_path: Path) -> None:
    """`launcher.overlap_starts`: three chunk sizes, `pdexporter sim serve` as the engine. Each
    later engine is launched as the one before it starts, holds at the gate, and goes through
    once that one is stopped; a deadline leaves both for the next invocation, which adopts them."""
    from pdexporter.sweep.controller import Deadline, SweepController
    from pdexporter.sweep.providers import make_provider
    from pdexporter.sweep.spec import parse_sweep

    port = free_ports(2)
    spec = parse_sweep({
        "grid": {"chunk_sizes": [2048, 4096, 8192], "decode_batch_sizes": [1], "new_prefill_tokens": [1024, 3072]},
        "reps": 1, "mode": "fast", "warmup": {"shapes": False},
        # real time on a shared machine: the steady-state rule relaxed (test_local_sweep.py says why)
        "protocol": {"decode_output_tokens": 96, "steady_last_intervals": 1},
        "launcher": {
            "kind": "local", "overlap_starts": True, "base_port": port,
            "command": "{python} -m pdexporter sim serve --max-num-batched-tokens {chunk} --port {port}",
            "url": "http://127.0.0.1:{port}", "health_timeout_s": 60, "stop_timeout_s": 10,
        },
    })
    store = ResultsStore(tmp_path / "results")
    first = SweepController(spec, store, make_provider(spec, store),
                            deadline=Deadline(at=1e6, margin_s=0.0, clock=ExpireAfterFirstConfig(store.root)))
    assert (await first.run()).status == "deadline"
    serving, held = (EngineState.read(store.engine_dir(c) / STATE_FILE) for c in (2048, 4096))
    assert serving is not None and held is not None and pid_alive(serving.pid) and pid_alive(held.pid)
    assert held.held and not serving.held and {serving.url, held.url} == {
        f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"}

    second = SweepController(spec, store, make_provider(spec, store))
    report = await second.run()
    assert report.complete and report.chunks[2048].engine_adopted and report.chunks[4096].engine_adopted
    assert not report.chunks[8192].engine_adopted
    assert not pid_alive(serving.pid) and not pid_alive(held.pid)
    assert not list(store.root.glob(f"*/engine/{STATE_FILE}"))  # every engine stopped at the end
    for chunk in (4096, 8192):  # each later engine waited at its gate, then served
        log = (store.engine_dir(chunk) / LOG_FILE).read_text()
        assert "(held before the GPU until" in log and "holds the embedded engine's start" in log
        assert "opened after" in log and "Iteration(" in log
    records = {r.key: r for r in store.iter_records()}
    assert len(records) == 6
    ports = {chunk: {r.config.engine_url for k, r in records.items() if k[0] == chunk} for chunk in (2048, 4096, 8192)}
    assert ports[2048] == ports[8192] != ports[4096]  # the lanes take turns
