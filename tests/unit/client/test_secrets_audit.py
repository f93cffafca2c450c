"""The secrets audit of session 22 (issue 31's rule: no secret reaches a line or a file pdexporter
writes): each leak it found, and what now holds."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdexporter._internal.redact import (
    forget_secrets,
    known_secrets,
    redact,
    remember_argv,
    remember_secret,
    without_own_secrets,
)
from pdexporter._internal.urls import check_http_url
from pdexporter.errors import ConfigError
from pdexporter.launch.local import mask_secrets_in_log
from pdexporter.sweep.spec import load_sweep

SWEEP = """\
name: audit
gpu: H200
grid: {{chunk_sizes: [8192], decode_batch_sizes: [1], new_prefill_tokens: [512]}}
reps: 1
launcher:
  kind: local
  vars: {{hf: hfvar-AUDIT-7e6d5c4b3a, dbcreds: dbc-AUDIT-1a2b3c4d5e}}
  env: {{WANDB_API_KEY: wandb-AUDIT-8c7b6a5d4e}}
  command: >-
    HF_TOKEN=hf_AUDIT-5e4d3c2b1a {{python}} engine.py --hf-token {{hf}} --db {{dbcreds}}
    --max-num-batched-tokens {{chunk}} --port 18011
  url: http://127.0.0.1:18011
output: {out}
"""
SECRETS = ("hfvar-AUDIT-7e6d5c4b3a", "dbc-AUDIT-1a2b3c4d5e", "wandb-AUDIT-8c7b6a5d4e", "hf_AUDIT-5e4d3c2b1a")


@pytest.fixture
def no_known_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


def test_a_sweeps_launcher_secrets_are_hidden_everywhere_once_it_is_read(tmp_path: Path,
                                                                       no_known_secrets: None) -> None:
    """A variable whose name looks harmless (`hf`) but fills a secret flag (`--hf-token {hf}`) was kept
    in sweep.json, and an engine that printed its arguments on a failed start put every launcher secret
    on stderr: the spec's secrets are those of its command line *filled*, remembered when it is read."""
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.format(out=tmp_path / "out"))
    spec = load_sweep(path)
    assert set(SECRETS) <= set(spec.launcher_secrets())
    dumped = str(spec.redacted_dump())
    assert not [s for s in SECRETS if s in dumped], dumped
    line = "engine exited during start-up: args --hf-token hfvar-AUDIT-7e6d5c4b3a HF_TOKEN=hf_AUDIT-5e4d3c2b1a"
    assert redact(line) == "engine exited during start-up: args --hf-token *** HF_TOKEN=***"


def test_the_engines_environment_holds_none_of_pdexporters_own_secrets() -> None:
    env = {"PDEXPORTER_METRICS_TOKEN": "m", "PDEXPORTER_API_KEY": "k", "PDEXPORTER_TRACES_TOKEN": "t",
           "PDEXPORTER_PROFILES": "/p", "HF_TOKEN": "h", "PATH": "/bin"}
    assert without_own_secrets(env) == {"PDEXPORTER_PROFILES": "/p", "HF_TOKEN": "h", "PATH": "/bin"}


def test_a_command_line_given_as_one_value_has_its_secrets_remembered(no_known_secrets: None) -> None:
    """`doctor --engine-command "vllm serve m --api-key sk-..."` echoed the key in its error line."""
    remember_argv(["doctor", "--engine-command", "vllm serve m --api-key sk-AUDIT-DOC-1234 --hf-token hf_AUDIT-99"])
    assert redact("--engine-command 'vllm serve m --api-key sk-AUDIT-DOC-1234 --hf-token hf_AUDIT-99'") == (
        "--engine-command 'vllm serve m --api-key *** --hf-token ***'"
    )


@pytest.mark.parametrize("url", ["http://bob:pw-AUDIT/5a6b#7c8d@127.0.0.1:18000",
                                 "http://bob:pw-AUDIT?5a6b@127.0.0.1:18000/v1"])
def test_a_url_password_with_a_slash_or_hash_is_one_line_without_it(url: str, no_known_secrets: None) -> None:
    """aiohttp's InvalidUrlClientError traceback quoted a fragment of such a password."""
    with pytest.raises(ConfigError) as info:
        check_http_url(url, "--target")
    line = str(info.value)
    assert "\n" not in line and "AUDIT" not in line and "5a6b" not in line
    assert line.startswith("--target 'http://***@127.0.0.1:18000") and "percent-encode" in line
    assert "AUDIT" not in redact(f"connecting to {url}") and "@127.0.0.1:18000" in redact(url)


def test_bad_urls_are_one_line(no_known_secrets: None) -> None:
    for url, why in (("ftp://h", "expected an http:// or https:// URL"), ("http://h:port", "not a valid URL"),
                     ("http://:80", "no host")):
        with pytest.raises(ConfigError, match=why):
            check_http_url(url, "--target")
    check_http_url("https://alice:p%2Fw@grafana.example:3000/sub", "--grafana-url")  # a good one passes
    assert "p%2Fw" in known_secrets()


def test_the_engines_log_is_masked_in_place_keeping_every_offset(tmp_path: Path, no_known_secrets: None) -> None:
    """vLLM logs its non-default arguments, an API key among them, into the results directory."""
    log = tmp_path / "engine.log"
    text = "INFO non-default args: {'api_key': ['sk-AUDIT-SWEEP-0d9e8f7a6b']}\nstep 1\nstep 2\n"
    log.write_text(text)
    assert mask_secrets_in_log(log) == 0  # nothing known yet: left as it is
    remember_secret("sk-AUDIT-SWEEP-0d9e8f7a6b")
    assert mask_secrets_in_log(log) == 1
    masked = log.read_text()
    assert "sk-AUDIT" not in masked and len(masked) == len(text) and masked.index("step 2") == text.index("step 2")


def test_a_short_key_is_masked_in_the_engines_log_as_a_whole_word(tmp_path: Path, no_known_secrets: None) -> None:
    """A key under 8 characters was left in the log; it is masked where it stands alone, as `redact`
    hides it, and not inside other words."""
    log = tmp_path / "engine.log"
    text = "INFO non-default args: {'api_key': ['k3y9z']}\nINFO k3y9zed stays a word\n"
    log.write_text(text)
    remember_secret("k3y9z")
    assert mask_secrets_in_log(log) == 1
    masked = log.read_text()
    assert "['*****']" in masked and "k3y9zed stays" in masked and len(masked) == len(text)


def test_prose_about_bearer_tokens_is_not_a_token(no_known_secrets: None) -> None:
    assert redact("a bearer token is required on /metrics") == "a bearer token is required on /metrics"
    assert redact("sent Bearer sk-abc123 and bearer QWxhZGRp") == "sent Bearer *** and bearer ***"


def test_a_bugs_traceback_goes_through_the_filter(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], no_known_secrets: None) -> None:
    """The filter was taken off stderr before Python printed an uncaught exception's traceback."""
    import pdexporter.cli as cli

    def bug(args: list[str]) -> None:
        raise RuntimeError("unexpected: Authorization: sk-AUDIT-TB-42424242")

    monkeypatch.setattr(cli, "_main", bug)
    remember_secret("sk-AUDIT-TB-42424242")
    with pytest.raises(SystemExit) as info:
        cli.main(["run"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "RuntimeError: unexpected" in err and "sk-AUDIT-TB" not in err
    assert sys.stderr is not None


def test_a_stray_word_that_looks_like_a_key_is_not_echoed(capsys: pytest.CaptureFixture[str],
                                                           no_known_secrets: None) -> None:
    """`run -D 4 sk-...` (a key typed where no option takes it): click quoted the word back."""
    import pdexporter.cli as cli

    with pytest.raises(SystemExit) as info:
        cli.main(["run", "-D", "4", "sk-AUDITstray0123456789", "extra"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "sk-AUDITstray" not in err and "looks like a key" in err, err
    assert "extra" in err and len(err.strip().splitlines()) == 1  # a plain word is still shown, in one line


def test_the_users_openai_key_does_not_reach_an_engine_pdexporter_starts() -> None:
    """`OPENAI_API_KEY` is where pdexporter reads the key it sends (after `PDEXPORTER_API_KEY`); from
    a user's shell it is often their OpenAI key, which a local engine has no use for."""
    env = {"OPENAI_API_KEY": "sk-users-own", "OPENAI_BASE_URL": "https://api.example", "PATH": "/bin"}
    assert without_own_secrets(env) == {"OPENAI_BASE_URL": "https://api.example", "PATH": "/bin"}


@pytest.mark.parametrize("page", [
    "401: Incorrect API key provided: sk-proj-AbC1************wxyz.",
    "invalid token sk-proj-AbC1d2... (expired)",
    "key sk-proj-AbC1d2\u2026 rejected",
])
def test_a_key_cut_short_by_an_error_page_is_hidden(page: str, no_known_secrets: None) -> None:
    """A proxy or an engine that quotes the start of the key it was sent, the rest masked, gave that
    start away: hidden when it is the start of a key pdexporter holds."""
    remember_secret("sk-proj-AbC1d2E3f4G5h6I7j8K9wxyz")
    hidden = redact(page)
    assert "AbC1" not in hidden and "***" in hidden, hidden
    assert hidden.split("***")[0] == page.split("sk-proj")[0]


def test_ordinary_words_before_an_ellipsis_stay(no_known_secrets: None) -> None:
    remember_secret("sk-proj-AbC1d2E3f4G5h6I7j8K9wxyz")
    text = "loading weights... sk-other-9f8e7d... **bold** tokens***"
    assert redact(text) == text


def test_a_long_run_of_letters_is_read_once_not_once_per_start(no_known_secrets: None) -> None:
    """A report's embedded image (a base64 run of megabytes) with an ellipsis after it: the cut-short
    pattern once backtracked through the run from every start (40 KB took 21 s; a report of 4 MB would
    take days). A complexity guard, not a speed target: linear is milliseconds, quadratic is hours."""
    import base64
    import time

    remember_secret("sk-proj-AbC1d2E3f4G5h6I7j8K9wxyz")
    image = base64.b64encode(bytes(range(256)) * 4096).decode()  # 1.4 MB
    text = f"data:image/png;base64,{image} loading... sk-proj-AbC1d2..."
    started = time.perf_counter()
    hidden = redact(text)
    assert time.perf_counter() - started < 10.0
    assert hidden.endswith(" loading... ***...") and "AbC1d2" not in hidden


@pytest.mark.parametrize("run", ["a.b", "x-", "a+b"])
def test_a_long_dotted_run_beside_an_at_sign_is_read_once(run: str, no_known_secrets: None) -> None:
    """The URL-userinfo pattern rescanned a long dotted or hyphenated run from every word boundary in
    it: 90 KB with an "@" anywhere in the text took 12 s. A complexity guard, as above."""
    import time

    text = f"user@host {run * 300_000} see https://bob:pw@h/x"
    started = time.perf_counter()
    hidden = redact(text)
    assert time.perf_counter() - started < 10.0
    assert hidden.endswith("see https://bob:***@h/x")
