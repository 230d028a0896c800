"""Replays ``backend: flashinfer`` scenarios of one attention layer (DECODE, EXTEND with prefixes,
TARGET_VERIFY, DRAFT_EXTEND_V2; eager and CUDA graph) through the installed sglang's own
``FlashInferAttnBackend``: its ``init_forward_metadata*`` code, its indices updaters, the EAGLE
verify / draft-extend input builders (``generate_attn_arg_prefill``) they call, its graph wrappers
and sglang's sync-free re-plans (``fast_prefill_plan``, FlashInfer's ``fast_decode_plan``). An
encoder-decoder batch (``batch.encoder_lens``; DECODE and EXTEND) takes the updaters'
``update_cross_attention``: the self layer's wrapper from each row's encoder end, the cross layer's
(``model.cross_attention``) over the encoder.

Everything but the backend is the Triton adapter's (``sglang.triton``): the case, the ground truth,
the kit's graph runners, the judge's hooks. Where FlashInfer can run (CUDA with the package) its
own wrappers plan and run; elsewhere ``sglfix.harness.torchfi`` binds torch stand-ins to the names
the backend module imports from FlashInfer, so the same metadata code runs and its plans feed a
kernel that reads what FlashInfer's reads (the device buffers at run time, the packed custom
mask, raw ``kv_indices`` memory). The backend's ``device="cuda"`` allocations are placed on the
CPU there.

The judge sees the metadata as the kernel does: every wrapper of the live metadata, its planned
``qo_indptr`` / ``kv_indptr`` / ``kv_indices`` / ``mask_indptr`` (``metadata_views``), and guard
zones after the backend's indptr buffers and its CUDA-graph state.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import MetadataHook, Prepared, require_flashinfer
from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import Unavailable

__all__ = ["SglangFlashInferAdapter", "captures_draft_extend_v2", "flashinfer_module"]

_MODULE = "sglang.srt.layers.attention.flashinfer_backend"


def flashinfer_module() -> Any:
    """sglang's FlashInfer backend module, on the torch stand-ins where FlashInfer is missing."""
    import importlib

    from sglfix.harness import torchfi

    module = importlib.import_module(_MODULE)
    torchfi.install(module)
    return module


class SglangFlashInferAdapter(SglangTritonAdapter):
    name = "flashinfer"
    registry_name = "flashinfer"
    # One indptr per wrapper (lists), guarded element by element.
    persistent = ("kv_indptr", "qo_indptr")
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr", "mask_indptr"),
        indices={"kv_indices": "kv_indptr"},
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        # On a GPU FlashInfer's own kernels run, or the cell is SKIP with the install hint; the
        # torch stand-ins are for machines without CUDA.
        require_flashinfer(device)
        return super().build(scenario, device=device)

    def _placed(self) -> Any:
        """The backend's ``device="cuda"`` factory calls, on the CPU where there is no CUDA."""
        import torch

        if torch.cuda.is_available():
            return contextlib.nullcontext()
        return _kit("drafts").CudaAllocations(remap=True, guard=False)

    def make_backend(self, prepared: Prepared) -> Any:
        flashinfer_module()
        with self._placed():
            return super().make_backend(prepared)

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        if scenario.capture_bs and scenario.mode == "DRAFT_EXTEND_V2" and not captures_draft_extend_v2(backend):
            raise Unavailable("this release's FlashInferAttnBackend does not capture DRAFT_EXTEND_V2 in CUDA graphs")
        with self._placed():
            return super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)

    def graph_state(self, graphs: Any) -> tuple[str, ...]:
        return ("cuda_graph_kv_indices", "cuda_graph_custom_mask", "cuda_graph_qk_indptr", "cuda_graph_qo_indptr")

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        with self._placed():
            return super().run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """Each wrapper of the live metadata as its kernel reads it: the planned buffers."""
        metadata = backend.forward_metadata
        rows = int(forward_batch.batch_size)
        views: list[tuple[str, Any, int]] = []
        wrappers = getattr(metadata, "decode_wrappers", None) or getattr(metadata, "prefill_wrappers", None) or []
        kind = "decode" if hasattr(metadata, "decode_wrappers") else "prefill"
        for i, w in enumerate(wrappers):
            views.append((f"{kind} wrapper {i}", _planned(w), rows))
        if getattr(metadata, "use_ragged", False) and not getattr(metadata, "extend_no_prefix", True):
            ragged = backend.prefill_wrapper_ragged
            views.append(
                (
                    "ragged wrapper",
                    SimpleNamespace(qo_indptr=ragged._qo_indptr_buf, kv_indptr=ragged._kv_indptr_buf),
                    rows,
                )
            )
        return views


def captures_draft_extend_v2(backend: Any, method: str = "_prepare_cuda_graph_metadata") -> bool:
    """Whether the backend's graph metadata (its ``method``) knows the spec-v2 draft extend (0.5.14
    on; 0.5.13's captures the spec-v1 draft extend only). Read from its source file, which a
    mutant's or a revert's swapped code object leaves as it is."""
    import inspect

    try:
        source = inspect.getsource(getattr(type(backend), method))
    except (AttributeError, OSError, TypeError):
        return True
    return "is_draft_extend_v2" in source


def _planned(wrapper: Any) -> Any:
    """A wrapper's planned metadata under the invariant table's names (FlashInfer's own private
    buffers, which the stand-ins keep under the same names)."""
    return SimpleNamespace(
        kv_indptr=getattr(wrapper, "_paged_kv_indptr_buf", None),
        kv_indices=getattr(wrapper, "_paged_kv_indices_buf", None),
        qo_indptr=getattr(wrapper, "_qo_indptr_buf", None),
        mask_indptr=getattr(wrapper, "_mask_indptr_buf", None),
    )
