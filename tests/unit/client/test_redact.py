"""What never reaches a file or a line pdexporter writes (`_internal.redact`; issue 24): values of
secret-looking names (DB_CREDS and the like too), wherever they were substituted, URL passwords,
and what an engine says with a 401."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import pytest

from pdexporter._internal.redact import (
    RedactingStream,
    forget_secrets,
    redact,
    redact_json,
    redact_text,
    redact_url,
    remember_secret,
    secret_name,
    secret_values,
)
from pdexporter._internal.secretfile import secret_text
from pdexporter.client.client import EngineClient
from pdexporter.client.sse import http_error
from pdexporter.errors import EngineError
from pdexporter.launch.local import render_command


@pytest.mark.parametrize(
    "name",
    [
        "DB_CREDS",
        "GCP_CREDENTIALS",
        "MY_SECRET_X",
        "client-secret",
        "DB_PASSWORD",
        "PGPASSWORD",
        "HF_TOKEN",
        "hfToken",
        "ACCESSTOKEN",
        "api-key",
        "API_KEYS",
        "VLLM_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "apikey",
        "PAT",
        "auth",
    ],
)
def test_secret_looking_names(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "max-num-batched-tokens",
        "max-tokens",
        "tokenizer",
        "tokenizer-mode",
        "model",
        "CUDA_VISIBLE_DEVICES",
        "gpu-memory-utilization",
        "kv-cache-dtype",
        "port",
        "enable-prefix-caching",
    ],
)
def test_ordinary_names(name: str) -> None:
    assert not secret_name(name)


def test_url_passwords_go_wherever_a_url_is() -> None:
    assert redact_url("https://alice:s3cret@vllm:8000/v1") == "https://alice:***@vllm:8000/v1"
    assert (
        redact_url("cannot connect to http://tok@h:1/x: refused")
        == "cannot connect to http://***@h:1/x: refused"
    )
    assert redact_url("http://vllm:8000 and pg://u:p@db/x") == "http://vllm:8000 and pg://u:***@db/x"
    assert (
        redact_url(redact_url("http://a:b@h")) == "http://a:***@h"
    )  # Grafana's own redaction passes through
    assert (
        redact_text("key sk-abcdef and http://a:bcde@h", ["sk-abcdef", "ab"]) == "key *** and http://a:***@h"
    )


def test_a_secret_variable_is_hidden_wherever_it_was_substituted() -> None:
    rendered = render_command(
        "DSN={dsn} vllm serve {model} --hf-auth {DB_CREDS} x{DB_CREDS}y --max-num-batched-tokens {chunk}",
        8192,
        {"DB_CREDS": "hunter2-db", "model": "qwen", "dsn": "pg://u:p@db/x"},
    )
    assert "hunter2-db" in rendered.argv  # the engine gets the value
    text = " ".join(rendered.redacted)
    assert "hunter2-db" not in text and "x***y" in text and "qwen" in text and "8192" in text
    assert "DSN=pg://u:***@db/x" in text
    assert secret_values(argv=["--api-key", "sk-1", "--token=t-2", "HF_TOKEN=h-3", "--port", "80"]) == [
        "sk-1",
        "t-2",
        "h-3",
    ]


async def test_a_url_password_becomes_a_basic_header_and_leaves_the_url() -> None:
    client = EngineClient("http://alice:p%40ss@127.0.0.1:1/")
    try:
        assert client.base_url == "http://127.0.0.1:1"
        assert client._headers()["Authorization"] == "Basic YWxpY2U6cEBzcw=="  # alice:p@ss
        with pytest.raises(EngineError) as info:
            await client.get_text("/health", retry=False)
        assert "alice" not in str(info.value) and "127.0.0.1:1" in str(info.value)
    finally:
        await client.aclose()
    assert str(EngineError("cannot connect to http://u:pw@h:1/x")) == "cannot connect to http://u:***@h:1/x"


def test_a_401_body_is_not_echoed() -> None:
    """An auth proxy echoed the bearer token it was given in its 401 body (the audit)."""
    error = http_error("http://vllm:8000/v1/models", 401, b'{"error": "invalid token sk-abc123"}')
    assert "sk-abc123" not in str(error) and "--api-key-file" in str(error) and error.status == 401
    assert "overloaded" in str(http_error("http://vllm:8000/x", 503, b'{"error": "overloaded"}'))


@pytest.fixture
def no_known_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


def test_secrets_the_process_holds_are_hidden_by_value_in_every_form(no_known_secrets: None) -> None:
    """Issue 31: a 5xx body quoting the request's Authorization header was printed as it came."""
    EngineClient("http://alice:pw-hunter2@127.0.0.1:1/", api_key=None)  # remembered where it is read
    basic = base64.b64encode(b"alice:pw-hunter2").decode()
    secret_text("sk-the-api-key-0123\n", "--api-key-file k")
    text = (f"500: proxy saw Authorization: Basic {basic} and key sk-the-api-key-0123 "
            f"({base64.b64encode(b'sk-the-api-key-0123').decode()}), url http://alice:pw-hunter2@h, pw-hunter2")
    hidden = redact(text)
    for form in ("pw-hunter2", basic, "sk-the-api-key-0123", base64.b64encode(b"sk-the-api-key-0123").decode()):
        assert form not in hidden, hidden
    assert hidden.startswith("500: proxy saw Authorization: Basic ***")
    assert str(EngineError(text)) == hidden  # every error line


def test_quoted_authorization_values_are_hidden_even_when_not_known(no_known_secrets: None) -> None:
    assert redact('{"authorization": "Bearer abc.def-123"}') == '{"authorization": "Bearer ***"}'
    assert redact("Authorization=Bearer%20zz-top-9 rest") == "Authorization=Bearer%20*** rest"
    assert redact("got bearer QWxhZGRpbjpvcGVu here") == "got bearer *** here"
    assert redact("a basic setting, the token count 12") == "a basic setting, the token count 12"
    # the bracket that closes the text around a header is the text's (it was swallowed with the value)
    assert redact("(sent Authorization: Bearer sk-abc123def)") == "(sent Authorization: Bearer ***)"
    assert redact("[authorization=Basic YWxpY2U6cEBzcw==]") == "[authorization=Basic ***]"
    assert redact("<Authorization: token ghp_0123456789>") == "<Authorization: token ***>"


def test_short_values_are_hidden_as_whole_words_and_numbers_stay_json(no_known_secrets: None) -> None:
    remember_secret("pass")
    remember_secret("2048")  # a short number is never hidden: it would corrupt P=2048 in a table
    assert redact("passed the pass: 2048") == "passed the ***: 2048"
    remember_secret("98765432109")
    text = redact_json(json.dumps({"n": 98765432109, "s": "key 98765432109", "t": "x"}))
    assert json.loads(text) == {"n": 98765432109, "s": "key ***", "t": "x"}


def test_what_the_cli_prints_goes_through_redact(no_known_secrets: None) -> None:
    buffer = io.StringIO()
    stream = RedactingStream(buffer)  # type: ignore[arg-type]
    remember_secret("sk-stream-secret-1")
    stream.write("token sk-stream-secret-1\n")
    assert buffer.getvalue() == "token ***\n" and stream.isatty() is False
