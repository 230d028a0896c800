"""FlashInfer's attention wrappers as torch code, for real sglang's FlashInfer backend where
FlashInfer cannot run (no CUDA, or the package is missing): the backend's own metadata code runs
unchanged and its plans feed a kernel that reads exactly what FlashInfer's would.

sglang binds ``BatchDecodeWithPagedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper``,
``BatchPrefillWithRaggedKVCacheWrapper``, ``fast_decode_plan``, ``merge_state`` and its own
``_safe_merge_state`` in ``flashinfer_backend`` only when FlashInfer is available; ``install`` binds
the stand-ins to those names in a module that lacks them (and never replaces the real ones).
``install_mla`` does the same for ``flashinfer_mla_backend`` (``BatchMLAPagedAttentionWrapper``,
``sglfix.harness.torchfi.mla``, and the ragged wrapper).
"""

from __future__ import annotations

from types import ModuleType

from sglfix.harness.torchfi.mla import BatchMLAPagedAttentionWrapper
from sglfix.harness.torchfi.wrappers import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    fast_decode_plan,
    merge_state,
    segment_packbits,
)

__all__ = ["MLA_STANDINS", "STANDINS", "BatchMLAPagedAttentionWrapper", "install", "install_mla", "installed"]

STANDINS = {
    "BatchDecodeWithPagedKVCacheWrapper": BatchDecodeWithPagedKVCacheWrapper,
    "BatchPrefillWithPagedKVCacheWrapper": BatchPrefillWithPagedKVCacheWrapper,
    "BatchPrefillWithRaggedKVCacheWrapper": BatchPrefillWithRaggedKVCacheWrapper,
    "fast_decode_plan": fast_decode_plan,
    "merge_state": merge_state,
    "_safe_merge_state": merge_state,
    "segment_packbits": segment_packbits,
}
# What sglang's FlashInfer-MLA backend module binds from FlashInfer (its TRT-LLM MLA subclass too).
MLA_STANDINS = {
    "BatchMLAPagedAttentionWrapper": BatchMLAPagedAttentionWrapper,
    "BatchPrefillWithRaggedKVCacheWrapper": BatchPrefillWithRaggedKVCacheWrapper,
}


def install(module: ModuleType) -> bool:
    """Bind the stand-ins in ``module`` where it has none of FlashInfer's names; True when the
    module now runs on them (installed here or before), False when it has FlashInfer's own."""
    names = vars(module)
    if "BatchDecodeWithPagedKVCacheWrapper" in names:
        return installed(module)
    for name, value in STANDINS.items():
        names.setdefault(name, value)
    return True


def installed(module: ModuleType) -> bool:
    """Whether ``module``'s FlashInfer names are the stand-ins."""
    return vars(module).get("BatchDecodeWithPagedKVCacheWrapper") is BatchDecodeWithPagedKVCacheWrapper


def install_mla(module: ModuleType) -> bool:
    """``install`` for sglang's FlashInfer-MLA backend module (its wrappers are the MLA paged one and
    the ragged one); True when the module now runs on the stand-ins."""
    names = vars(module)
    if "BatchMLAPagedAttentionWrapper" in names:
        return names["BatchMLAPagedAttentionWrapper"] is BatchMLAPagedAttentionWrapper
    for name, value in MLA_STANDINS.items():
        names.setdefault(name, value)
    return True
