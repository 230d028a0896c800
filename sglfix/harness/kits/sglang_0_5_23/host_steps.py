"""The FlashInfer step backends of a multi-step draft where they cannot run: ``HostStepRecorder``
records the page table it is handed instead of planning it (``host_step_children`` installs it for
one construction); and the MLA multi-step backend's topk gate, lifted for one construction, with
the note the cell shows and the reason its step backends are recorded on CUDA for topk > 1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

__all__ = [
    "MLA_GATE_NOTE",
    "HostStepRecorder",
    "host_plan",
    "host_step_children",
    "lift_mla_topk_gate",
    "mla_steps_recorded",
]


class HostStepRecorder:
    """Stands in for one step's FlashInfer backend on a machine without FlashInfer/CUDA.

    The multi-step draft backend's own code runs unchanged (its constructor, the row sizing in
    ``init_cuda_graph_state``, ``common_template``'s size check and its Triton kernel that fills the
    rows); each step's page table that it hands to its step backend (``spec_info.kv_indptr`` /
    ``spec_info.kv_indices``) is recorded here instead of being planned into FlashInfer. Nothing of
    FlashInfer runs: attention output is not computed."""

    _module: Any = None  # the step backends' module (host_step_children binds it)

    def __init__(
        self,
        model_runner: Any,
        skip_prefill: bool = False,
        kv_indptr_buf: Any = None,
        kv_last_page_len_buf: Any = None,
        q_indptr_decode_buf: Any = None,
        **_: Any,
    ) -> None:
        self.max_context_len = model_runner.model_config.context_len
        self.kv_indptr_buf = kv_indptr_buf
        self.kv_indices_buf: torch.Tensor | None = None
        self.page_table: SimpleNamespace | None = None
        self.calls: list[str] = []

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # FlashInferAttnBackend's and FlashInferMLAAttnBackend's value in 0.5.23

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf: Any = None) -> None:
        self.kv_indices_buf = kv_indices_buf
        self.calls.append("init_cuda_graph_state")

    def _record(self, forward_batch: Any, how: str) -> None:
        # The step backend reads its batch's page table first, as FlashInfer's does: a batch or a
        # page table it is not handed fails there, the caller's (sglfix.harness.misfit).
        __sglfix_passthrough__ = True  # noqa: F841
        spec = forward_batch.spec_info
        self.page_table = SimpleNamespace(
            kv_indptr=spec.kv_indptr.clone(), kv_indices=spec.kv_indices.clone(), host_indptr=host_plan(self._module)
        )
        self.calls.append(how)

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self._record(forward_batch, "init_forward_metadata")

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        # The multi-step backend hands an inner view (build_inner_fb_view) sharing the batch's spec_info.
        self._record(forward_batch, "capture" if in_capture else "replay")

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        pass


def host_plan(module: Any) -> Any:
    """The host-side indptr the multi-step backend publishes for the step it is calling (FlashInfer's
    ``global_override_indptr_cpu``, which a step's plan reads instead of copying the device's),
    a copy; None where it publishes none."""
    plan = getattr(module, "global_override_indptr_cpu", None)
    return plan.clone() if isinstance(plan, torch.Tensor) else None


@contextlib.contextmanager
def host_step_children(module: Any, class_name: str) -> Iterator[None]:
    """While the multi-step draft backend is constructed, its per-step FlashInfer backends are
    ``HostStepRecorder``s (restored at once afterwards)."""
    original = getattr(module, class_name)
    setattr(module, class_name, type("HostStepRecorder", (HostStepRecorder,), {"_module": module}))
    try:
        yield
    finally:
        setattr(module, class_name, original)


_MLA_GATE = {
    "target": "sglang.srt.layers.attention.flashinfer_mla_backend.FlashInferMLAMultiStepDraftBackend.__init__",
    "edits": [
        {
            "match": "if topk > 1:\n    raise ValueError(\n"
            '        "Currently Flashinfer MLA only supports topk=1 for speculative decoding"\n    )\n',
            "replacement": "",
        }
    ],
}
MLA_GATE_NOTE = (
    "FlashInferMLAMultiStepDraftBackend refuses topk > 1 in sglang 0.5.23 (the bug of PR 27460 is "
    "latent there); the harness lifted that gate for this construction only, as upstream's "
    "repro script does"
)


@contextlib.contextmanager
def lift_mla_topk_gate() -> Iterator[None]:
    from sglfix.patching.patcher import CodePatcher

    with CodePatcher(patches=[_MLA_GATE]):
        yield


def mla_steps_recorded(*, topk: int) -> str | None:
    """Why sglang's MLA step backends are recorded rather than run on CUDA for ``topk``, or None.

    With the topk gate lifted, the step backends' CUDA-graph ``qo_indptr`` buffer (sized for
    ``max_bs`` rows) cannot even capture ``bs * topk`` rows. What PR 27460 fixed is the multi-step
    backend's own sizing and kernel, which still run for real."""
    if topk <= 1:
        return None
    return (
        "topk > 1: sglang's MLA step backends are recorded, not run (their CUDA-graph "
        "qo_indptr buffer holds max_bs rows); the multi-step backend's sizing and its "
        "kv-indices kernel run on the GPU"
    )
