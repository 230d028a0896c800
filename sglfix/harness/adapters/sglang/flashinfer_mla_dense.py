"""Replays ``backend: flashinfer_mla`` scenarios of one absorbed-MLA layer (DECODE, EXTEND,
TARGET_VERIFY, DRAFT_EXTEND_V2; eager, and CUDA graph for DECODE and TARGET_VERIFY, the modes the
backend captures) through the installed sglang's own ``FlashInferMLAAttnBackend``, built as
production builds it for an MLA model (``ATTENTION_BACKENDS["flashinfer"]``): its
``init_forward_metadata*`` code, both indices updaters, the EAGLE verify / draft-extend input
builders they call (``generate_attn_arg_prefill``), its graph wrappers and sglang's sync-free
re-plans (``fast_mla_decode_plan``, ``fast_mla_prefill_plan``).

Everything but the backend is the dense adapters' (``sglang.flashinfer_dense`` over
``sglang.triton``): the case (the kit's MLA runner and ``MLATokenToKVPool``, ``sglang.case``), the
ground truth (one latent KV head: key = latent + rope, value = latent), the kit's graph runners,
the judge's hooks. Where FlashInfer can run its ``BatchMLAPagedAttentionWrapper`` plans and runs;
elsewhere ``sglfix.harness.torchfi.mla`` stands in for it, reading what FlashInfer's reads: the
host schedule of the last plan (``qo_indptr``, ``kv_indptr``, ``kv_len_arr``) and the device
``kv_indices`` at run time.

The kit's MLA runner publishes ``flashinfer_mla_disable_ragged``, as the kit's own MLA tests run:
every extend takes the paged MLA kernel (the ragged MHA prefill needs the model's decompressed
per-head K/V, which an absorbed layer does not have).

What the judge reads as metadata is what the kernel reads: every plan a wrapper receives is
recorded (sglang's fast re-plans hand the schedule from host arrays that no device buffer holds),
and a wrapper planned only at capture shows its own graph buffers.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter
from sglfix.harness.adapters.sglang.guards import guard_buffers
from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["SglangFlashInferMLAAdapter", "flashinfer_mla_module"]

_MODULE = "sglang.srt.layers.attention.flashinfer_mla_backend"
# The backend's indptr buffers, shared with its two indices updaters (which keep their own names).
_SHARED = {
    "indices_updater_decode": (("kv_indptr", "kv_indptr"), ("q_indptr", "q_indptr_decode")),
    "indices_updater_prefill": (("kv_indptr", "kv_indptr"), ("qo_indptr", "qo_indptr")),
}


def flashinfer_mla_module() -> Any:
    """sglang's FlashInfer-MLA backend module, on the torch stand-ins where FlashInfer is missing."""
    import importlib

    from sglfix.harness import torchfi

    module = importlib.import_module(_MODULE)
    torchfi.install_mla(module)
    return module


class SglangFlashInferMLAAdapter(SglangFlashInferAdapter):
    name = "flashinfer_mla"
    registry_name = "flashinfer"
    persistent = ("kv_indptr", "qo_indptr", "q_indptr_decode")
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr"), lengths=("kv_len",), indices={"kv_indices": "kv_indptr"}
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if not scenario.model.mla:
            raise Unavailable("the sglang flashinfer_mla adapter runs MLA layers (model.kv_lora_rank)")
        return super().build(scenario, device=device)

    def make_backend(self, prepared: Prepared) -> Any:
        flashinfer_mla_module()
        with self._placed():
            backend = SglangTritonAdapter.make_backend(self, prepared)
        if type(backend).__name__ != "FlashInferMLAAttnBackend":
            raise Unavailable(f"sglang built {type(backend).__name__} for an MLA model, not FlashInferMLAAttnBackend")
        # The updaters took the backend's indptr buffers at construction: hand them the guarded ones.
        for updater, names in _SHARED.items():
            owner = getattr(backend, updater, None)
            for theirs, ours in names:
                if owner is not None and hasattr(owner, theirs):
                    setattr(owner, theirs, getattr(backend, ours))
        for wrapper in (backend.decode_wrapper, *_optional(backend, "prefill_wrapper_paged", "prefill_wrapper_verify")):
            _observe_plan(wrapper)
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if scenario.capture_bs and scenario.mode not in ("DECODE", "TARGET_VERIFY"):
            raise Unavailable(f"FlashInferMLAAttnBackend captures DECODE and TARGET_VERIFY, not {scenario.mode}")
        runner = super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)
        if runner is not None:
            # Replays re-plan the captured wrappers through sglang's fast plans, installed at capture.
            for table in (backend.decode_cuda_graph_metadata, backend.prefill_cuda_graph_metadata):
                for wrapper in table.values():
                    _observe_plan(wrapper)
        return runner

    def guard_graph_state(self, backend: Any, graphs: Any) -> None:
        guard_buffers(backend, self.graph_state(graphs))
        # init_cuda_graph_state handed its kv_indices to the fast decode plan's arguments too.
        kwargs = getattr(backend, "fast_decode_kwargs", None)
        if isinstance(kwargs, dict) and "kv_indices" in kwargs:
            kwargs["kv_indices"] = backend.cuda_graph_kv_indices

    def graph_state(self, graphs: Any) -> tuple[str, ...]:
        return ("cuda_graph_kv_indices", "cuda_graph_qo_indptr", "cuda_graph_kv_indptr", "cuda_graph_kv_lens")

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """The live wrapper as its kernel reads it: its last plan, else its own buffers."""
        metadata = backend.forward_metadata
        wrapper = getattr(metadata, "decode_wrapper", None) or getattr(metadata, "prefill_wrapper", None)
        if wrapper is None:
            return []
        kind = "decode" if hasattr(metadata, "decode_wrapper") else "prefill"
        return [(f"{kind} wrapper", _planned(wrapper), int(forward_batch.batch_size))]


def _optional(backend: Any, *names: str) -> list:
    return [getattr(backend, n) for n in names if getattr(backend, n, None) is not None]


def _observe_plan(wrapper: Any) -> None:
    """Record every plan of ``wrapper`` (positional, as sglang's calls and fast plans pass it:
    qo_indptr, kv_indptr, kv_indices, kv_len_arr, ...), then plan unchanged."""
    original = wrapper.plan

    def plan(qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any, *args: Any, **kwargs: Any) -> Any:
        # What fails from here on is the planning code's, which this only watches (sglfix.harness.misfit).
        __sglfix_passthrough__ = True  # noqa: F841
        wrapper._sglfix_plan = SimpleNamespace(
            qo_indptr=qo_indptr.clone(), kv_indptr=kv_indptr.clone(), kv_indices=kv_indices, kv_len=kv_len_arr.clone()
        )
        return original(qo_indptr, kv_indptr, kv_indices, kv_len_arr, *args, **kwargs)

    wrapper.plan = plan


def _planned(wrapper: Any) -> Any:
    plan = getattr(wrapper, "_sglfix_plan", None)
    if plan is not None:
        return plan
    return SimpleNamespace(
        qo_indptr=getattr(wrapper, "_qo_indptr_buf", None),
        kv_indptr=getattr(wrapper, "_kv_indptr_buf", None),
        kv_indices=getattr(wrapper, "_kv_indices_buf", None),
        kv_len=getattr(wrapper, "_kv_len_arr_buf", None),
    )
