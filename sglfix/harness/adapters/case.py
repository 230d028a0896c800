"""What the case-based adapters share: capture, run, guard buffers and reference from a kit case.

Every adapter builds a kit case (pools, inputs, ground truth) and drives it the same way: no
runner for eager scenarios, the CUDA-graph runner (or the EAGLE draft runner for a multi-step
draft case) captured at the scenario's sizes, a replay or an eager forward, and the reference
from the case's padded ground truth. Adapters differ in how they build the case and the backend
and in which metadata they show the invariant table.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.base import AdapterBase, MetadataHook, Prepared

__all__ = ["CaseAdapter"]


class CaseAdapter(AdapterBase):
    def _v(self, case: Any) -> Any:
        """The new tokens' values handed to the forward (None where the backend writes from k alone)."""
        return case.v

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """The graph runner, captured at the scenario's sizes (None for eager scenarios).
        Capture synchronises by design: it runs before the sync watch starts."""
        if not scenario.capture_bs:
            return None
        case = prepared.case
        if getattr(case, "draft", False):
            from sglfix.backends.srt.speculative.eagle_draft_cuda_graph_runner import make_draft_runner_for_case

            return make_draft_runner_for_case(
                case, draft_backend=backend, capture_bs=list(scenario.capture_bs), on_metadata=on_metadata
            )
        from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case

        return make_runner_for_case(
            case, backend=backend, capture_bs=list(scenario.capture_bs), on_metadata=on_metadata
        )

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """The forward for the scenario's mode: a replay of ``runner``, else eager; output packed
        in the reference's row order."""
        case = prepared.case
        v = self._v(case)
        if runner is not None:
            out = runner.replay(case.forward_batch, q=case.q, k=case.k, v=v)
        elif getattr(case, "draft", False):
            from sglfix.backends.srt.speculative.eagle_draft_cuda_graph_runner import run_draft_eager

            out = run_draft_eager(backend, case.forward_batch, case.q, case.k, v, case.layer, on_metadata)
        else:
            from sglfix.backends.srt.model_executor.cuda_graph_runner import run_eager

            out = run_eager(
                backend=backend,
                forward_batch=case.forward_batch,
                q=case.q,
                k=case.k,
                v=v,
                layer=case.layer,
                on_metadata=on_metadata,
            )
        pack = getattr(case, "pack_output", None)
        return pack(out) if pack is not None else out

    def static_buffers(self, backend: Any) -> list:
        return list(getattr(backend, "static_buffers", []))

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        """(reference output, rows to compare) from the case's ground truth only."""
        from sglfix.harness.reference import reference_attention

        case = prepared.case
        ref = reference_attention(
            q_pad=case.q_pad, k_pad=case.k_pad, v_pad=case.v_pad, mask=case.visible, scale=case.sm_scale
        )
        return ref, case.q_valid
