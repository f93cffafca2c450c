"""The embedded engine's KV connectors: the scheduler side of vLLM 0.22's DecodeBenchConnector and
NixlConnector, as pure code (`scheduler.SchedulerConnector`). Which one an engine runs is its
role (`pdexporter sim serve --kv-role`, docs/disaggregation.md):

- `decode-bench` (`DecodeBenchConnector`, vllm/distributed/kv_transfer/kv_connector/v1/
  decode_bench_connector.py): every new request gets its uncomputed prompt tokens but the last
  "filled", synchronously, once (`_filled_requests`); the engine charges the fill to the step's
  GPU time (`StepTimeParams.kv_fill_bandwidth_efficiency`).
- `decode` (`NixlConnector`, decode side, nixl/scheduler.py): a request whose kv_transfer_params
  say `do_remote_prefill` claims its whole prompt asynchronously; the engine models the transfer
  (`Profile.kv_transfer`) and reports it done. The fields NIXL's metadata needs must be there.
- `prefill` (`NixlConnector`, prefill side): a request with `do_remote_decode` is a normal
  prefill; when it finishes it answers with the kv_transfer_params NIXL returns
  (`NixlConnectorScheduler.request_finished`), naming its blocks for the decode instance.

The blocks themselves are not kept for the decode instance to read (vLLM's `delay_free_blocks`
lease): the embedded decode instance models the read, it does not perform it. MODELLED.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pdexporter.sim.scheduler import Request

KvRole = Literal["decode-bench", "decode", "prefill"]
KV_ROLES: tuple[str, ...] = ("decode-bench", "decode", "prefill")
# What NixlConnector's decode side needs in kv_transfer_params (nixl/metadata.py, 0.22).
REMOTE_FIELDS = ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port")


class KvParamsError(ValueError):
    """kv_transfer_params the connector cannot act on; the server answers 400 with this text."""


@dataclass
class DecodeBenchConnector:
    """Fill all uncomputed tokens but the last (which will be decoded), synchronously, once."""

    _filled: set[str] = field(default_factory=set)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        if request.request_id in self._filled:
            return 0, False
        return max(0, (request.num_tokens - num_computed_tokens) - 1), False

    def update_state_after_alloc(self, request: Request, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._filled.add(request.request_id)

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> dict | None:
        self._filled.discard(request.request_id)
        return None


def check_decode_params(params: Any) -> None:
    """kv_transfer_params a decode instance can load from, or a one-line `KvParamsError`."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise KvParamsError("kv_transfer_params must be an object")
    if params.get("do_remote_prefill"):
        missing = [name for name in REMOTE_FIELDS if params.get(name) is None]
        if missing:
            raise KvParamsError(f"kv_transfer_params with do_remote_prefill lacks {', '.join(missing)}")


@dataclass
class NixlDecodeConnector:
    """The decode side: a remote prefill's whole prompt is loaded asynchronously."""

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if params is not None and params.get("do_remote_prefill"):
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request: Request, num_external_tokens: int) -> None:
        return None

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> dict | None:
        return None


@dataclass
class NixlPrefillConnector:
    """The prefill side: a `do_remote_decode` request answers with where its KV is."""

    host: str = "localhost"
    port: int = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT's default
    tp_size: int = 1
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, num_external_tokens: int) -> None:
        return None

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> dict | None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return None
        return {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": list(block_ids),
            "remote_engine_id": self.engine_id, "remote_request_id": request.request_id,
            "remote_host": self.host, "remote_port": self.port, "tp_size": self.tp_size,
            "remote_num_tokens": request.num_prompt_tokens,
        }


def connector_for(role: str | None, *, host: str = "localhost", port: int = 5600):
    """The scheduler connector of a role (None: no connector, a plain engine)."""
    if role in (None, "none"):
        return None
    if role == "decode-bench":
        return DecodeBenchConnector()
    if role == "decode":
        return NixlDecodeConnector()
    if role == "prefill":
        return NixlPrefillConnector(host=host, port=port)
    raise ValueError(f"unknown KV role {role!r}; known: {', '.join(KV_ROLES)}")


__all__ = [
    "KV_ROLES", "DecodeBenchConnector", "KvParamsError", "KvRole", "NixlDecodeConnector", "NixlPrefillConnector",
    "check_decode_params", "connector_for",
]
