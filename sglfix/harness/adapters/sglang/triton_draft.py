"""Real sglang's Triton multi-step EAGLE draft (``backend: triton``, DRAFT_DECODE):
``TritonMultiStepDraftBackend`` built as production builds it (``DraftBackendFactory(...)
.create_decode_backend()`` over the kit's dense mock runner configured as an EAGLE draft worker
whose decode backend is ``triton``), eager and under CUDA graphs: ``init_cuda_graph_state``, the
capture metadata per captured size (each step backend's ``init_forward_metadata_out_graph`` with
``in_capture``), then a replay padded as ``EAGLEDraftCudaGraphRunner.execute`` pads it, which
rebuilds only the shared page-table buffers (``common_template`` without a step call): every
step's captured metadata reads them in place.

The step backends are real ``TritonAttnBackend``s on every device (their kernels compiled on
CUDA, interpreted on CPU), so every step's draft attention runs over the metadata just built and
is compared with sglfix's reference. The judge is the multi-step draft adapters' own
(``sglang.multistep``): invariants and guard zones on each step's page table, the row width
against what the draft kernel writes, and each step's page table against the slot ground truth.
The page table judged is the one the step's kernel reads (its ``forward_metadata``), which on a
replay is the captured view of the rebuilt buffers, not a copy taken when a step was called.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.multistep import MultiStepDraftAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["TritonDraftAdapter"]


class TritonDraftAdapter(MultiStepDraftAdapter):
    name = "triton"
    backend_module = "sglang.srt.layers.attention.triton_backend"
    step_class = "TritonAttnBackend"
    metadata_fields = MetadataFields(indptr=("kv_indptr",), indices={"kv_indices": "kv_indptr"})

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode != "DRAFT_DECODE":
            raise Unavailable(f"the sglang triton draft adapter runs DRAFT_DECODE, not {scenario.mode}")
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")
        case = kit.build_draft(scenario, device=device, mla=False, backend="triton")
        case.host = False  # Triton's step backends run on any device
        return self.prepared(case, scenario)

    def watch_steps(self, backend: Any, case: Any) -> None:
        """Nothing at the call: a replay calls no step backend (``read_steps`` reads them)."""

    def read_steps(self, backend: Any, case: Any, batch: Any) -> None:
        _read_step_tables(backend, case, batch)


def _read_step_tables(backend: Any, case: Any, batch: Any) -> None:
    """Each step's page table as its kernel will read it: the step backend's ``forward_metadata``
    (``kv_indptr`` over the batch's branch rows, ``kv_indices``)."""
    rows = int(batch.batch_size) * case.topk
    graph = getattr(backend, "cuda_graph_kv_indices", None)
    for i, step in enumerate(backend.attn_backends):
        md = getattr(step, "forward_metadata", None)
        if md is None or getattr(md, "kv_indptr", None) is None:
            continue
        indices = md.kv_indices
        if indices is None:
            # No page table to read: the step's kernel gets None where it reads kv_indices,
            # which the invariant table and the forward show (the code's failure, not sglfix's).
            case.tables[i] = SimpleNamespace(kv_indptr=md.kv_indptr[: rows + 1].clone(), kv_indices=None)
            continue
        if graph is not None and indices.data_ptr() == graph[i].data_ptr():
            # Captured at the capture batch's length, read to wherever the replayed kv_indptr
            # points: the kernel gets a pointer, and the whole row is what it can reach.
            indices = graph[i]
        case.tables[i] = SimpleNamespace(kv_indptr=md.kv_indptr[: rows + 1].clone(), kv_indices=indices.clone())
