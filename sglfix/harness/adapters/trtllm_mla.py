"""The TRT-LLM MLA backend (latent KV pool, dense block table): DRAFT_EXTEND and DRAFT_EXTEND_V2.

Both modes lay the batch out as the backend's CUDA graphs capture it: every request extends a
window of ``spec.num_draft_tokens`` tokens and ``accept_lens`` only feed the spec input's accept
lengths. Eager: ``init_forward_metadata`` then ``forward``; graphs: the CUDA-graph runner
captures at the scenario's sizes and replays with padding. The kernel is a stand-in for the
Blackwell-only trtllm-gen kernel over the same block table, ``seq_lens_k`` and q layout.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared, require_flashinfer
from sglfix.harness.adapters.case import CaseAdapter
from sglfix.harness.invariants import MetadataFields

__all__ = ["ADAPTER", "TrtllmMLAAdapter"]


class TrtllmMLAAdapter(CaseAdapter):
    name = "trtllm_mla"

    def check_available(self, device: str) -> None:
        require_flashinfer(device)

    metadata_fields = MetadataFields(
        indptr=("cu_seqlens_q",),
        lengths=("seq_lens_q", "seq_lens_k", "max_seq_len_q", "max_seq_len_k", "sum_seq_lens_q"),
        block_tables={"block_kv_indices": ("seq_lens_k", "page_size")},
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        from sglfix.backends.test.kits.attention_unittest.attention_methods.mla_draft_extend import (
            build_mla_draft_extend_case,
        )

        model = scenario.model
        case = build_mla_draft_extend_case(
            mode=scenario.mode,
            prefix_lens=list(scenario.prefix_lens),
            accept_lens=list(scenario.accept_lens),
            num_draft_tokens=scenario.spec.num_draft_tokens,
            num_steps=scenario.spec.num_steps,
            page_size=scenario.page_size,
            num_heads=model.num_heads,
            kv_lora_rank=model.kv_lora_rank,
            qk_rope_head_dim=model.qk_rope_head_dim,
            dtype=model.dtype,
            seed=scenario.seed,
            device=device,
            max_context_len=scenario.max_context_len,
            capture_bs=list(scenario.capture_bs) if scenario.capture_bs else None,
            gpu_only=scenario.gpu_only,
        )
        return Prepared(case=case, num_slots=case.model_runner.token_to_kv_pool.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        from sglfix.backends.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend

        return TRTLLMMLABackend(model_runner=prepared.case.model_runner)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        rows = (
            len(forward_batch.req_pool_indices)
            if forward_batch.req_pool_indices is not None
            else forward_batch.batch_size
        )
        metadata = backend.forward_decode_metadata
        # The block-table check needs the page size, which the metadata does not carry.
        view = SimpleNamespace(**vars(metadata), page_size=backend.page_size) if metadata is not None else None
        return [("", view, rows)]


ADAPTER = TrtllmMLAAdapter()
