"""scripts/gpu/gil_dumps.py (who runs in vLLM's engine core while its eager steps are slow; GPU session 39): the
committed run re-read into its committed gil.md and thread.md, py-spy's dump text parsed (a failed dump kept as
unreadable, the GIL holder found), the dumps put inside the right steps, and a folder without dumps as one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers import REPO

RUN = REPO / "results" / "h100-vllm0.22-llama-3.2-3b-instruct-anatomy"

DUMPS = """core pid 1372 at 100.0
@@ 100.5
Process 1372: VLLM::EngineCore
Python v3.12.3 (/usr/bin/python3.12)

Thread 1372 (active+gil): "MainThread"
    GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:4266)
    EngineCore.step (vllm/v1/engine/core.py:400)
Thread 5022 (idle): "Thread-2 (process_input_sockets)"
    Poller.poll (zmq/sugar/poll.py:106)
@@ 100.55
Error: Failed to get stack traces
    2: Bad address (os error 14)
@@ 100.6
Process 1372: VLLM::EngineCore

Thread 1372 (active): "MainThread"
    AsyncGPUModelRunnerOutput.get_output (vllm/v1/worker/gpu_model_runner.py:285)
Thread 5023 (active+gil): "Thread-3 (process_output_sockets)"
    Queue.get (queue.py:171)
"""


@pytest.fixture(scope="module")
def gil():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gil_dumps", REPO / "scripts" / "gpu" / "gil_dumps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gil_dumps"] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def test_the_committed_run_gives_its_committed_reports(gil) -> None:  # type: ignore[no-untyped-def]
    assert gil.report(RUN / "gil") + "\n" == (RUN / "gil" / "gil.md").read_text()
    assert gil.report(RUN / "first") + "\n" == (RUN / "first" / "thread.md").read_text()


def test_py_spy_dumps_are_parsed_with_the_gil_holder_and_the_failed_ones_kept_unreadable(gil) -> None:  # type: ignore[no-untyped-def]
    dumps = gil.parse_dumps(DUMPS)
    assert [d.epoch for d in dumps] == [100.5, 100.55, 100.6]
    assert [d.ok for d in dumps] == [True, False, True]
    first, _, last = dumps
    assert first.main.gil and first.main.frames[0].startswith("GPUModelRunner.execute_model (")
    assert not any(t.active for t in first.others())
    assert last.main.active and not last.main.gil
    assert [t.name for t in last.others() if t.gil] == ["Thread-3 (process_output_sockets)"]
    frame = gil.dump_frame([d for d in dumps if d.ok], offset=100.0)
    assert frame.t.tolist() == pytest.approx([0.5, 0.6])
    assert frame.other_gil.tolist() == [False, True] and frame.main_running_no_gil.tolist() == [False, True]


def test_a_dump_counts_only_inside_its_steps_window(gil) -> None:  # type: ignore[no-untyped-def]
    frame = gil.dump_frame([d for d in gil.parse_dumps(DUMPS) if d.ok], offset=100.0)  # dumps at 0.5 and 0.6 s
    reps = pd.DataFrame({"D": [4, 4, 4], "P": [512, 512, 4096], "t": [0.45, 0.58, 0.5],
                         "first_s": [0.1, 0.01, 1.0], "step_ratio": [1.5, 0.7, 1.0]})
    inside = gil.in_steps(frame, reps, control=4096)
    # the first step (0.45-0.55) holds the dump at 0.5; the second (0.58-0.59) none; P = 4096 is the control
    assert inside.t.tolist() == pytest.approx([0.5]) and inside.step_ratio.tolist() == [1.5]


def test_a_folder_without_records_is_one_line_naming_it(tmp_path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "gil_dumps.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and str(tmp_path) in out.stderr and len(out.stderr.strip().splitlines()) == 1


def _counters(tmp_path, *, slow_factor: dict[str, float], hardware: bool = True):  # type: ignore[no-untyped-def]
    """A thread_counters.py file over 80 s (a sample every 0.1 s, the thread always running) whose slow 10-s
    stretches (10-20, 30-40, ...) scale one quantity by `slow_factor`, and one-chunk repetitions every 0.5 s at
    level 1.5 there and 0.7 elsewhere."""
    import gzip
    import json

    header = {"pid": 1, "available": {"task_ns": True, "cycles": True if hardware else "No such file or directory",
                                      "instructions": True, "ref_cycles": True}}
    lines, tot = [json.dumps(header)], {"task_ns": 0.0, "cycles": 0.0, "instructions": 0.0, "ref_cycles": 0.0}
    reps = []
    for i in range(801):
        t = i * 0.1
        slow = int(t // 10) % 2 == 1
        f = {k: slow_factor.get(k, 1.0) if slow else 1.0 for k in ("clock", "on_cpu", "ipc")}
        ref = 0.1e9 * 2.0 * f["on_cpu"]  # reference cycles in 0.1 s of task-clock, 2 GHz nominal
        tot["task_ns"] += 0.1e9
        tot["ref_cycles"] += ref
        tot["cycles"] += ref * f["clock"]
        tot["instructions"] += ref * f["clock"] * 2.0 * f["ipc"]
        row = {"t": int(t * 1e9), "w": int(t * 1e9) + 5, "task_ns": int(tot["task_ns"])}
        if hardware:
            row.update({k: int(v) for k, v in tot.items() if k != "task_ns"})
        lines.append(json.dumps(row))
    for i in range(160):
        t = i * 0.5 + 0.05
        reps.append({"D": 4, "P": 512, "t": t, "step_ratio": 1.5 if int(t // 10) % 2 == 1 else 0.7})
    reps.append({"D": 4, "P": 4096, "t": 1.0, "step_ratio": 1.0})
    path = tmp_path / "counters.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path, pd.DataFrame(reps)


@pytest.mark.parametrize(("factor", "cause"), [
    ({"on_cpu": 0.6}, "the host: the vCPU not running the thread"),
    ({"clock": 0.6}, "a lower clock"),
    ({"ipc": 0.55}, "fewer instructions a cycle"),
    ({"ipc": 0.95}, "inconclusive"),
])
def test_the_counters_reading_names_what_moved_between_the_states(gil, tmp_path, factor, cause) -> None:  # type: ignore[no-untyped-def]
    path, reps = _counters(tmp_path, slow_factor=factor)
    text = "\n".join(gil.counter_lines(path, reps, control=4096))
    assert f"**Reading (fixed before the run): {cause}" in text
    key = next(iter(factor))
    assert f"| {key} |" in text and f"| {factor[key]:.2f} |" in text  # slow over fast, as built


def test_without_a_virtual_pmu_the_counters_say_they_cannot_answer(gil, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, reps = _counters(tmp_path, slow_factor={"clock": 0.5}, hardware=False)
    (line,) = gil.counter_lines(path, reps, control=4096)
    assert "no hardware counter (cycles: No such file or directory)" in line
