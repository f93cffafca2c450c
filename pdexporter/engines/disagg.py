"""Engine setups of the offloaded arm: the decode instance of a P/D pair, where a new request
arrives with its KV cache computed elsewhere (docs/disaggregation.md).

How vLLM 0.22 admits such a request (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`'s
WAITING loop, and each connector's `get_num_new_matched_tokens`):

- `DecodeBenchConnector` (one GPU, the pair's decode side with a free transfer): the connector
  claims every uncomputed prompt token but the last, synchronously, so the request is scheduled
  in the step that admits it with **1 token** and P - 1 tokens of context; the worker writes dummy
  KV values into its blocks before that step's forward pass.
- `NixlConnector`, decode side (`kv_transfer_params.do_remote_prefill`): the connector claims the
  whole prompt asynchronously; the request waits in WAITING_FOR_REMOTE_KVS and takes no step
  while the bytes move, the running decodes go on; once the load is reported done its
  num_computed_tokens is set to P - 1 and it is scheduled with **1 token**.
- `P2pNcclConnector`, decode side: synchronous like DecodeBench; the 1-token step waits inside
  the forward pass (`start_load_kv`) until the tensors have arrived.

Either way the prefill's "chunk schedule" on the decode instance is one step of one token (the
last prompt token, which samples the first output token): `admission_schedule` = (1,). vLLM's
iteration log counts that step as "1 context requests, 1 context tokens" (a new request is a
context request in `compute_iteration_details`), so with the log the window maths locates it
exactly; without it the schedule is checked against the cadence, where a 1-token step is not
required to look slow (`measure.window.schedule_confirmed`: a decode-sized chunk need not show).

The prefill instance of a pair is a normal engine (its schedule is vLLM's) that keeps the KV
blocks for the decode instance to read; its adapter says so for the records.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any, Protocol

from pdexporter.engines._registry import KvSetup, budget_problem, register
from pdexporter.engines.sim import SIM_ENGINE, SimAdapter
from pdexporter.engines.vllm import (
    DECODE_BENCH,
    DEFAULT_CHUNK_SIZE,
    KV_TRANSFER_FLAG,
    NIXL,
    P2P_NCCL,
    PAIR_CONNECTORS,
    VllmAdapter,
    connector_of,
    transfer_config_of,
)


def admission_schedule(prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
    """The steps an offloaded P-token prefill takes on the decode instance: one, of one token."""
    problem = budget_problem(chunk_size, running_decodes)
    if problem:
        raise ValueError(f"chunk size {chunk_size} beside {running_decodes} decodes: {problem}")
    if prompt_tokens < 1:
        raise ValueError(f"prompt of {prompt_tokens} tokens")
    return (1,)


def kv_transfer_config(connector: str, extra: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` JSON (KVTransferConfig forbids unknown keys)."""
    config: dict[str, Any] = {"kv_connector": connector, "kv_role": "kv_both", **fields}
    if extra:
        config["kv_connector_extra_config"] = dict(extra)
    return config


def kv_transfer_flags(config: Mapping[str, Any]) -> tuple[str, ...]:
    return (KV_TRANSFER_FLAG, json.dumps(dict(config), separators=(",", ":")))


SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"


class PairSide(Protocol):
    """One instance of a P/D pair as the sweep file gives it (`launch.specs.PairInstanceSpec`)."""

    @property
    def command(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def env(self) -> Mapping[str, str]: ...


class PairEntry(Protocol):
    """A P/D pair's sweep-file entry (`launch.specs.PairLauncherSpec`): what `check_pair` reads."""

    @property
    def prefill(self) -> PairSide: ...

    @property
    def decode(self) -> PairSide: ...

    @property
    def vars(self) -> Mapping[str, str]: ...

    @property
    def env(self) -> Mapping[str, str]: ...


def _words(instance: PairSide, variables: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The instance's command as words and its environment (leading NAME=value words included),
    with {chunk} at a placeholder value: what the checks below read."""
    text = instance.command.replace("{chunk}", str(DEFAULT_CHUNK_SIZE))
    try:
        text = text.format_map({"python": "python", **variables})
    except (KeyError, ValueError, IndexError):
        pass  # render_command reports template errors when the engine starts
    try:
        words = shlex.split(text)
    except ValueError:
        return [], dict(instance.env)
    env = dict(instance.env)
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return words, env


def _sim_role(words: list[str]) -> str | None:
    if "sim" in words and "serve" in words:
        if "--kv-role" in words and words.index("--kv-role") + 1 < len(words):
            return words[words.index("--kv-role") + 1]
        return "none"
    return None


def instance_connector(words: list[str]) -> str | None:
    """NixlConnector / P2pNcclConnector from --kv-transfer-config, or NixlConnector for the
    embedded engine in a pair role (it models NIXL); None when neither."""
    role = _sim_role(words)
    if role in ("decode", "prefill"):
        return NIXL
    return connector_of(words)


def zmq_address(words: list[str]) -> str | None:
    """P2pNcclConnector's address of one side: kv_ip:kv_port of its --kv-transfer-config."""
    config = transfer_config_of(words) or {}
    port = config.get("kv_port")
    return None if port is None else f"{config.get('kv_ip', '127.0.0.1')}:{port}"


def check_pair(spec: PairEntry) -> str | None:
    """What is wrong with a pair's sweep-file entry, in one line, or None."""
    if "{chunk}" not in spec.decode.command:
        return "decode.command: must contain {chunk} (where --max-num-batched-tokens goes)"
    if spec.prefill.url == spec.decode.url:
        return f"prefill.url and decode.url are both {spec.decode.url}: each engine needs its own port"
    p_words, p_env = _words(spec.prefill, spec.vars)
    d_words, d_env = _words(spec.decode, spec.vars)
    roles = {"prefill": _sim_role(p_words), "decode": _sim_role(d_words)}
    for side, role in roles.items():
        if role is not None and role != side:
            return f"{side}.command: the embedded engine needs --kv-role {side} (has {role})"
    p_conn, d_conn = instance_connector(p_words), instance_connector(d_words)
    for side, conn in (("prefill", p_conn), ("decode", d_conn)):
        if conn not in PAIR_CONNECTORS:
            return (f"{side}.command: needs --kv-transfer-config naming {' or '.join(PAIR_CONNECTORS)} "
                    f"(found {conn or 'none'})")
    if p_conn != d_conn:
        return f"the two instances use different KV connectors ({p_conn} and {d_conn})"
    if d_conn == P2P_NCCL and (zmq_address(p_words) is None or zmq_address(d_words) is None):
        return f"{P2P_NCCL}: both --kv-transfer-config need kv_port (and kv_ip) for the X-Request-Id addresses"
    envs = ({**spec.env, **p_env}, {**spec.env, **d_env})
    for name, what in ((SIDE_CHANNEL_PORT, "NIXL side-channel port"), ("CUDA_VISIBLE_DEVICES", "GPU")):
        a, b = envs[0].get(name), envs[1].get(name)
        if a is not None and a == b:
            return f"prefill and decode share {name}={a}: each instance needs its own {what}"
    return None


def pair_connector(spec: PairEntry) -> tuple[str, tuple[str, str] | None]:
    """The pair's connector, and for P2pNcclConnector the (prefill, decode) zmq addresses."""
    p_words, _ = _words(spec.prefill, spec.vars)
    d_words, _ = _words(spec.decode, spec.vars)
    connector = instance_connector(d_words) or NIXL
    if connector == P2P_NCCL:
        p_addr, d_addr = zmq_address(p_words), zmq_address(d_words)
        assert p_addr is not None and d_addr is not None  # check_pair saw to it
        return connector, (p_addr, d_addr)
    return connector, None



class _Offloaded(VllmAdapter):
    """The decode instance: an offloaded prefill is admitted in one 1-token step."""

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        return admission_schedule(prompt_tokens, chunk_size, running_decodes)

    def recognise(self, version_payload: Mapping[str, object]) -> bool:
        return False  # vLLM's /version does not say which connector runs: the launcher knows


@register("vllm-decode-bench")
class VllmDecodeBenchAdapter(_Offloaded):
    name = "vllm-decode-bench"
    kv = KvSetup("offloaded", DECODE_BENCH, "decode-bench")

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        # fill_std > 0: a constant fill makes every request's KV alike and the MoE routes them
        # alike, which made the decode step cheaper than on a normal engine (docs/vllm-facts.md).
        return (*super().chunk_size_flags(chunk_size),
                *kv_transfer_flags(kv_transfer_config(DECODE_BENCH, {"fill_std": 0.05})))


@register("vllm-pd-decode")
class VllmPdDecodeAdapter(_Offloaded):
    name = "vllm-pd-decode"
    kv = KvSetup("offloaded", NIXL, "decode")

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return (*super().chunk_size_flags(chunk_size),
                *kv_transfer_flags(kv_transfer_config(self.kv.connector or NIXL, kv_load_failure_policy="fail")))


@register("vllm-pd-decode-p2p")
class VllmPdDecodeP2pAdapter(VllmPdDecodeAdapter):
    name = "vllm-pd-decode-p2p"
    kv = KvSetup("offloaded", P2P_NCCL, "decode")


@register("vllm-pd-prefill")
class VllmPdPrefillAdapter(VllmAdapter):
    """The prefill instance: vLLM's own schedule; it keeps the KV for the decode instance."""

    name = "vllm-pd-prefill"
    kv = KvSetup("offloaded", NIXL, "prefill")

    def recognise(self, version_payload: Mapping[str, object]) -> bool:
        return False


# The embedded engine in each role (`pdexporter sim serve --kv-role ROLE`); its /version says the role.
SIM_KINDS: dict[str, str] = {
    "decode-bench": f"{SIM_ENGINE}-decode-bench",
    "decode": f"{SIM_ENGINE}-pd-decode",
    "prefill": f"{SIM_ENGINE}-pd-prefill",
}


class _SimRole(SimAdapter):
    def recognise(self, version_payload: Mapping[str, object]) -> bool:
        return version_payload.get("modelled") is True and version_payload.get("kv_role") == self.kv.role


@register(SIM_KINDS["decode-bench"])
class SimDecodeBenchAdapter(_SimRole):
    name = SIM_KINDS["decode-bench"]
    kv = KvSetup("offloaded", DECODE_BENCH, "decode-bench")

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        return admission_schedule(prompt_tokens, chunk_size, running_decodes)


@register(SIM_KINDS["decode"])
class SimPdDecodeAdapter(_SimRole):
    name = SIM_KINDS["decode"]
    kv = KvSetup("offloaded", NIXL, "decode")

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        return admission_schedule(prompt_tokens, chunk_size, running_decodes)


@register(SIM_KINDS["prefill"])
class SimPdPrefillAdapter(_SimRole):
    name = SIM_KINDS["prefill"]
    kv = KvSetup("offloaded", NIXL, "prefill")


__all__ = [
    "DECODE_BENCH", "KV_TRANSFER_FLAG", "NIXL", "P2P_NCCL", "PAIR_CONNECTORS", "SIDE_CHANNEL_PORT", "SIM_KINDS",
    "PairEntry", "PairSide", "admission_schedule", "check_pair", "connector_of", "instance_connector",
    "kv_transfer_config", "kv_transfer_flags", "pair_connector", "transfer_config_of",
    "zmq_address",
]
