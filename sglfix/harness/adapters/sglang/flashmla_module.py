"""Where sglang's FlashMLA backend module comes from for the FlashMLA adapters (dense and draft):
imported over sglfix's FlashMLA stand-in where ``flash_mla`` is missing, and the H200's SM count
``torch.cuda.get_device_properties`` answers without CUDA (the graph state sizes by it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.sglang.flashinfer_mla_dense import flashinfer_mla_module

__all__ = ["device_answers", "flashmla_module"]

_MODULE = "sglang.srt.layers.attention.flashmla_backend"
_H200_SMS = 132


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


@contextlib.contextmanager
def device_answers() -> Iterator[None]:
    """Without CUDA, ``torch.cuda.get_device_properties`` answers an H200's SM count (the graph
    state sizes its schedule buffer by it); put back after."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *a, **k: SimpleNamespace(multi_processor_count=_H200_SMS)
    try:
        yield
    finally:
        torch.cuda.get_device_properties = original
