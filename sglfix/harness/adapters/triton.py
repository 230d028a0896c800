"""The Triton attention backend (MHA/GQA/MQA over a paged KV cache): every forward mode.

Eager: ``init_forward_metadata`` then ``forward``; graphs: the CUDA-graph runner captures at the
scenario's sizes and replays with padding (real ``torch.cuda.CUDAGraph`` on CUDA; the same
capture/replay metadata code on the same static buffers, eagerly, on CPU).
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.case import CaseAdapter
from sglfix.harness.invariants import MetadataFields

__all__ = ["ADAPTER", "TritonAdapter"]


class TritonAdapter(CaseAdapter):
    name = "triton"
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr", "mask_indptr"),
        lengths=("max_extend_len",),
        indices={"kv_indices": "kv_indptr"},
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import build_case

        case = build_case(
            mode=scenario.mode,
            prefix_lens=list(scenario.prefix_lens),
            extend_lens=list(scenario.extend_lens),
            accept_lens=list(scenario.accept_lens) if scenario.accept_lens is not None else None,
            page_size=scenario.page_size,
            num_heads=scenario.model.num_heads,
            num_kv_heads=scenario.model.num_kv_heads,
            head_dim=scenario.model.head_dim,
            dtype=scenario.model.dtype,
            topk=scenario.spec.topk,
            num_steps=scenario.spec.num_steps,
            num_draft_tokens=scenario.spec.num_draft_tokens,
            gpu_only=scenario.gpu_only,
            seed=scenario.seed,
            device=device,
            builder=scenario.builder,
            capture_bs=list(scenario.capture_bs) if scenario.capture_bs else None,
        )
        return Prepared(case=case, num_slots=case.model_runner.token_to_kv_pool.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        from sglfix.backends.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(model_runner=prepared.case.model_runner)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        rows = (
            len(forward_batch.req_pool_indices)
            if forward_batch.req_pool_indices is not None
            else forward_batch.batch_size
        )
        return [("", backend.forward_metadata, rows)]


ADAPTER = TritonAdapter()
