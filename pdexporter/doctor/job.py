"""`pdexporter doctor` as a job: the options checked (`doctor_job`), the engine asked (`DoctorJob.engine`:
started if it is the embedded one, its spans awaited with --traces), the endpoints and the engine's
tracing imports checked (`DoctorJob.checks`), and the verdicts told (`checks_sheet`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pdexporter._internal.redact import redact_url
from pdexporter._internal.sheet import Column, Plain, Sheet, Shown
from pdexporter._internal.urls import check_http_url
from pdexporter.doctor.checks import Check, EndpointFacts, EngineFacts, TraceArrival, evaluate
from pdexporter.engines import DEFAULT_CHUNK_SIZE, UNIDENTIFIED, adapter
from pdexporter.errors import ConfigError
from pdexporter.exporter.server import parse_listen
from pdexporter.launch import TraceDirected
from pdexporter.launch.choose import make_launcher
from pdexporter.launch.external import engine_command_words

__all__ = [
    "EMBEDDED_CHUNK_SIZE", "STYLE", "DoctorJob", "checks_sheet", "doctor_job",
]


STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
EMBEDDED_CHUNK_SIZE = DEFAULT_CHUNK_SIZE  # `sim serve`'s default, as vLLM's


@dataclass
class DoctorJob:
    target: str | None
    engine_name: str | None
    chunk_size: int | None
    prometheus: str | None
    otlp: str | None
    model: str | None
    token: str | None
    profile: str
    engine_python: str | None
    engine_command: str | None
    receiver: tuple[str, int] | None
    traces_wait: float

    @property
    def asking(self) -> str:
        """What the engine step is doing, in words."""
        return "starting the embedded engine ..." if self.target is None else f"asking {redact_url(self.target)} ..."

    async def engine(self) -> tuple[EngineFacts, TraceArrival | None]:
        return await _engine(self.target, self.chunk_size, self.model, self.token, self.profile, self.receiver,
                             self.traces_wait, self.engine_name)

    def checks(self, facts: EngineFacts, arrival: TraceArrival | None) -> list[Check]:
        """The endpoints and the engine's tracing imports checked; every verdict."""
        from pdexporter.doctor.gather import engine_python as python_of
        from pdexporter.doctor.gather import otlp_facts, prometheus_facts, tracing_imports

        endpoints: list[EndpointFacts] = [prometheus_facts(self.prometheus), otlp_facts(self.otlp)]
        python, source = self.engine_python, "--engine-python"
        if python is None and self.engine_command is not None:
            python, source = python_of(self.engine_command), "--engine-command"
            if python is None:
                shown = " ".join(engine_command_words(self.engine_command) or ())
                raise ConfigError(f"--engine-command {shown!r}: cannot tell which Python it runs in "
                                  "(its first word is neither a Python nor a script with a #! line); give "
                                  "--engine-python")
        kind = facts.engine or facts.engine_claimed or UNIDENTIFIED
        # an engine whose traces pdexporter does not read (SGLang) has no imports to check
        imports = (tracing_imports(python, source, kind, embedded=self.target is None)
                   if adapter(kind).tracing_imports else None)
        return evaluate(facts, endpoints, imports, arrival)


def doctor_job(*, target: str | None, engine: str | None, chunk_size: int | None, prometheus: str | None,
               otlp: str | None, model: str | None, api_key_file: Path | None, profile: str,
               engine_python: str | None, engine_command: str | None, traces: bool, traces_receiver: str,
               traces_wait: float) -> DoctorJob:
    """The options checked before anything starts (one line naming the option)."""
    from pdexporter.client.client import resolve_api_key

    for url, flag in ((target, "--target"), (prometheus, "--prometheus")):
        if url is not None:
            check_http_url(url, flag)
    token = resolve_api_key(api_key_file)
    engine_command_words(engine_command)  # one line if it cannot be split (not echoed: it may hold a key)
    try:
        receiver = parse_listen(traces_receiver) if traces else None
    except ConfigError:
        raise ConfigError(f"--traces-receiver {traces_receiver!r}: expected HOST:PORT") from None
    return DoctorJob(target, engine, chunk_size, prometheus, otlp, model, token, profile, engine_python,
                     engine_command, receiver, traces_wait)


async def _engine(target: str | None, chunk_size: int | None, model: str | None, token: str | None,
                  profile: str, receiver: tuple[str, int] | None,
                  traces_wait: float, engine: str | None = None) -> tuple[EngineFacts, TraceArrival | None]:
    from pdexporter.doctor.gather import engine_facts, listen_for_traces, trace_arrival

    launcher = make_launcher(target, chunk_size=chunk_size, profile=profile, engine=engine)
    listener = None
    if receiver is not None and target is None and isinstance(launcher, TraceDirected):
        # the embedded engine is told where to send: doctor's own receiver on a free local port
        listener = await listen_for_traces("127.0.0.1", 0)
        receiver = ("127.0.0.1", listener.port)
        launcher.send_traces_to(f"http://127.0.0.1:{listener.port}/v1/traces")
    capture = None
    if target is None:
        from pdexporter.sim.profile import load_profile

        chunk_size = chunk_size or EMBEDDED_CHUNK_SIZE
        sizes = load_profile(profile).engine.capture_sizes(chunk_size)  # vLLM's rule, with this chunk size
        capture = max(sizes) if sizes else None
    try:
        handle = await launcher.start(chunk_size or EMBEDDED_CHUNK_SIZE)
        facts = await engine_facts(handle, embedded=target is None, model=model, api_key=token,
                                   chunk_size=chunk_size, cudagraph_max_tokens=capture)
        arrival = None
        if receiver is not None:
            served = [str(m.get("id")) for m in facts.models or ()]
            chosen = model if model in served else (served[0] if served else None)
            if facts.health_error is not None or chosen is None:
                arrival = TraceArrival(f"http://{receiver[0]}:{receiver[1]}/v1/traces",
                                       error="no request could be sent (see the engine checks)")
            else:
                kind = facts.engine or facts.engine_claimed or UNIDENTIFIED
                arrival = await trace_arrival(handle.url, chosen, receiver, kind, api_key=token,
                                              wait_s=traces_wait, listener=listener)
        return facts, arrival
    finally:
        if listener is not None:
            await listener.stop()
        await launcher.stop()


def checks_sheet(checks: list[Check], engine: EngineFacts) -> list[Shown]:
    """The verdicts as a table, and the count of each."""
    where = "the embedded engine (modelled)" if engine.embedded else engine.url
    table = Sheet(f"pdexporter doctor: {where}", [Column("check", no_wrap=True), Column("verdict", no_wrap=True),
                                                  Column("why")], style="left")
    for check in checks:
        table.add_row(check.name, f"[{STYLE[check.status]}]{check.status}[/]", check.why)
    counts = {s: sum(1 for c in checks if c.status == s) for s in STYLE}
    verdict = "FAIL" if counts["fail"] else ("OK, with warnings" if counts["warn"] else "OK")
    return [table, Plain(f"{verdict}: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, "
                         f"{counts['skip']} skipped")]
