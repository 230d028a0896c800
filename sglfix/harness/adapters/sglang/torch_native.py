"""Replays ``backend: torch_native`` scenarios (DECODE, EXTEND with and without prefixes, a
sliding-window layer in both) through the installed sglang's own ``TorchNativeAttnBackend``, built
as production builds it (``ATTENTION_BACKENDS["torch_native"]``).

The backend keeps no metadata of its own (but a sliding-window pool's translated write
locations): its forward reads the batch itself, request by request (``req_to_token[
req_pool_indices[i], :seq_lens[i]]``, ``extend_prefix_lens``, ``extend_seq_lens``), and builds each
request's window mask there. Those batch fields are its metadata view (the invariant table's
lengths, and what a mutant's digest compares); the output is judged against sglfix's reference.
It runs eagerly on any device (no CUDA graphs: the backend captures none).

Everything else is the Triton adapter's (``sglang.triton``): the case over the kit's dense mock
runner, the scattered slot layout, the ground truth.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["ADAPTER", "SglangTorchNativeAdapter"]


class SglangTorchNativeAdapter(SglangTritonAdapter):
    name = "torch_native"
    registry_name = "torch_native"
    persistent: tuple[str, ...] = ()
    metadata_fields = MetadataFields(lengths=("seq_lens", "extend_prefix_lens", "extend_seq_lens"))

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode not in ("DECODE", "EXTEND"):
            raise Unavailable(f"TorchNativeAttnBackend runs DECODE and EXTEND, not {scenario.mode}")
        return super().build(scenario, device=device)

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if scenario.capture_bs:
            raise Unavailable("TorchNativeAttnBackend captures no CUDA graphs")
        return super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """What the forward reads of the batch, and the write locations the backend translated."""
        view = SimpleNamespace(
            req_pool_indices=forward_batch.req_pool_indices,
            seq_lens=forward_batch.seq_lens,
            extend_prefix_lens=getattr(forward_batch, "extend_prefix_lens", None),
            extend_seq_lens=getattr(forward_batch, "extend_seq_lens", None),
            swa_out_cache_loc=getattr(backend, "swa_out_cache_loc", None),
        )
        return [("", view, int(forward_batch.batch_size))]


ADAPTER = SglangTorchNativeAdapter()
