"""Real sglang's FlashInfer MLA multi-step EAGLE draft (``FlashInferMLAMultiStepDraftBackend``,
DRAFT_DECODE): PR 27460's path. Everything as the GQA adapter (``flashinfer``), over the kit's MLA
runner (latent cache: kv_lora_rank + qk_rope_head_dim values, one KV head).

sglang's constructor refuses ``topk > 1`` (the bug of PR 27460 is latent there); for a
scenario with topk > 1 the harness lifts that gate for the construction only (a patch of
``__init__`` applied and restored around it, as upstream's repro script lifts it) and the cell
says so.
"""

from __future__ import annotations

from sglfix.harness.adapters.sglang.flashinfer import FlashInferDraftAdapter

__all__ = ["ADAPTER", "FlashInferMLADraftAdapter"]


class FlashInferMLADraftAdapter(FlashInferDraftAdapter):
    name = "flashinfer_mla"
    mla = True
    backend_module = "sglang.srt.layers.attention.flashinfer_mla_backend"
    step_class = "FlashInferMLAAttnBackend"


ADAPTER = FlashInferMLADraftAdapter()
