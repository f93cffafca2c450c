"""What `pdexporter run` exposes, over real HTTP(S) (docs/security.md; issue 24): /metrics on one
port, behind a bearer token when one is set (the health paths stay open); the OTLP trace receiver
only when asked for (`--passive` or `--traces-listen`), on a port of its own, behind its own
token; both over TLS with `--tls-cert-file`. The engine is ScriptedEngine, a TEST DOUBLE."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import aiohttp
import pytest

from pdexporter.client.traces import PROTOBUF, RequestTrace, encode_traces
from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner
from pdexporter.launch import ExternalLauncher
from tests.helpers import free_port, until
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.integration

B, D, P = 2048, 2, 64


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdexporter test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def _config(url: str, **fields: object):  # type: ignore[no-untyped-def]
    return build_config(
        probe_streams=D,
        chunk_size=B,
        prefill_tokens=P,
        target=url,
        listen_host="127.0.0.1",
        listen_port=0,
        protocol={"decode_context_tokens": 64, "decode_output_tokens": 160},
        **fields,
    )


async def _serving(runner: Runner, stop: asyncio.Event) -> asyncio.Task[None]:
    task = asyncio.create_task(runner.run(stop))
    await until(lambda: runner.bound_port is not None or task.done(), 30, "the metrics server")
    return task


async def test_tokens_guard_metrics_and_traces_and_the_health_paths_stay_open(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    tls = ssl.create_default_context(cafile=str(cert))
    traces_port = free_port()
    body = encode_traces([RequestTrace("cmpl-1", 1, 2, prompt_tokens=10, ttft_s=0.0)], engine="vllm")
    async with ScriptedEngine(cadence_s=0.01) as engine:
        runner = Runner(
            _config(
                engine.url,
                traces_receiver=True,
                traces_listen_host="127.0.0.1",
                traces_listen_port=traces_port,
                tls_cert_file=cert,
                tls_key_file=key,
            ),
            ExternalLauncher(engine.url, B),
            metrics_token="m-token",
            traces_token="t-token",
        )
        stop = asyncio.Event()
        task = await _serving(runner, stop)
        base, traces = f"https://127.0.0.1:{runner.bound_port}", f"https://127.0.0.1:{traces_port}/v1/traces"
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as s:

                async def get(path: str, token: str | None = None) -> int:
                    headers = {"Authorization": f"Bearer {token}"} if token else {}
                    async with s.get(base + path, headers=headers) as resp:
                        return resp.status

                async def post(url: str, token: str | None = None) -> int:
                    headers = {
                        "Content-Type": PROTOBUF,
                        **({"Authorization": f"Bearer {token}"} if token else {}),
                    }
                    async with s.post(url, data=body, headers=headers) as resp:
                        return resp.status

                assert [await get("/livez"), await get("/readyz")] == [200, 200]
                assert [await get("/metrics"), await get("/metrics", "t-token"), await get("/")] == [
                    401,
                    401,
                    401,
                ]
                assert await get("/metrics", "m-token") == 200
                assert await post(f"{base}/v1/traces", "m-token") in (404, 405)  # not on the metrics port
                assert [await post(traces), await post(traces, "m-token")] == [401, 401]
                # with the right token: 503 `engine-unknown` (Retry-After) until the runner has identified the
                # engine, which a loaded machine can delay; an OTLP exporter retries, so does this client
                deadline = asyncio.get_running_loop().time() + 20.0
                while (status := await post(traces, "t-token")) == 503 and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.2)
                assert status == 200
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(f"http://127.0.0.1:{runner.bound_port}/livez") as r,
                ):
                    await r.read()
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)


async def test_without_passive_nothing_listens_for_traces() -> None:
    traces_port = free_port()
    async with ScriptedEngine(cadence_s=0.01) as engine:
        runner = Runner(_config(engine.url, traces_listen_port=traces_port), ExternalLauncher(engine.url, B))
        stop = asyncio.Event()
        task = await _serving(runner, stop)
        try:
            with pytest.raises(aiohttp.ClientConnectorError):
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(f"http://127.0.0.1:{traces_port}/v1/traces") as r,
                ):
                    await r.read()
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    f"http://127.0.0.1:{runner.bound_port}/v1/traces",
                    data=b"",
                    headers={"Content-Type": PROTOBUF},
                ) as resp,
            ):
                assert resp.status in (404, 405)
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)
