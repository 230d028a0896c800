"""Real sglang's FlashMLA multi-step EAGLE draft (``backend: flashmla``, DRAFT_DECODE):
``FlashMLAMultiStepDraftBackend`` built as production builds it (``DraftBackendFactory(...)
.create_decode_backend()`` over the kit's MLA runner configured as an EAGLE draft worker whose
decode backend is ``flashmla``, page size 64), eager and under CUDA graphs (the capture metadata per
captured size, then the padded replay). The draft is a chain (the backend refuses topk > 1): each
request's prefix and draft tokens lie on its own pages.

Each step backend is a real ``FlashMLABackend``; its forward runs FlashMLA's kernel where
``flash_mla`` is installed and sglfix's stand-in (``sglfix.harness.flashmla``, the same block table,
lengths and schedule) elsewhere. The judge is the multi-step draft adapters' own: each step's read
against the slot ground truth (the prefix, then the draft tokens of steps 0..i), taken from what the
step's kernel is handed: its block table, expanded to slots up to the key lengths the forward
passes (the metadata's ``seq_lens_k`` where set, else ``forward_batch.seq_lens``), over the pages
the schedule covers. The profile's sglang builds every step from the committed lengths: a known
divergence, cleared by its ``fixes/flashmla-draft-step-lens.patch``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.flashmla_module import device_answers, flashmla_module
from sglfix.harness.adapters.sglang.multistep import MultiStepDraftAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["FlashMLADraftAdapter"]


class FlashMLADraftAdapter(MultiStepDraftAdapter):
    name = "flashmla"
    mla = True
    wrapper_plans = False
    backend_module = "sglang.srt.layers.attention.flashmla_backend"
    step_class = "FlashMLABackend"
    metadata_fields = MetadataFields(indptr=("kv_indptr",), indices={"kv_indices": "kv_indptr"})

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode != "DRAFT_DECODE":
            raise Unavailable(f"the sglang flashmla draft adapter runs DRAFT_DECODE, not {scenario.mode}")
        from sglfix.harness import flashmla
        from sglfix.harness.kits import kit as _kit

        case = _kit("drafts").build_draft(
            scenario, device=device, mla=True, backend="flashmla", page_size=flashmla.PAGE
        )
        case.host = False  # the step backends' forward runs FlashMLA's kernel or its stand-in
        return self.prepared(case, scenario)

    def make_backend(self, prepared: Prepared) -> Any:
        module = flashmla_module()
        with device_answers():
            backend = super().make_backend(prepared)
        for step in backend.attn_backends:
            step._sglfix_standin = module._sglfix_standin
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        with device_answers():
            return super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)

    def watch_steps(self, backend: Any, case: Any) -> None:
        """Nothing at the call: a replay calls no step backend (``read_steps`` reads them)."""

    def read_steps(self, backend: Any, case: Any, batch: Any) -> None:
        """At each init, each step's read as its metadata and the batch give it (for the digest and
        the invariants); after the forward, ``run`` replaces it by what each kernel was handed."""
        for i, step in enumerate(backend.attn_backends):
            md = getattr(step, "forward_metadata", None)
            table = getattr(md, "block_kv_indices", None)
            lens = getattr(md, "seq_lens_k", None)
            schedule = getattr(md, "flashmla_metadata", None)
            reads = _kernel_reads(
                table,
                batch.seq_lens if lens is None else lens,
                schedule if step._sglfix_standin else None,
                rows=int(batch.batch_size) * case.topk,
            )
            if reads is not None:
                case.tables[i] = reads

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        """The forward of every step with FlashMLA's kernel call recorded: the block table, key
        lengths and schedule each step's kernel was handed are what the judge reads, whatever
        the forward computed them from."""
        module = flashmla_module()
        kernel, calls = module.flash_mla_with_kvcache, []

        def recorded(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs)
            return kernel(*args, **kwargs)

        module.flash_mla_with_kvcache = recorded
        try:
            out = super().run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)
        finally:
            module.flash_mla_with_kvcache = kernel
        case = prepared.case
        rows = int(case.replayed.batch_size) * case.topk
        for i, call in enumerate(calls):
            standin = backend.attn_backends[min(i, len(backend.attn_backends) - 1)]._sglfix_standin
            reads = _kernel_reads(
                call.get("block_table"),
                call.get("cache_seqlens"),
                call.get("tile_scheduler_metadata") if standin else None,
                rows=rows,
            )
            if reads is not None:
                case.tables[i] = reads
        return out


def _kernel_reads(table: Any, lens: Any, schedule: Any, *, rows: int) -> Any:
    """What a FlashMLA kernel handed ``table`` (block table), ``lens`` (key lengths) and
    ``schedule`` reads, as a slot-level page table: each row's pages expanded to slots up to its
    key length, a page the schedule leaves out read as -1 (the kernel never attends it). None
    where there is no block table."""
    import torch

    from sglfix.harness import flashmla

    if not isinstance(table, torch.Tensor) or table.dim() != 2 or not isinstance(lens, torch.Tensor):
        return None
    page = flashmla.PAGE
    lens = lens[:rows].to("cpu", torch.int64).tolist()
    host = table.to("cpu", torch.int64)
    covered = None
    if isinstance(schedule, torch.Tensor) and schedule.dim() == 2:
        covered, _ = flashmla.covered_pages(schedule, rows)
    indptr, indices = [0], []
    for r, n in enumerate(lens):
        for pos in range(n):
            p = pos // page
            named = int(host[r, p]) if r < host.shape[0] and p < host.shape[1] else -1
            read = covered is None or flashmla.in_ranges(covered[r], p)
            indices.append(named * page + pos % page if named >= 0 and read else -1)
        indptr.append(len(indices))
    return SimpleNamespace(
        kv_indptr=torch.tensor(indptr, dtype=torch.int64), kv_indices=torch.tensor(indices, dtype=torch.int64)
    )
