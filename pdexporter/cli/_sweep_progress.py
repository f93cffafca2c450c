"""The sweep commands' progress display (`ProgressObserver`), apart from `_sweeping` so that the
commands registered beside the sweeps (`pdexporter sim serve`, `sim calibrate`, ...) start without
importing the sweep controller, the records and the HTTP client it needs: `sweep_and_report`
imports it when a sweep runs."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pdexporter.cli._common import console
from pdexporter.measure.records import RepRecord, RunRecord
from pdexporter.sweep.controller import Key, SweepObserver
from pdexporter.sweep.plan import ConfigStatus
from pdexporter.sweep.spec import SweepSpec


class ProgressObserver(SweepObserver):
    """Rich progress: one bar over all repetitions (configs done, ETA) and, with several engines,
    one bar per engine slot (its chunk size, phase and repetitions, ETA)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.progress = Progress(
            TextColumn("[bold]{task.fields[configs]}"),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reps"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=4,
            transient=False,
        )
        self.task = self.progress.add_task("starting", total=None, configs="")
        self.several = spec.slots > 1
        self.slot_tasks: dict[int, Any] = {}  # slot -> its bar
        self.chunk_slot: dict[int, tuple[int, str]] = {}  # chunk size -> (slot, label)
        self.total = 0
        self.configs_done = 0
        self.interactive = console.is_terminal
        self.t0 = time.monotonic()

    def __enter__(self) -> ProgressObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _configs(self) -> str:
        return f"{self.configs_done}/{self.total} configs"

    def on_plan(self, total: int, done: int, reps_to_run: int) -> None:
        self.total, self.configs_done = total, done
        self.progress.update(self.task, total=max(1, reps_to_run), completed=0 if reps_to_run else 1,
                             configs=self._configs(), description="all engines" if self.several else "starting")

    def on_chunk(self, slot: int, label: str, chunk: int, reps_to_run: int) -> None:
        self.chunk_slot[chunk] = (slot, label)
        if not self.several:
            return
        name = label or f"engine {slot}"
        if slot not in self.slot_tasks:
            self.slot_tasks[slot] = self.progress.add_task(f"B={chunk}", total=max(1, reps_to_run), configs=name)
        else:  # a new chunk size on this engine: the bar starts over
            self.progress.reset(self.slot_tasks[slot], total=max(1, reps_to_run), description=f"B={chunk}")

    def _where(self, chunk: int) -> str:
        label = self.chunk_slot.get(chunk, (0, ""))[1]
        return f"{label} " if self.several and label else ""

    def on_phase(self, phase: str, chunk: int, d: int | None = None, p: int | None = None) -> None:
        where = f"B={chunk}" + (f" D={d}" if d is not None else "") + (f" P={p}" if p is not None else "")
        slot = self.chunk_slot.get(chunk, (0, ""))[0]
        task = self.slot_tasks.get(slot) if self.several else self.task
        if task is not None:
            self.progress.update(task, description=f"{where} {phase}")
        if not self.interactive and phase in ("engine_start", "warmup", "phase1"):
            self.on_message(f"{self._stamp()} {self._where(chunk)}{where} {phase}")

    def _advance(self, task: Any) -> None:
        current = next(t for t in self.progress.tasks if t.id == task)
        if current.total is not None and current.completed + 1 > current.total:
            self.progress.update(task, total=current.completed + 1)  # CV re-runs add repetitions
        self.progress.advance(task)

    def on_rep(self, key: Key, rep: RepRecord, info: Any) -> None:
        self._advance(self.task)
        slot = self.chunk_slot.get(key[0], (0, ""))[0]
        if self.several and slot in self.slot_tasks:
            self._advance(self.slot_tasks[slot])

    def _stamp(self) -> str:
        return f"[{time.monotonic() - self.t0:6.0f} s]"

    def on_config(self, key: Key, record: RunRecord | None, status: ConfigStatus) -> None:
        self.configs_done += 1
        self.progress.update(self.task, configs=self._configs())
        if not self.interactive and record is not None:
            # Logs (CI, a remote GPU call) get one line per configuration instead of a bar.
            pen = record.derived.tpot_penalty_ms
            cv = record.summary.cv_tpot_penalty if record.summary else None
            self.on_message(
                f"{self._stamp()} {self._configs()} {self._where(key[0])}B={key[0]} D={key[1]} P={key[2]}: "
                f"prefill {record.interference.prefill_duration_ms:.1f} ms"
                + (f", penalty {pen:.2f} ms" if pen is not None else "")
                + (f", CV {cv:.1%}" if cv is not None else "")
                + (f", chunks {record.interference.num_chunks_actual}/{record.interference.num_chunks_expected}"
                   if record.interference.num_chunks_actual is not None else "")
            )
        if status.flagged:
            cv = status.cv_by_attempt[-1] if status.cv_by_attempt else None
            self.on_message(f"B={key[0]} D={key[1]} P={key[2]}: flagged, CV {cv:.1%} still above "
                            f"{self.spec.cv.threshold:.0%} after {status.complete_attempts} attempt(s)")

    def on_message(self, text: str) -> None:
        self.progress.console.print(text, soft_wrap=True, highlight=False)
