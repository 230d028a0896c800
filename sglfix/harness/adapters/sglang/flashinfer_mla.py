"""``backend: flashinfer_mla`` on real sglang: the multi-step EAGLE draft
(``FlashInferMLAMultiStepDraftBackend``, DRAFT_DECODE: PR 27460's path) here, every other mode
through one absorbed-MLA layer of ``FlashInferMLAAttnBackend`` (``sglang.flashinfer_mla_dense``).

The draft runs everything as the GQA draft adapter (``flashinfer``) does, over the kit's MLA runner
(latent cache: kv_lora_rank + qk_rope_head_dim values, one KV head).

sglang's constructor refuses ``topk > 1`` (the bug of PR 27460 is latent there); for a
scenario with topk > 1 the harness lifts that gate for the construction only (a patch of
``__init__`` applied and restored around it, as upstream's repro script lifts it) and the cell
says so.
"""

from __future__ import annotations

from sglfix.harness.adapters.sglang.flashinfer import FlashInferAdapter, FlashInferDraftAdapter

__all__ = ["ADAPTER", "FlashInferMLAAdapter", "FlashInferMLADraftAdapter"]


class FlashInferMLADraftAdapter(FlashInferDraftAdapter):
    name = "flashinfer_mla"
    mla = True
    backend_module = "sglang.srt.layers.attention.flashinfer_mla_backend"
    step_class = "FlashInferMLAAttnBackend"


class FlashInferMLAAdapter(FlashInferAdapter):
    """The draft adapter above for DRAFT_DECODE, the dense MLA one for every other mode."""

    name = "flashinfer_mla"

    def __init__(self) -> None:
        from sglfix.harness.adapters.sglang.flashinfer_mla_dense import SglangFlashInferMLAAdapter

        self.draft, self.dense = FlashInferMLADraftAdapter(), SglangFlashInferMLAAdapter()


ADAPTER = FlashInferMLAAdapter()
