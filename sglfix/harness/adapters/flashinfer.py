"""The FlashInfer backends' decode path (GQA here, MLA in ``flashinfer_mla``): plain DECODE
through ``FlashInferAttnBackend`` and the multi-step EAGLE draft (``DRAFT_DECODE``) through
``FlashInferMultiStepDraftBackend``.

Eager: metadata init then the forward (every draft step); graphs: plain decode through the
CUDA-graph runner, the draft through the EAGLE draft runner, both captured at the scenario's sizes
and replayed with padding (FlashInfer and real graphs on CUDA, torch stand-ins and the same
capture/replay metadata code on CPU). The draft is judged step by step: one metadata view per
attention step, and its outputs packed in (request, branch, step) order.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.base import Prepared, require_flashinfer
from sglfix.harness.adapters.case import CaseAdapter
from sglfix.harness.invariants import MetadataFields

__all__ = ["ADAPTER", "FlashInferAdapter"]


class FlashInferAdapter(CaseAdapter):
    name = "flashinfer"
    mla = False
    metadata_fields = MetadataFields(indptr=("kv_indptr",), indices={"kv_indices": "kv_indptr"})

    def check_available(self, device: str) -> None:
        require_flashinfer(device)

    def _model_shape(self, model: Any) -> dict:
        return dict(num_kv_heads=model.num_kv_heads, head_dim=model.head_dim)

    def build(self, scenario: Any, *, device: str) -> Prepared:
        from sglfix.backends.test.kits.attention_unittest.attention_methods.draft_decode import (
            build_decode_case,
            build_draft_decode_case,
        )

        common = dict(
            mla=self.mla,
            prefix_lens=list(scenario.prefix_lens),
            page_size=scenario.page_size,
            num_heads=scenario.model.num_heads,
            dtype=scenario.model.dtype,
            seed=scenario.seed,
            device=device,
            max_context_len=scenario.max_context_len,
            capture_bs=list(scenario.capture_bs) if scenario.capture_bs else None,
            **self._model_shape(scenario.model),
        )
        if scenario.mode == "DRAFT_DECODE":
            case = build_draft_decode_case(topk=scenario.spec.topk, num_steps=scenario.spec.num_steps, **common)
        elif scenario.mode == "DECODE":
            case = build_decode_case(**common)
        else:
            raise ValueError(f"the {self.name} adapter runs DECODE and DRAFT_DECODE, not {scenario.mode}")
        return Prepared(case=case, num_slots=case.model_runner.token_to_kv_pool.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        return prepared.case.make_backend()

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        steps = getattr(backend, "attn_backends", None)
        if steps is not None:
            # One page table per draft step, each covering every branch of the live (padded) batch.
            rows = forward_batch.batch_size * backend.topk
            return [(f"step {i}", step.page_table, rows) for i, step in enumerate(steps)]
        return [("", backend.page_table, forward_batch.batch_size)]


ADAPTER = FlashInferAdapter()
