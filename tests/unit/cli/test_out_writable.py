"""An output path that cannot be written is one line naming it and why, at the command's start
(issue 31: 50-100-line tracebacks, `run` only at its first window). Every command with an output
option is run here with one under a regular file, which nobody can write, root included."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest

from pdexporter import cli
from pdexporter._internal.writable import check_writable
from pdexporter.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b"
DECODEBENCH = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-decodebench"
SWEEP = ROOT / "sweeps" / "seed.yaml"

# (name, argv with {out}: the blocked path, {tmp}: a writable folder; the flag the line names)
COMMANDS = [
    ("run", ["run", "--out", "{out}", "--duration", "1s", "--listen", "127.0.0.1:0"], "--out"),
    ("measure", ["measure", "--out", "{out}"], "--out"),
    ("sweep", ["sweep", str(SWEEP), "--out", "{out}"], "--out"),
    ("sim sweep", ["sim", "sweep", str(SWEEP), "--out", "{out}"], "--out"),
    ("export-table", ["export-table", str(RESULTS), "--out", "{out}"], "--out"),
    ("report", ["report", str(RESULTS), "--out", "{out}/report.html"], "--out"),
    ("compare", ["compare", str(RESULTS), str(RESULTS), "--out", "{out}"], "--out"),
    ("thresholds", ["thresholds", "--model", str(RESULTS / "decision.json"), "--out", "{out}"], "--out"),
    ("validate-pd", ["validate-pd", str(RESULTS), "--decode-bench", str(DECODEBENCH), "--pair", str(DECODEBENCH),
                     "--out", "{out}"], "--out"),
    ("validate", ["validate", "--colocated", str(RESULTS), "--out", "{out}"], "--out"),
    ("load", ["load", "--target", "http://127.0.0.1:9", "--duration", "1s", "--out", "{out}/load.json"], "--out"),
    ("dashboards generate", ["dashboards", "generate", "--out", "{out}", "--chart", "{tmp}"], "--out"),
    ("sim profile-from-config", ["sim", "profile-from-config", "qwen3-8b", "--out", "{out}/p.yaml"], "--out"),
    ("sim calibrate --out", ["sim", "calibrate", str(RESULTS), "--out", "{out}/p.yaml"], "--out"),
    ("sim calibrate --report", ["sim", "calibrate", str(RESULTS), "--report", "{out}/r.json"], "--report"),
    ("sim serve --ready-file", ["sim", "serve", "--port", "0", "--ready-file", "{out}/ready.json"], "--ready-file"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "flag"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_an_output_under_a_file_is_one_line_before_anything_runs(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("a regular file, not a folder\n")
    out = blocker / "sub"
    args = [a.replace("{out}", str(out)).replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        cli.main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == ConfigError.exit_code, err
    named = next(a for a in args if a.startswith(str(out)))
    assert err == f"pdexporter: error: {flag} {named}: not writable ({blocker} is not a folder)\n"
    assert blocker.read_text() == "a regular file, not a folder\n"  # nothing written, nothing started


def test_every_output_option_of_the_cli_is_covered() -> None:
    """A command or output option added later gets a row above: the options named like outputs."""
    import typer.main

    covered = {(name.split(" --")[0], flag) for name, _, flag in COMMANDS}
    outputs = {"--out", "--report", "--ready-file"}
    found = set()

    def walk(command, path: str) -> None:  # type: ignore[no-untyped-def]
        for sub_name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {sub_name}".strip())
        for param in getattr(command, "params", []):
            for opt in getattr(param, "opts", []):
                if opt in outputs:
                    found.add((path, opt))

    walk(typer.main.get_command(cli.app), "")
    assert found - covered == set()


def test_a_writable_path_passes_and_nothing_is_created(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    assert check_writable(deep) == deep
    assert check_writable(tmp_path / "x" / "file.json", directory=False) == tmp_path / "x" / "file.json"
    assert list(tmp_path.iterdir()) == []  # no folder made, the probe file removed


def test_a_file_where_a_folder_goes_and_the_reverse(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"^--out .*/f: not writable \(a file, not a folder\)$"):
        check_writable(tmp_path / "f")
    with pytest.raises(ConfigError, match=r"^--report .*: not writable \(a folder, not a file\)$"):
        check_writable(tmp_path, "--report", directory=False)


def test_a_refused_folder_names_the_system_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root writes anywhere, so the refusal is a double: mkstemp raising what the kernel says to
    another user (EACCES) or on a read-only mount (EROFS)."""
    def refused(code: int):  # type: ignore[no-untyped-def]
        def mkstemp_double(*args: object, **kwargs: object) -> tuple[int, str]:
            raise OSError(code, "refused")
        return mkstemp_double

    monkeypatch.setattr(tempfile, "mkstemp", refused(errno.EACCES))
    with pytest.raises(ConfigError) as exc:
        check_writable(tmp_path)
    assert str(exc.value) == f"--out {tmp_path}: not writable (Permission denied)"
    monkeypatch.setattr(tempfile, "mkstemp", refused(errno.EROFS))
    with pytest.raises(ConfigError) as exc:
        check_writable(tmp_path / "new" / "dir")
    assert str(exc.value) == f"--out {tmp_path / 'new' / 'dir'}: not writable ({tmp_path}: Read-only file system)"
