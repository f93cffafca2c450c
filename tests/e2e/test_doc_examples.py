"""The examples the README, docs/disaggregation.md and the results' RUN.md show are run, and what
they print is what the page says (issue 31: the README's decide example and h200x2-arms/RUN.md's
command had gone stale).

An example is a fenced `pdexporter decide|thresholds ...` line followed by a `# ` line: the output
line it shows. The command runs in process from the repository root; the output line with the same
verdict word (the text before its first ':', e.g. "OFFLOAD", "KEEP LOCAL", "D=4") must be there
and carry the same numbers, in order. A RUN.md's fenced commands without an output line are the
commands that wrote its directory: they run again into a temporary directory, and what they write
must equal the committed files."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from pdexporter.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "disaggregation.md", *sorted(ROOT.glob("results/*/RUN.md"))]
RUN_MD = ROOT / "results" / "h200x2-arms" / "RUN.md"
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
EXAMPLE = re.compile(r"^pdexporter (decide|thresholds) ")


def _fenced(path: Path) -> list[list[str]]:
    blocks, block, inside = [], [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append(block)
            block, inside = [], not inside
        elif inside:
            block.append(line)
    return blocks


def examples(path: Path) -> list[tuple[str, str]]:
    """(command, shown output line) of every example on the page."""
    out = []
    for block in _fenced(path):
        for line, following in zip(block, block[1:]):
            if EXAMPLE.match(line) and following.startswith("# "):
                out.append((line, following[2:].strip()))
    return out


def _word(line: str) -> str:
    return line.strip().split(":", 1)[0]


def _run(capsys: pytest.CaptureFixture[str], command: str) -> tuple[int, str, str]:
    try:
        main(shlex.split(command)[1:])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


CASES = [(path, command, shown) for path in PAGES for command, shown in examples(path)]


def test_the_pages_show_examples() -> None:
    count = {path.relative_to(ROOT).as_posix(): len(examples(path)) for path in PAGES}
    assert count["README.md"] >= 2 and count["docs/disaggregation.md"] >= 2, count
    assert count["results/h200x2-arms/RUN.md"] >= 3, count


@pytest.mark.parametrize(("path", "command", "shown"), CASES,
                         ids=[f"{p.relative_to(ROOT).as_posix()}:{c.split(' --model')[0]}" for p, c, _ in CASES])
def test_an_example_prints_what_its_page_shows(path: Path, command: str, shown: str,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = _run(capsys, command)
    assert code == 0, err
    same = [line for line in out.splitlines() if _word(line) == _word(shown)]
    assert same, f"{path.name}: no line '{_word(shown)}: ...' in the output of {command}:\n{out}"
    assert NUMBER.findall(same[0]) == NUMBER.findall(shown), (
        f"{path.relative_to(ROOT)} shows\n  {shown}\nbut {command} prints\n  {same[0].strip()}")


@pytest.mark.slow
def test_run_md_commands_write_the_committed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """results/h200x2-arms/RUN.md's commands, run again, write its decision.json and thresholds."""
    monkeypatch.chdir(ROOT)
    block = next(b for b in _fenced(RUN_MD) if any(line.startswith("pdexporter export-table") for line in b))
    here = "results/h200x2-arms"
    commands = {shlex.split(line)[1]: shlex.split(line) for line in block if line.startswith("pdexporter ")}
    assert set(commands) == {"export-table", "report", "thresholds"}
    inputs = [a for a in commands["export-table"][2:] if a.startswith("results/") and a != here
              and not a.endswith(".json")]  # the records' directories (held_out.json: the campaign variation)
    assert inputs and all((ROOT / a).is_dir() for a in inputs)
    assert [a for a in commands["report"][2:] if a.startswith("results/") and not a.startswith(here)
            and not a.endswith(".json")] == inputs
    for name in ("export-table", "thresholds"):
        argv = [str(tmp_path) if a == here else a.replace(f"{here}/", f"{tmp_path}/") for a in commands[name][1:]]
        if name == "export-table":
            argv += ["--no-plots", "--no-parquet"]
        code, _out, err = _run(capsys, " ".join(["pdexporter", *map(shlex.quote, argv)]))
        assert code == 0, err
    fresh, committed = (json.loads((d / "decision.json").read_text()) for d in (tmp_path, ROOT / here))
    fresh.pop("generated_at"), committed.pop("generated_at")
    assert fresh == committed
    for name in ("offload_thresholds.json", "llm-d-pd-decider.yaml"):
        assert (tmp_path / name).read_text() == (ROOT / here / name).read_text(), name
