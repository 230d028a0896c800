"""Real sglang's FlashInfer multi-step EAGLE draft (DRAFT_DECODE): ``FlashInferMultiStepDraftBackend``
here (GQA; PR 27338), ``FlashInferMLAMultiStepDraftBackend`` in ``flashinfer_mla`` (PR 27460).

The backend is built as production builds it (``DraftBackendFactory(...).create_decode_backend()``
over the kit's mock runner configured as an EAGLE draft worker). Graph scenarios follow the
metadata calls of ``EAGLEDraftCudaGraphRunner``: ``init_cuda_graph_state(max_bs, max_bs * topk)``,
``init_forward_metadata_out_graph(batch, in_capture=True)`` per captured size (seq_lens = the fill
value), then for the replay the batch padded to the captured size as ``execute`` pads it and
``init_forward_metadata_out_graph``; eager scenarios call ``init_forward_metadata``. The graphs are
not captured: the forward (CUDA only) runs eagerly over the replayed metadata, as sglang's kit does.

The judge, per draft step: sglfix's invariants on the page table the multi-step backend hands its
step backend (``kv_indptr`` offsets, ``kv_indices`` within the pool and long enough for the
offsets); guard zones after every per-step kv_indices buffer the backend allocates; the allocated
row width against what the kernel writes (``seq_lens_sum * topk + bs * topk * num_steps``); and a
metadata reference: each branch's page table is its request's prefix slots then its own draft
slots of steps ``0..i``, from the slot ground truth.

Where it runs. Without CUDA + FlashInfer, FlashInfer's step backends cannot be built: each is a
``HostStepRecorder`` that records the page table it is handed (the multi-step backend's own code
runs unchanged: constructor, row sizing, ``common_template``'s size check and its Triton kernel,
interpreted on CPU, with its ``device="cuda"`` rows placed on the CPU); no attention output is
computed (the cell says so). With CUDA and FlashInfer the real step backends plan and run the
draft attention of every step, compared with sglfix's reference (each branch attends its prefix
and its own draft path, causally).

What the MLA kernel reads. FlashInfer's MLA schedule is built on the host from the ``plan`` call's
``kv_indptr`` and ``kv_len_arr`` (on replay sglang's fast plan hands them as CPU tensors): a row
reads ``kv_indices[kv_indptr[r] : kv_indptr[r] + kv_len_arr[r]]``, whatever the spec page table
says. On CUDA the MLA adapter therefore also records every plan its step wrappers receive and
judges that read against the metadata reference (``planned read``), and, when the output
diverges, says whether the kernel's output equals attention over what it was planned to read
(the divergence is then the plan's, not the kernel's).

The ground truth and the real forward over it are ``sglang.draft_truth``'s; what the judge
records on the backend and checks after the run, ``sglang.draft_checks``'; this module is the
adapter over them.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.multistep import DraftOrDense, MultiStepDraftAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["ADAPTER", "FlashInferAdapter", "FlashInferDraftAdapter"]


class FlashInferDraftAdapter(MultiStepDraftAdapter):
    name = "flashinfer"
    mla = False
    backend_module = "sglang.srt.layers.attention.flashinfer_backend"
    step_class = "FlashInferAttnBackend"
    metadata_fields = MetadataFields(indptr=("kv_indptr",), indices={"kv_indices": "kv_indptr"})

    # ------------------------------------------------------------------ build

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode != "DRAFT_DECODE":
            raise Unavailable(
                f"the sglang {self.name} adapter runs the multi-step draft (DRAFT_DECODE), not {scenario.mode}"
            )
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        case = kit.build_draft(scenario, device=device, mla=self.mla)
        real = device != "cpu" and kit.has_cuda() and kit.flashinfer_available()
        # The step backends run anywhere: on FlashInfer's torch stand-ins on CPU.
        case.host = not real and device != "cpu"
        if not real and not case.host:
            from sglfix.harness.adapters.sglang.flashinfer_dense import flashinfer_module
            from sglfix.harness.adapters.sglang.flashinfer_mla_dense import flashinfer_mla_module

            flashinfer_mla_module() if self.mla else flashinfer_module()
        recorded = kit.mla_steps_recorded(topk=case.topk) if self.mla and not case.host else None
        if recorded:
            case.host = True
            case.notes.append(recorded)
        return self.prepared(case, scenario)


class FlashInferAdapter(DraftOrDense):
    """``backend: flashinfer`` on real sglang: the multi-step draft (DRAFT_DECODE) through the draft
    adapter above, every other mode through one layer of ``FlashInferAttnBackend``
    (``sglang.flashinfer_dense``). Each call goes to the adapter that built the cell."""

    name = "flashinfer"
    # The dense backend's (SglangFlashInferAdapter's; the draft's are a subset): its views hold
    # every one of them, the mask's offsets beside the bits its rows read.
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr", "mask_indptr"),
        indices={"kv_indices": "kv_indptr"},
        offsets=("mask_indptr",),
    )

    def __init__(self) -> None:
        from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter

        self.draft, self.dense = FlashInferDraftAdapter(), SglangFlashInferAdapter()


ADAPTER = FlashInferAdapter()
