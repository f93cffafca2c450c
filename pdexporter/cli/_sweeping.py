"""The sweep commands' shared pieces (`pdexporter sweep`, `pdexporter sim sweep`): their options
and the run told to the end under a progress display (`sweep_and_report`: the job is
`pdexporter.sweep.job`, the display `_sweep_progress`). Exit codes: 0 the sweep is complete; 5 it
stopped at `--deadline` (rerun the same command to continue); 4 some configurations failed after
their retries (the others are recorded; rerun to try them again); 2/3 bad input / engine errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pdexporter.cli._common import duration_option, show

if TYPE_CHECKING:  # imported where a sweep runs: `pdexporter sim serve` starts without them
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sweep.spec import SweepSpec

SweepFileArg = Annotated[Path, typer.Argument(help="Sweep file (see sweeps/*.yaml and docs/sweep.md).")]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="faithful | fast (default: the file's `mode`).")]
RepsOpt = Annotated[int | None, typer.Option("--reps", min=1, help="Repetitions per configuration.")]
ChunkIndexOpt = Annotated[
    int | None,
    typer.Option("--chunk-index", min=0, help="Run only the I-th chunk size of the grid, in file order "
                                              "(a Kubernetes Indexed Job's completion index)."),
]
DeadlineOpt = Annotated[
    str | None, duration_option("--deadline", "How long from now: stop cleanly between runs before then (exit 5)"),
]


def sweep_and_report(spec: SweepSpec, store: ResultsStore, *, deadline: float | None = None,
                     keep_engine: bool = False, token: str | None = None) -> None:
    """Run the sweep under a progress display, show its summary, print the results directory, and
    exit with the sweep's code."""
    from pdexporter.cli._sweep_progress import ProgressObserver
    from pdexporter.sweep.job import outcome, run_sweep

    report = run_sweep(spec, store, ProgressObserver(spec), deadline=deadline, keep_engine=keep_engine, token=token)
    end = outcome(report)
    show(end.shown)
    print(store.root)
    if end.exit_code:
        sys.exit(end.exit_code)
