"""Where sglang's FlashMLA backend module comes from for the FlashMLA adapters (dense and draft):
imported over sglfix's FlashMLA stand-in where ``flash_mla`` is missing, and the H200's SM count
``torch.cuda.get_device_properties`` answers without CUDA (the graph state sizes by it:
``device_answers``, the FlashInfer adapter's)."""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.sglang.flashinfer_dense import device_answers
from sglfix.harness.adapters.sglang.flashinfer_mla_dense import flashinfer_mla_module

__all__ = ["device_answers", "flashmla_module"]

_MODULE = "sglang.srt.layers.attention.flashmla_backend"


def flashmla_module() -> Any:
    """sglang's FlashMLA backend module, on sglfix's FlashMLA stand-in where ``flash_mla`` is missing
    (and its FlashInfer-MLA parent on FlashInfer's where FlashInfer is)."""
    import importlib

    from sglfix.harness import flashmla

    flashinfer_mla_module()
    with flashmla.import_without_flash_mla():
        module = importlib.import_module(_MODULE)
    module._sglfix_standin = flashmla.install(module)
    return module
