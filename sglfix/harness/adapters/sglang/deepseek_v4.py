"""Real sglang's DeepSeek-V4 multi-step draft (``DeepseekV4MultiStepBackend``, DRAFT_DECODE,
topk 1, graphs off): PR 26239's path.

The backend is built as production builds it (``DraftBackendFactory(...).create_decode_backend()``
over the kit's DSv4 runner configured as an EAGLE draft worker); the draft batch carries
``out_cache_loc`` for every step, laid out ``[bs, topk, num_steps]``, in scattered slots.

DSv4 bakes each step's KV write location into the metadata its step backend builds. The judge:
sglfix's invariants on every step's metadata, plus a metadata reference: step ``i``'s baked write
locations must be exactly that step's slots of the multi-step buffer (``view(bs, topk, num_steps)
.permute(2, 0, 1).reshape(num_steps, -1)[i]``), computed from the slot ground truth, never from the
backend. No attention output is compared (FlashMLA's sparse decode over an FP8 cache; no
reference for it here).

Where it runs: on CPU the constructor and each step backend's ``_build_forward_metadata`` run (the
first statement of its ``init_forward_metadata``; the rest of that method builds FlashMLA's
schedule and needs the ``flash_mla`` package): the metadata checked is the raw decode metadata
(``req_pool_indices``, ``seq_lens``, ``out_cache_loc``). With CUDA and ``flash_mla`` the full
``init_forward_metadata`` runs and the full metadata is checked (``raw_out_loc``,
``swa_out_cache_loc``, page table and window indices). Graph scenarios are not run by this
adapter (SKIP): the graph path bypasses the eager slice PR 26239 fixed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import AdapterBase, Prepared
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import NoOutput, Unavailable

__all__ = ["ADAPTER", "DeepseekV4DraftAdapter"]

_CPU_REASON = (
    "the DSv4 draft attention needs flash_mla (CUDA): only each step backend's "
    "_build_forward_metadata ran (the part of init_forward_metadata before FlashMLA's schedule)"
)
_GPU_REASON = "the DSv4 draft attention (FlashMLA sparse decode over an FP8 cache) is not compared by this adapter"


class DeepseekV4DraftAdapter(AdapterBase):
    name = "deepseek_v4"
    # Raw decode metadata (CPU) and the full metadata (CUDA + flash_mla): absent fields are skipped.
    metadata_fields = MetadataFields(
        lengths=("seq_lens", "seq_lens_casual", "positions_casual", "swa_topk_lengths"),
        block_tables={
            "page_table": ("seq_lens_casual", "page_size"),
            "swa_page_indices": ("swa_topk_lengths", "swa_index_page_size"),
        },
        locations=("out_cache_loc", "raw_out_loc", "swa_out_cache_loc"),
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode != "DRAFT_DECODE":
            raise Unavailable(
                f"the sglang {self.name} adapter runs the multi-step draft (DRAFT_DECODE), not {scenario.mode}"
            )
        if scenario.capture_bs:
            raise Unavailable(
                "the sglang DSv4 adapter runs the draft with graphs off only: the graph path "
                "(EAGLEDraftCudaGraphRunner, init_forward_metadata_in_graph) is not driven here"
            )
        from sglfix.harness.kits import kit

        build_dsv4_draft, flash_mla_available = kit("drafts").build_dsv4_draft, kit("drafts").flash_mla_available

        if device != "cpu" and not flash_mla_available():
            # On CUDA sglang's DSv4 constructor imports flash_mla (the CPU path does not).
            raise Unavailable(
                "DeepseekV4AttnBackend needs flash_mla on CUDA, which is not installed here "
                "(pip install sgl-flash-mla; or run the DSv4 scenarios with --device cpu)"
            )
        case = build_dsv4_draft(scenario, device=device)
        return Prepared(case=case, num_slots=case.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        from sglfix.harness.codefault import BrokenContract
        from sglfix.harness.kits import kit

        case = prepared.case
        backend = kit("drafts").draft_backend_factory(case.runner, case.topk, case.num_steps).create_decode_backend()
        if backend is None:
            raise BrokenContract(f"create_decode_backend built no draft backend for {case.num_steps} step(s)")
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        return None

    def _full_init(self, prepared: Prepared) -> bool:
        from sglfix.harness.kits import kit

        flash_mla_available, has_cuda = kit("drafts").flash_mla_available, kit("drafts").has_cuda

        import torch

        # The case's device is a torch.device, which never equals the string "cpu".
        return torch.device(prepared.case.device).type != "cpu" and has_cuda() and flash_mla_available()

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        case = prepared.case
        batch = case.batch
        if self._full_init(prepared):
            backend.init_forward_metadata(batch)
            on_metadata(backend, batch, "eager")
            return NoOutput(_GPU_REASON)
        # What DeepseekV4MultiStepBackend.init_forward_metadata does, child by child, up to FlashMLA.
        for step in backend.attn_backends[: backend.speculative_num_steps - 1]:
            step.forward_metadata = step._build_forward_metadata(batch)
        on_metadata(backend, batch, "eager")
        return NoOutput(_CPU_REASON)

    def static_buffers(self, backend: Any) -> list:
        return []

    def _steps(self, backend: Any) -> list:
        return list(backend.attn_backends[: backend.speculative_num_steps - 1])

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        # The rows the batch asks for: the backend's own topk may be what a change broke.
        topk = backend.topk if isinstance(getattr(backend, "topk", None), int) else 1
        rows = forward_batch.batch_size * topk
        return [(f"step {i}", _view(step.forward_metadata), rows) for i, step in enumerate(self._steps(backend))]

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """Each step's baked write locations against that step's slots (from the ground truth)."""
        import torch

        case = prepared.case
        slots = case.slots
        findings: list[tuple[str, str]] = []
        steps = self._steps(backend)
        if len(steps) != case.num_steps - 1:
            # A draft of num_steps steps runs num_steps - 1 attention steps, each on its own backend.
            findings.append(
                (
                    "INVARIANT",
                    f"the multi-step backend holds {len(steps)} draft step backend(s) for {case.num_steps} steps "
                    f"({case.num_steps - 1} wanted)",
                )
            )
        for i, step in enumerate(steps):
            view = _view(step.forward_metadata)
            if view is None:
                findings.append(("INVARIANT", f"step {i}: no metadata after init_forward_metadata"))
                continue
            # The fields every decode step's kernels read: a None in their place is metadata lost.
            lost = [n for n in ("req_pool_indices", "seq_lens") if hasattr(view, n) and getattr(view, n) is None]
            locations = [n for n in ("out_cache_loc", "raw_out_loc", "swa_out_cache_loc") if hasattr(view, n)]
            if locations and all(getattr(view, n) is None for n in locations):
                lost.append("/".join(locations))
            if lost:
                findings.append(("INVARIANT", f"step {i}: {', '.join(lost)} None after init_forward_metadata"))
            expected = torch.tensor(slots.step_slots(i), dtype=torch.int64)
            for name in ("out_cache_loc", "raw_out_loc", "swa_out_cache_loc"):
                got = getattr(view, name, None)
                if got is None:
                    continue
                got = got.reshape(-1).to(torch.int64).cpu()
                if name == "swa_out_cache_loc":
                    mapping = case.runner.token_to_kv_pool.full_to_swa_index_mapping
                    want = mapping[expected.to(mapping.device)].to(torch.int64).cpu()
                else:
                    want = expected
                findings += _compare_locations(f"step {i} {name}", got, want)
            for name, want in (
                ("req_pool_indices", list(range(slots.batch_size))),
                ("seq_lens", list(slots.prefix_lens)),
            ):
                got = getattr(view, name, None)
                if got is not None and got.reshape(-1).tolist() != want:
                    findings.append(("DIVERGE", f"metadata reference: step {i} {name} {got.tolist()} != {want}"))
        bad = [f for f in findings if f[0] != "PASS"]
        if bad:
            return bad
        fields = "raw out_cache_loc" if not self._full_init(prepared) else "raw_out_loc and swa_out_cache_loc"
        return [
            (
                "PASS",
                f"metadata reference: the baked write locations ({fields}) of {len(steps)} draft step(s) "
                f"x {slots.batch_size * slots.topk} row(s) are each step's own slots",
            )
        ]

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        raise NotImplementedError("the sglang DSv4 draft adapter compares metadata only")


def _compare_locations(what: str, got: Any, want: Any) -> list[tuple[str, str]]:
    if got.numel() != want.numel():
        return [
            (
                "DIVERGE",
                f"metadata reference: {what} has {got.numel()} entries, the step writes "
                f"{want.numel()} (one per request and branch)",
            )
        ]
    diff = (got != want).nonzero()
    if diff.numel():
        r = int(diff[0, 0])
        return [
            (
                "DIVERGE",
                f"metadata reference: {what}[{r}] = {int(got[r])}, the step's slot is {int(want[r])} "
                f"({diff.shape[0]}/{want.numel()} rows wrong)",
            )
        ]
    return []


def _view(metadata: Any) -> Any:
    if metadata is None:
        return None
    core = getattr(metadata, "core_attn_metadata", None)
    if core is not None:  # DSV4Metadata (full init): the core's fields; window indices are slots
        return SimpleNamespace(**vars(core), swa_index_page_size=1)
    if hasattr(metadata, "out_cache_loc"):  # DSV4RawDecodeMetadata
        return SimpleNamespace(
            req_pool_indices=metadata.req_pool_indices, seq_lens=metadata.seq_lens, out_cache_loc=metadata.out_cache_loc
        )
    return None


ADAPTER = DeepseekV4DraftAdapter()
