"""The multi-step EAGLE draft adapters' common part on real sglang (DRAFT_DECODE): the draft
backend built as production builds it (``DraftBackendFactory(...).create_decode_backend()``), the
metadata calls of ``EAGLEDraftCudaGraphRunner`` (capture per size, the padded replay), the real
forward of every step, and the judge (``sglang.draft_checks``, ``sglang.draft_truth``). Each
backend's adapter builds its case (``build``): FlashInfer's and FlashInfer-MLA's in
``sglang.flashinfer``, Triton's in ``sglang.triton_draft``. Kept apart from both so that neither
backend's adapter imports the other's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import AdapterBase, Dispatch, Prepared
from sglfix.harness.adapters.sglang.draft_checks import (
    check_draft_metadata,
    check_planned_reads,
    observe_plan,
    observe_steps,
    planned_reads,
    step_tables,
)
from sglfix.harness.adapters.sglang.draft_truth import attend_steps, draft_reference
from sglfix.harness.codefault import BrokenContract
from sglfix.harness.unavailable import NoOutput

__all__ = ["HOST_REASON", "DraftOrDense", "MultiStepDraftAdapter", "Owner"]


HOST_REASON = (
    "FlashInfer is not available here (needs CUDA): the step backends' page tables were recorded "
    "from sglang's own multi-step code, no attention ran"
)


class MultiStepDraftAdapter(AdapterBase):
    """Everything of a multi-step draft adapter but its case (``build``, the subclass's)."""

    mla = False
    # Whether the MLA step backends plan a FlashInfer decode wrapper (whose planned reads are
    # recorded and judged); FlashMLA's hand their kernel a block table instead.
    wrapper_plans = True
    backend_module = ""
    step_class = ""

    def prepared(self, case: Any, scenario: Any) -> Prepared:
        """A built draft case (its ``host`` decided) ready to run: its allocation guard and what
        the judge records as the cell runs."""
        from sglfix.harness.kits import kit as _kit

        case.allocs = _kit("drafts").CudaAllocations(remap=True)
        case.tables = {}  # step -> the page table its step backend was handed last
        case.plans = {}  # step -> what its MLA decode wrapper was planned to read last (CUDA)
        case.output = None
        case.replayed = None  # the batch (view) of the last metadata init
        case.unhanded = []  # (captured size, step): a step handed no page table at that capture
        case.seed = scenario.seed
        return Prepared(case=case, num_slots=case.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        import contextlib
        import importlib

        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        case = prepared.case
        with contextlib.ExitStack() as stack:
            if case.host:
                stack.enter_context(
                    kit.host_step_children(importlib.import_module(self.backend_module), self.step_class)
                )
            if self.mla and case.topk > 1:
                stack.enter_context(kit.lift_mla_topk_gate())
                case.notes.append(kit.MLA_GATE_NOTE)
            stack.enter_context(case.allocs)
            backend = kit.draft_backend_factory(case.runner, case.topk, case.num_steps).create_decode_backend()
        if backend is None:
            raise BrokenContract(f"create_decode_backend built no draft backend for {case.num_steps} step(s)")
        backend._sglfix_case = case  # for static_buffers: the guard zones of this backend's allocations
        if not case.host:
            self.watch_steps(backend, case)
            if self.mla and self.wrapper_plans:
                for i, step in enumerate(backend.attn_backends):
                    observe_plan(step.decode_wrapper, case.plans, i)
        return backend

    def watch_steps(self, backend: Any, case: Any) -> None:
        """Record, from construction on, the page table each real step backend is handed at
        each metadata init: what its kernel then reads."""
        observe_steps(backend, case.tables)

    def read_steps(self, backend: Any, case: Any, batch: Any) -> None:
        """After each metadata init, before the judge looks at ``case.tables``: nothing more to
        read where ``watch_steps`` recorded them (a backend whose replay calls no step reads its
        steps' metadata here instead)."""

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if not scenario.capture_bs:
            return None
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        case = prepared.case
        max_bs = max(scenario.capture_bs)
        with case.allocs:
            backend.init_cuda_graph_state(max_bs, max_bs * case.topk)
        fill = backend.attn_backends[0].get_cuda_graph_seq_len_fill_value()
        for bs in scenario.capture_bs:
            batch = kit.make_capture_batch(
                bs,
                topk=case.topk,
                num_steps=case.num_steps,
                fill=fill,
                device=case.device,
                hidden_size=case.hidden_size,
                dtype=case.dtype,
                runner=case.runner,
            )
            before = dict(step_tables(case, backend))
            with case.allocs:
                backend.init_forward_metadata_out_graph(batch, in_capture=True)
                # The runner's captured body starts with the in-graph step (its replay re-runs it).
                backend.init_forward_metadata_in_graph(batch)
            self.read_steps(backend, case, batch)
            # The captured draft forward runs every step but the last on what this capture handed
            # it: a step handed nothing runs on no metadata (or the last capture's) in the graph.
            after = step_tables(case, backend)
            case.unhanded += [
                (bs, i) for i in range(case.num_steps - 1) if after.get(i) is None or after.get(i) is before.get(i)
            ]
            on_metadata(Owner(backend, case), batch, f"capture bs={bs}")
        if self.mla and self.wrapper_plans and not case.host:
            # The captured wrappers re-plan on replay through sglang's fast plan (installed on
            # each after its capture): record those plans, the ones the replayed kernel follows.
            for i, step in enumerate(backend.attn_backends):
                for wrapper in step.decode_cuda_graph_metadata.values():
                    observe_plan(wrapper, case.plans, i)
        return SimpleNamespace(bs=scenario.graph_bs, fill=fill)

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        case = prepared.case
        batch = case.batch
        case.plans.clear()
        if runner is None:
            with case.allocs:
                backend.init_forward_metadata(batch)
            case.replayed = batch
            self.read_steps(backend, case, batch)
            on_metadata(Owner(backend, case), batch, "eager")
        else:
            with case.allocs:
                view = kit.replay_draft(backend, batch, case=case, capture_bs=scenario.capture_bs, fill=runner.fill)
            case.replayed = view
            self.read_steps(backend, case, view)
            on_metadata(Owner(backend, case), view, f"replay bs={runner.bs}")
        if case.host:
            return NoOutput(HOST_REASON)
        return attend_steps(case, backend, case.replayed, mla=self.mla)

    def static_buffers(self, backend: Any) -> list:
        case = getattr(backend, "_sglfix_case", None)
        return list(case.allocs.guarded) if case is not None else []

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        owner = backend if isinstance(backend, Owner) else None
        if owner is None:
            return []
        tables = step_tables(owner.case, owner.backend)
        rows = forward_batch.batch_size * owner.case.topk
        return [(f"step {i}", tables.get(i), rows) for i in range(len(owner.backend.attn_backends))]

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """Row width against the kernel's need, and each step's page table against the ground truth."""
        return check_draft_metadata(prepared.case, backend, mla=self.mla and self.wrapper_plans)

    # The planned-read checks, as the judge runs them for MLA (kept here for their tests).
    def _planned_reads(self, case: Any, step: int) -> list[list[int]] | None:
        return planned_reads(case, step)

    def _check_planned_reads(self, case: Any) -> list[tuple[str, str]]:
        return check_planned_reads(case)

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        """Branch (b, j) at step i attends b's prefix, then its own draft tokens of steps 0..i."""
        return draft_reference(prepared.case)


class Owner:
    """The backend and its case, handed to the metadata hook (the hook's ``backend`` argument)."""

    def __init__(self, backend: Any, case: Any) -> None:
        self.backend, self.case = backend, case


class DraftOrDense(Dispatch):
    """One ``backend:`` on real sglang whose multi-step draft (DRAFT_DECODE) has its own adapter
    (``draft``) and every other mode the one-layer adapter (``dense``). Each call goes to the
    adapter that built the cell: a draft case has a ``family``, a draft backend its case."""

    draft: MultiStepDraftAdapter
    dense: AdapterBase

    def _by_case(self, prepared: Prepared) -> Any:
        return self.draft if getattr(prepared.case, "family", None) else self.dense

    def _by_backend(self, backend: Any) -> Any:
        draft = isinstance(backend, Owner) or getattr(backend, "_sglfix_case", None) is not None
        return self.draft if draft else self.dense

    def _for_scenario(self, scenario: Any) -> Any:
        return self.draft if scenario.mode == "DRAFT_DECODE" else self.dense
