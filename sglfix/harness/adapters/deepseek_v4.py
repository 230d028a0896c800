"""The DeepSeek-V4 backend's decode path (its sliding-window layers): plain DECODE through
``DeepseekV4AttnBackend`` and the multi-step EAGLE draft (``DRAFT_DECODE``, topk 1) through
``DeepseekV4MultiStepBackend``.

Structured as the FlashInfer adapters: eager runs do the metadata init then the forward (every
draft step, through the worker's ``draft_forward``); graph runs go through the CUDA-graph runner
(plain decode) or the EAGLE draft runner, captured at the scenario's sizes and replayed with
padding. Triton kernels only (compiled on CUDA, interpreted on CPU): nothing to check for. The
draft is judged step by step: one metadata view per attention step, outputs packed in (request,
step) order, against a reference that sees each query's sliding window only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.case import CaseAdapter
from sglfix.harness.invariants import MetadataFields

__all__ = ["ADAPTER", "DeepseekV4Adapter"]


class DeepseekV4Adapter(CaseAdapter):
    name = "deepseek_v4"
    metadata_fields = MetadataFields(
        lengths=("seq_lens_casual", "positions_casual", "swa_topk_lengths"),
        block_tables={
            # The compressors' page table: a row's first ceil(seq_len / 256) pages must be the pool's.
            "page_table": ("seq_lens_casual", "page_size"),
            # The window's slots, one per token (page size 1): the first swa_topk_lengths are read.
            "swa_page_indices": ("swa_topk_lengths", "swa_index_page_size"),
        },
        locations=("raw_out_loc",),
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        from sglfix.backends.test.kits.attention_unittest.attention_methods.dsv4_draft import (
            build_dsv4_decode_case,
            build_dsv4_draft_decode_case,
        )

        model = scenario.model
        common = dict(
            prefix_lens=list(scenario.prefix_lens),
            page_size=scenario.page_size,
            num_heads=model.num_heads,
            kv_lora_rank=model.kv_lora_rank,
            qk_rope_head_dim=model.qk_rope_head_dim,
            dtype=model.dtype,
            seed=scenario.seed,
            device=device,
            max_context_len=scenario.max_context_len,
            capture_bs=list(scenario.capture_bs) if scenario.capture_bs else None,
        )
        if scenario.mode == "DRAFT_DECODE":
            case = build_dsv4_draft_decode_case(topk=scenario.spec.topk, num_steps=scenario.spec.num_steps, **common)
        elif scenario.mode == "DECODE":
            case = build_dsv4_decode_case(**common)
        else:
            raise ValueError(f"the {self.name} adapter runs DECODE and DRAFT_DECODE, not {scenario.mode}")
        return Prepared(case=case, num_slots=case.model_runner.token_to_kv_pool.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        return prepared.case.make_backend()

    def _v(self, case: Any) -> Any:
        # The MLA draft writes the latent from k alone (the draft runner keeps no v).
        return None if case.draft else case.v

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        steps = getattr(backend, "attn_backends", None)
        if steps is not None:
            # The attention steps only (num_steps - 1 of the num_steps children), each covering
            # every request of the live (padded) batch.
            rows = forward_batch.batch_size * backend.topk
            return [
                (f"step {i}", _view(step), rows) for i, step in enumerate(steps[: backend.speculative_num_steps - 1])
            ]
        return [("", _view(backend), forward_batch.batch_size)]


def _view(backend: Any) -> Any:
    metadata = backend.forward_metadata
    if metadata is None:
        return None
    # The window indices are token slots: checked as a block table of page size 1.
    return SimpleNamespace(**vars(metadata.core_attn_metadata), swa_index_page_size=1)


ADAPTER = DeepseekV4Adapter()
