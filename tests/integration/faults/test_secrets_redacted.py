"""Secrets redacted by value in every command (issue 31; docs/security.md "What never reaches a
file or a line"). The engine is ScriptedEngine, a TEST DOUBLE, with `echo_auth`: its 500s and 404
pages quote the request's `Authorization` header, as a debugging proxy or a framework's error page
does. Before: `measure`, `sweep` and `run` printed the bearer token (6 times in 40 s of `run`),
URL credentials came out as their Basic base64, and `sweep --target http://user:pass@...` printed
the password in its first line.

Each command runs as the real CLI in a child process; what it printed (stdout, stderr) and every
file it wrote must hold none of the secret's forms: the API key, the URL password, `user:password`
and its base64 (what `Authorization: Basic` carries), nor the key's base64.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import cli_env, free_port
from tests.integration.faults.faultkit import PROTOCOL_ARGS, ROOT, B, D, P, sweep_file
from tests.scripted_engine import Fault, ScriptedEngine

pytestmark = pytest.mark.integration

API_KEY = "sk-redact-test-0123456789abcdef"
USER, PASSWORD = "alice", "pw-hunter2-s3cret"
CADENCE_S = 0.01


def _forms() -> list[str]:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return [API_KEY, base64.b64encode(API_KEY.encode()).decode(), PASSWORD, basic, f"{USER}:{PASSWORD}"]


def _leaks(*texts: str, under: Path | None = None) -> list[str]:
    """Which forms of the secrets appear in `texts` or in any file under `under`."""
    blob = "\n".join(texts)
    if under is not None and under.exists():
        for path in under.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                if path.suffix == ".gz":
                    import gzip

                    data = gzip.decompress(data)
                blob += "\n" + data.decode("utf-8", "replace")
    return [form for form in _forms() if form in blob]


async def _cli(*args: str, env: dict[str, str] | None = None, stop_after_s: float | None = None,
               timeout: float = 180) -> tuple[int, str]:
    """The CLI in a child process: (exit code, stdout and stderr). With `stop_after_s`, SIGINT then."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdexporter", *args, cwd=ROOT, env={**cli_env(), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    if stop_after_s is not None:
        try:
            await asyncio.wait_for(proc.wait(), stop_after_s)
        except TimeoutError:
            proc.send_signal(signal.SIGINT)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode() + err.decode()


def _with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


MEASURE = ("-B", str(B), "-D", str(D), "-P", str(P), "--reps", "1", *PROTOCOL_ARGS)


@pytest.mark.parametrize("kind", ["http-500", "html-404"])
async def test_measure_never_prints_the_api_key_an_error_page_quotes(kind: str, tmp_path: Path) -> None:
    fault = Fault(kind, on="prefill", skip=2, times=None)  # the window's prefill, every time
    async with ScriptedEngine(cadence_s=CADENCE_S, faults=[fault], echo_auth=True) as engine:
        code, text = await _cli("measure", "--target", engine.url, "--out", str(tmp_path), *MEASURE,
                                env={"PDEXPORTER_API_KEY": API_KEY})
    assert code == 3 and fault.hits >= 1, text
    assert "***" in text and "Traceback" not in text, text
    assert _leaks(text, under=tmp_path) == []


async def test_measure_never_prints_url_credentials_or_their_basic_base64(tmp_path: Path) -> None:
    fault = Fault("http-500", on="prefill", skip=2, times=1)  # the window spoiled once: re-run, recorded
    async with ScriptedEngine(cadence_s=CADENCE_S, faults=[fault], echo_auth=True) as engine:
        code, text = await _cli("measure", "--target", _with_credentials(engine.url), "--out", str(tmp_path),
                                *MEASURE)
    assert code == 0 and fault.hits == 1, text
    assert "answered HTTP 500" in text, text
    assert _leaks(text, under=tmp_path) == []


async def test_sweep_never_prints_url_credentials(tmp_path: Path) -> None:
    fault = Fault("http-500", on="prefill", skip=2, times=None)
    async with ScriptedEngine(cadence_s=CADENCE_S, faults=[fault], echo_auth=True) as engine:
        code, text = await _cli("sweep", str(sweep_file(tmp_path)), "--target", _with_credentials(engine.url))
    assert code != 0 and fault.hits >= 1, text
    assert "answered HTTP 500" in text and "Traceback" not in text, text
    assert _leaks(text, under=tmp_path) == []


@pytest.mark.slow
async def test_run_never_prints_the_api_key_an_error_page_quotes(tmp_path: Path) -> None:
    fault = Fault("http-500", on="prefill", skip=2, times=None)
    async with ScriptedEngine(cadence_s=CADENCE_S, faults=[fault], echo_auth=True) as engine:
        code, text = await _cli(
            "run", "--target", engine.url, "--chunk-size", str(B), "--decode-batch-size", str(D),
            "--new-prefill-tokens", str(P), "--inject-every", "0.5s", "--listen", f"127.0.0.1:{free_port()}",
            "--out", str(tmp_path), *PROTOCOL_ARGS, "--duration", "8s",
            env={"PDEXPORTER_API_KEY": API_KEY}, stop_after_s=40)
    # A window spoiled every ~0.8 s: in 8 s each of `run`'s lines about it ("another in ...", and the
    # one when its retries are used up) comes several times; each quotes the 500's page, redacted.
    assert fault.hits >= 1, text
    assert "window skipped: " in text and "Bearer ***" in text and "Traceback" not in text, text
    assert _leaks(text, under=tmp_path) == []


async def test_doctor_and_load_never_print_url_credentials(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE_S, metrics="html-404", behaviour="fail", echo_auth=True) as engine:
        url = _with_credentials(engine.url)
        code, doctor = await _cli("doctor", "--target", url, "--chunk-size", str(B))
        code_load, load = await _cli("load", "--target", url, "--rate", "5", "--duration", "1s",
                                     "--out", str(tmp_path / "load.json"))
    assert "Traceback" not in doctor + load, doctor + load
    assert _leaks(doctor, load, under=tmp_path) == [], doctor + load
    assert os.path.exists(tmp_path / "load.json") or code_load != 0
