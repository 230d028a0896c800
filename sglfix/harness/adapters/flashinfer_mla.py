"""The FlashInfer MLA backend's decode path: plain DECODE through ``FlashInferMLAAttnBackend`` and
the multi-step EAGLE draft (``DRAFT_DECODE``) through ``FlashInferMLAMultiStepDraftBackend``.

Absorbed MLA over a latent cache (kv_lora_rank + qk_rope_head_dim values, one KV head); everything
else, eager and graph runs included, as the GQA adapter (``flashinfer``).
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.flashinfer import FlashInferAdapter

__all__ = ["ADAPTER", "FlashInferMLAAdapter"]


class FlashInferMLAAdapter(FlashInferAdapter):
    name = "flashinfer_mla"
    mla = True

    def _model_shape(self, model: Any) -> dict:
        return dict(kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim)


ADAPTER = FlashInferMLAAdapter()
