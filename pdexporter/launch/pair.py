"""A P/D pair on one host: two engines (a prefill and a decode instance) started, health-waited,
adopted, released and stopped together (docs/disaggregation.md).

Each instance is a launcher of its own (`LocalLauncher` with `role` "prefill" / "decode": its
state and log in `{chunk}/engine/{role}/`, its own command and environment, its process group
stopped by `base.terminate_group`; or a real-time `SimLauncher` with `kv_role`). `PairLauncher`
is a `Launcher` whose handle is the decode instance's (the probes run there); the prefill
instance's handle is `prefill_handle`. `check_pair` holds a pair's sweep-file entry to what the
two vLLM servers need: the same KV connector on both (NixlConnector, or P2pNcclConnector with
each side's zmq address), distinct ports, GPUs and NIXL side-channel ports.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdexporter.engines.disagg import NIXL, P2P_NCCL, PAIR_CONNECTORS, connector_of, transfer_config_of
from pdexporter.launch.base import EngineHandle, Launcher

if TYPE_CHECKING:
    from pdexporter.sweep.spec import PairInstanceSpec, PairLauncherSpec

SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _words(instance: PairInstanceSpec, variables: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The instance's command as words and its environment (leading NAME=value words included),
    with {chunk} at a placeholder value: what the checks below read."""
    text = instance.command.replace("{chunk}", "8192")
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


def check_pair(spec: PairLauncherSpec) -> str | None:
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


def pair_connector(spec: PairLauncherSpec) -> tuple[str, tuple[str, str] | None]:
    """The pair's connector, and for P2pNcclConnector the (prefill, decode) zmq addresses."""
    p_words, _ = _words(spec.prefill, spec.vars)
    d_words, _ = _words(spec.decode, spec.vars)
    connector = instance_connector(d_words) or NIXL
    if connector == P2P_NCCL:
        p_addr, d_addr = zmq_address(p_words), zmq_address(d_words)
        assert p_addr is not None and d_addr is not None  # check_pair saw to it
        return connector, (p_addr, d_addr)
    return connector, None


@dataclass
class PairLauncher:
    """Two launchers as one: `start` brings both up (concurrently) at the decode instance's chunk
    size and returns the decode handle; every other verb goes to both."""

    prefill: Launcher
    decode: Launcher
    prefill_chunk_size: int | None = None  # None: the same as the decode instance's
    name: str = "pair"
    prefill_handle: EngineHandle | None = field(default=None, init=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return self.decode.can_set_chunk_size

    @property
    def adopted(self) -> bool:
        from pdexporter.launch.base import Adopting

        return all(isinstance(x, Adopting) and x.adopted for x in (self.prefill, self.decode))

    def can_adopt(self, chunk_size: int) -> bool:
        from pdexporter.launch.base import Adopting

        return all(isinstance(x, Adopting) and x.can_adopt(c)
                   for x, c in ((self.prefill, self.prefill_chunk_size or chunk_size), (self.decode, chunk_size)))

    async def start(self, chunk_size: int) -> EngineHandle:
        prefill, decode = await asyncio.gather(
            self.prefill.start(self.prefill_chunk_size or chunk_size), self.decode.start(chunk_size),
            return_exceptions=True)
        for result in (prefill, decode):
            if isinstance(result, BaseException):
                await self.stop()
                raise result
        assert isinstance(prefill, EngineHandle) and isinstance(decode, EngineHandle)
        self.prefill_handle = prefill
        return decode

    async def prestart(self, chunk_size: int) -> None:
        from pdexporter.launch.base import Prestarting

        for launcher, chunk in ((self.prefill, self.prefill_chunk_size or chunk_size), (self.decode, chunk_size)):
            if isinstance(launcher, Prestarting):
                await launcher.prestart(chunk)

    async def stop(self) -> None:
        self.prefill_handle = None
        await asyncio.gather(self.prefill.stop(), self.decode.stop())

    def release(self) -> None:
        from pdexporter.launch.base import Releasing

        for launcher in (self.prefill, self.decode):
            if isinstance(launcher, Releasing):
                launcher.release()


__all__ = ["NVLINK_MULTICAST_OFF", "PairLauncher", "check_pair", "instance_connector", "pair_connector"]
