"""scripts/gpu/thread_counters.py (the engine core's main thread's own counters, for GPU session 39's question): on
this machine, a real process of its own sampled through perf_event_open. Task-clock is a software counter every Linux
gives; the hardware ones only where there is a (virtual) PMU, and the header must say which."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "gpu" / "thread_counters.py"


def test_check_names_every_counter() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in ("task_ns yes", "cycles ", "instructions ", "ref_cycles "):
        assert name in out.stdout


def test_a_busy_thread_is_sampled_until_it_ends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = f"pdx-counters-{time.time_ns()}"
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 2.0: pass",
                                marker])
    out = tmp_path / "c.jsonl"
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "--pattern", marker, "--interval", "0.1",
                               "--wait", "30"], capture_output=True, text=True, timeout=60)
    finally:
        spinner.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr
    header, *rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert header["pid"] == spinner.pid and header["available"]["task_ns"] is True
    assert set(header["available"]) == {"task_ns", "cycles", "instructions", "ref_cycles"}
    assert len(rows) >= 5  # ~2 s at 0.1 s, until the process ended
    task = [r["task_ns"] for r in rows]
    assert task == sorted(task) and task[-1] - task[0] > 0.3e9  # a spinning thread: CPU time grows with the wall
    assert all(("cycles" in r) == (header["available"]["cycles"] is True) for r in rows)


def test_no_matching_process_is_one_line() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "/dev/null", "--pattern", "^no-such-process-xyz$", "--wait",
                          "0.5"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip() == \
        "thread_counters: no process matched '^no-such-process-xyz$' within 0.5 s"


def test_find_names_the_process_not_a_sampler_whose_arguments_name_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """GPU session 40: gil-dumps.sh looked for the engine core with an unanchored pgrep, which found the sampler
    started before it (`--pattern=...EngineCore` in its arguments), and py-spy dumped the sampler for five minutes.
    The finder both now use skips any process running this script: the sampler here starts first (a lower pid)."""
    marker = f"pdx-find-{time.time_ns()}"
    sampler = subprocess.Popen([sys.executable, str(SCRIPT), str(tmp_path / "c.jsonl"), f"--pattern={marker}",
                                "--wait", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)", marker])
    try:
        found = subprocess.run([sys.executable, str(SCRIPT), "--find", f"--pattern={marker}", "--wait", "10"],
                               capture_output=True, text=True, timeout=60)
    finally:
        target.kill()
        sampler.terminate()
        target.wait(timeout=30)
        sampler.wait(timeout=30)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(target.pid) != str(sampler.pid)
