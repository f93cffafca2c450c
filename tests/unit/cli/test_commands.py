"""`pdexporter COMMAND` imports only that command's module (each test that starts the CLI paid ~1 s of
CPU for the thirteen others), and `pdexporter.cli.app` still has every command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer.main

from pdexporter import cli

ROOT = Path(__file__).resolve().parents[3]


def test_every_command_module_is_listed_and_registers_its_name() -> None:
    modules = {
        p.stem
        for p in (ROOT / "pdexporter" / "cli").glob("*.py")
        if not p.stem.startswith("_") and "\ndef register(" in p.read_text()
    }
    assert set(cli.COMMANDS.values()) == modules
    for name in cli.COMMANDS:
        assert set(typer.main.get_command(cli.command_app(name)).commands) == {name}  # type: ignore[attr-defined]
    assert set(typer.main.get_command(cli.app).commands) == set(cli.COMMANDS)  # type: ignore[attr-defined]


def test_a_command_imports_only_its_own_module() -> None:
    probe = (
        "import sys\nfrom pdexporter.cli import main\n"
        "try:\n    main(['measure', '--help'])\nexcept SystemExit:\n    pass\n"
        "import json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('pdexporter.cli.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert "pdexporter.cli.measure" in loaded
    assert not {f"pdexporter.cli.{m}" for m in cli.COMMANDS.values() if m != "measure"} & set(loaded), loaded


def test_the_root_and_unknown_words_get_every_command() -> None:
    assert cli._command_of(["--help"]) is None
    assert cli._command_of(["nosuch", "--help"]) is None
    assert cli._command_of(["--version"]) is None
    assert cli._command_of(["sim", "serve", "--port", "0"]) == "sim"
    assert cli._command_of(["export-table", "results"]) == "export-table"



def test_commands_that_read_files_start_without_the_http_client_or_the_launchers() -> None:
    """The shared options module (`cli._common`) imports the launchers and aiohttp (~0.3 s of CPU,
    a third of such a command's start) only where an engine is reached: `export-table`, `report`,
    `decide`, ... read results directories and start without them; `measure` needs them."""
    readers = ["export-table", "report", "decide", "compare", "thresholds", "dashboards", "validate-pd"]
    probe = (
        "import json, sys\nfrom pdexporter.cli import main\n"
        "for command in sys.argv[1:]:\n"
        "    try:\n        main([command, '--help'])\n    except SystemExit:\n        pass\n"
        "    print(json.dumps([command, sorted(m for m in ('aiohttp', 'pdexporter.launch', 'pdexporter.client.client')"
        " if m in sys.modules)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, *readers, "measure"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    loaded = dict(json.loads(line) for line in out.splitlines() if line.startswith('["'))
    assert loaded == {**{c: [] for c in readers},
                      "measure": ["aiohttp", "pdexporter.client.client", "pdexporter.launch"]}, loaded


def test_run_reads_its_options_before_importing_the_exporter() -> None:
    """`run --help` and a rejected option start without the exporter's runner, whose passive path
    imports pandas (~0.4 s of CPU of each such start): they are a third of the suite's `run` starts."""
    probe = (
        "import json, sys\nfrom pdexporter.cli import main\n"
        "for args in (['run', '--help'], ['run', '--decode-batch-size', '0'],\n"
        "             ['run', '--listen', '127.0.0.1:99999']):\n"
        "    code = 0\n    try:\n        main(args)\n    except SystemExit as exc:\n        code = exc.code\n"
        "    loaded = sorted(m for m in ('pandas', 'pdexporter.exporter.runner') if m in sys.modules)\n"
        "    print(json.dumps([code, loaded]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert [json.loads(line) for line in out.splitlines() if line.startswith("[")] == [[0, []], [2, []], [2, []]], out
