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
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import AdapterBase, Prepared, Unavailable
from sglfix.harness.cell import NoOutput
from sglfix.harness.invariants import MetadataFields

__all__ = ["ADAPTER", "FlashInferDraftAdapter"]

_HOST_REASON = (
    "FlashInfer is not available here (needs CUDA): the step backends' page tables were recorded "
    "from sglang's own multi-step code, no attention ran"
)


class FlashInferDraftAdapter(AdapterBase):
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

        case = kit.build_flashinfer_draft(scenario, device=device, mla=self.mla)
        case.host = not (device != "cpu" and kit.has_cuda() and kit.flashinfer_available())
        recorded = kit.mla_steps_recorded(topk=case.topk) if self.mla and not case.host else None
        if recorded:
            case.host = True
            case.notes.append(recorded)
        case.allocs = kit.CudaAllocations(remap=True)
        case.tables = {}  # step -> the page table its step backend was handed last
        case.plans = {}  # step -> what its MLA decode wrapper was planned to read last (CUDA)
        case.output = None
        case.replayed = None  # the batch (view) of the last metadata init
        case.seed = scenario.seed
        return Prepared(case=case, num_slots=case.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        import contextlib
        import importlib

        from sglang.srt.speculative.draft_utils import DraftBackendFactory

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
            backend = DraftBackendFactory(case.runner, case.topk, case.num_steps).create_decode_backend()
        backend._sglfix_case = case  # for static_buffers: the guard zones of this backend's allocations
        if not case.host:
            _observe_steps(backend, case.tables)
            if self.mla:
                for i, step in enumerate(backend.attn_backends):
                    _observe_plan(step.decode_wrapper, case.plans, i)
        return backend

    # ------------------------------------------------------------------ metadata

    def _tables(self, case: Any, backend: Any) -> dict:
        if case.host:
            return {i: step.page_table for i, step in enumerate(backend.attn_backends) if step.page_table is not None}
        return case.tables

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
            with case.allocs:
                backend.init_forward_metadata_out_graph(batch, in_capture=True)
            on_metadata(_Owner(backend, case), batch, f"capture bs={bs}")
        if self.mla and not case.host:
            # The captured wrappers re-plan on replay through sglang's fast plan (installed on
            # each after its capture): record those plans, the ones the replayed kernel follows.
            for i, step in enumerate(backend.attn_backends):
                for wrapper in step.decode_cuda_graph_metadata.values():
                    _observe_plan(wrapper, case.plans, i)
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
            on_metadata(_Owner(backend, case), batch, "eager")
        else:
            view = kit.pad_for_replay(batch, bs=runner.bs, topk=case.topk, num_steps=case.num_steps, fill=runner.fill)
            with case.allocs:
                backend.init_forward_metadata_out_graph(view)
            case.replayed = view
            on_metadata(_Owner(backend, case), view, f"replay bs={runner.bs}")
        if case.host:
            return NoOutput(_HOST_REASON)
        return self._forward(prepared, backend, case.replayed)

    def static_buffers(self, backend: Any) -> list:
        case = getattr(backend, "_sglfix_case", None)
        return list(case.allocs.guarded) if case is not None else []

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        owner = backend if isinstance(backend, _Owner) else None
        if owner is None:
            return []
        tables = self._tables(owner.case, owner.backend)
        rows = forward_batch.batch_size * owner.case.topk
        return [(f"step {i}", tables.get(i), rows) for i in range(len(owner.backend.attn_backends))]

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """Row width against the kernel's need, and each step's page table against the ground truth."""
        import torch

        case = prepared.case
        view = case.replayed
        if view is None:
            return []
        findings: list[tuple[str, str]] = []
        topk, steps = case.topk, case.num_steps
        bs = view.batch_size
        buffer = getattr(backend, "cuda_graph_kv_indices", None) if prepared.case.capture_bs else None
        if buffer is not None:
            need = int(view.seq_lens_sum) * topk + bs * topk * steps
            width = int(buffer.shape[1])
            if width < need:
                findings.append(
                    (
                        "INVARIANT",
                        f"kv_indices rows are {width} wide, the draft kernel writes {need} per "
                        f"row (seq_lens_sum {int(view.seq_lens_sum)} x topk {topk} + "
                        f"{bs} x {topk} branches x {steps} steps)",
                    )
                )
        tables = self._tables(case, backend)
        raw_rows = case.slots.batch_size * topk
        checked = 0
        for i in range(steps - 1):
            table = tables.get(i)
            if table is None:
                findings.append(("INVARIANT", f"step {i}: no page table was handed to the step backend"))
                continue
            want_ptr, want_idx = case.slots.step_page_table(i)
            got_ptr = table.kv_indptr.to(torch.int64).cpu()[: raw_rows + 1].tolist()
            if got_ptr != want_ptr:
                padded = got_ptr + [None] * len(want_ptr)
                r = next(k for k, (a, b) in enumerate(zip(padded, want_ptr)) if a != b)
                findings.append(
                    ("DIVERGE", f"metadata reference: step {i} kv_indptr[{r}] = {padded[r]}, expected {want_ptr[r]}")
                )
                continue
            got_idx = table.kv_indices.to(torch.int64).cpu()[: len(want_idx)]
            want = torch.tensor(want_idx, dtype=torch.int64)
            if got_idx.numel() < want.numel():
                findings.append(
                    (
                        "DIVERGE",
                        f"metadata reference: step {i} kv_indices holds {got_idx.numel()} of the "
                        f"{want.numel()} slots its real rows attend",
                    )
                )
                continue
            bad = (got_idx != want).nonzero()
            if bad.numel():
                k = int(bad[0, 0])
                row = next(r for r in range(raw_rows) if want_ptr[r] <= k < want_ptr[r + 1])
                findings.append(
                    (
                        "DIVERGE",
                        f"metadata reference: step {i} kv_indices[{k}] = {int(got_idx[k])} "
                        f"(row {row}), the slot is {int(want[k])}; {bad.shape[0]}/{want.numel()} "
                        f"entries wrong",
                    )
                )
                continue
            checked += 1
        if self.mla and not case.host:
            findings += self._check_planned_reads(case)
        if any(v != "PASS" for v, _ in findings):
            return findings
        notes = [("PASS", f"note: {n}") for n in case.notes]
        return [
            (
                "PASS",
                f"metadata reference: the page tables of {checked} draft step(s) x {raw_rows} branch row(s) "
                f"are each branch's prefix then its own draft path",
            )
        ] + notes

    def _planned_reads(self, case: Any, step: int) -> list[list[int]] | None:
        """Per real branch row, the slots step ``step``'s MLA kernel was planned to read."""
        import torch

        plan = case.plans.get(step)
        if plan is None:
            return None
        ptr = plan.kv_indptr.to(torch.int64).cpu().tolist()
        lens = plan.kv_len.to(torch.int64).cpu().tolist()
        idx = plan.kv_indices.to(torch.int64).cpu()
        rows = case.slots.batch_size * case.topk
        return [
            idx[ptr[r] : ptr[r] + lens[r]].tolist() if r < len(lens) and r + 1 < len(ptr) else [] for r in range(rows)
        ]

    def _check_planned_reads(self, case: Any) -> list[tuple[str, str]]:
        """Each step's planned read (``kv_indptr``/``kv_len_arr`` of the plan over its
        ``kv_indices``) against the branch's page table; and, when attention ran, whether the
        kernel's output is attention over the planned read."""
        slots = case.slots
        topk, steps = case.topk, case.num_steps
        owner = _slot_owners(slots)
        findings: list[tuple[str, str]] = []
        planned: dict[int, list[list[int]]] = {}
        for i in range(steps - 1):
            reads = self._planned_reads(case, i)
            if reads is None:
                findings.append(("INVARIANT", f"step {i}: its decode wrapper was never planned"))
                continue
            planned[i] = reads
            want_ptr, want_idx = slots.step_page_table(i)
            bad = [r for r in range(len(reads)) if reads[r] != want_idx[want_ptr[r] : want_ptr[r + 1]]]
            if not bad:
                continue
            r = bad[0]
            got, want = reads[r], want_idx[want_ptr[r] : want_ptr[r + 1]]
            b, j = divmod(r, topk)
            if got == want[: len(got)]:
                what = (
                    f"reads {len(got)} slots, its page table has {len(want)} (prefix {slots.prefix_lens[b]} + "
                    f"{i + 1} draft): the plan's kv_len_arr leaves out {_describe(want[len(got) :], owner)}"
                )
            else:
                k = next(
                    k
                    for k in range(min(len(got), len(want)) + 1)
                    if k >= len(got) or k >= len(want) or got[k] != want[k]
                )
                seen = owner.get(got[k], "no slot of this batch") if k < len(got) else "nothing"
                expected = owner.get(want[k], "?") if k < len(want) else "nothing"
                what = (
                    f"reads {len(got)} slots, its page table has {len(want)}; entry {k} is {seen}, the branch "
                    f"attends {expected} there"
                )
            findings.append(
                (
                    "DIVERGE",
                    f"planned read: step {i} row {r} (request {b} branch {j}) {what}; "
                    f"{len(bad)}/{len(reads)} rows wrong",
                )
            )
        if findings and case.output is not None and planned:
            err = self._attention_over(case, planned)
            if err is not None:
                tol = 2e-2 if case.dtype is not None and "16" in str(case.dtype) else 1e-4
                verdict = "equals" if err <= tol else "differs from"
                findings.append(
                    (
                        "PASS",
                        f"note: the kernel's output {verdict} attention over what its wrappers "
                        f"were planned to read (max abs err {err:.3g})"
                        + (": the divergence is the plan's, not the kernel's" if err <= tol else ""),
                    )
                )
        return findings

    def _attention_over(self, case: Any, planned: dict[int, list[list[int]]]) -> float | None:
        """Max abs difference between the kernel's output and attention over the planned reads
        (keys and values from the pool as the kernel sees it)."""
        import torch

        truth = case.truth
        rows = case.slots.batch_size * case.topk
        kbuf = case.runner.token_to_kv_pool.get_key_buffer(0).float()
        out = case.output.float().reshape(rows, case.num_steps - 1, truth.heads, truth.dim_v)
        worst = 0.0
        for i, reads in planned.items():
            q = truth.q[:, :, i].reshape(rows, truth.heads, truth.dim).float()
            for r in range(rows):
                if not reads[r]:
                    continue
                k = kbuf[torch.tensor(reads[r], device=kbuf.device), 0]  # [L, dim]; V is its first dim_v
                p = torch.softmax((q[r] @ k.T) * truth.scale, dim=-1)
                worst = max(worst, float((p @ k[:, : truth.dim_v] - out[r, i]).abs().max()))
        return worst

    # ------------------------------------------------------------------ attention (CUDA + FlashInfer)

    def _truth(self, case: Any, scenario_seed: int) -> SimpleNamespace:
        """Ground truth for the real forward: prefix K/V per request, each (request, branch, step)'s
        draft K/V, and the queries of the attention steps; in the model dtype, on the device."""
        import torch

        model = case.runner.model_config
        gen = torch.Generator().manual_seed(int(scenario_seed) + 7919)
        heads = model.num_attention_heads
        if self.mla:
            dim, dim_v, kv_heads = model.kv_lora_rank + model.qk_rope_head_dim, model.kv_lora_rank, 1
        else:
            dim, dim_v, kv_heads = model.head_dim, model.head_dim, model.num_key_value_heads
        slots = case.slots
        bs, topk, steps = slots.batch_size, slots.topk, slots.num_steps

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen).to(case.dtype).to(case.device)

        prefix_k = [rand(p, kv_heads, dim) for p in slots.prefix_lens]
        draft_k = rand(bs, topk, steps, kv_heads, dim)
        if self.mla:  # the latent: values are its first kv_lora_rank entries
            prefix_v = [k[..., :dim_v] for k in prefix_k]
            draft_v = draft_k[..., :dim_v]
        else:
            prefix_v = [rand(p, kv_heads, dim) for p in slots.prefix_lens]
            draft_v = rand(bs, topk, steps, kv_heads, dim)
        q = rand(bs, topk, max(steps - 1, 1), heads, dim)
        return SimpleNamespace(
            prefix_k=prefix_k,
            prefix_v=prefix_v,
            draft_k=draft_k,
            draft_v=draft_v,
            q=q,
            heads=heads,
            kv_heads=kv_heads,
            dim=dim,
            dim_v=dim_v,
            scale=dim**-0.5,
        )

    def _layer(self, truth: SimpleNamespace) -> Any:
        from sglang.srt.layers.radix_attention import RadixAttention

        return RadixAttention(
            num_heads=truth.heads,
            head_dim=truth.dim,
            scaling=truth.scale,
            num_kv_heads=truth.kv_heads,
            layer_id=0,
            v_head_dim=truth.dim_v,
        )

    def _write(self, pool: Any, layer: Any, loc: Any, k: Any, v: Any) -> None:
        if self.mla:
            rank = layer.v_head_dim
            pool.set_mla_kv_buffer(layer, loc, k[..., :rank].contiguous(), k[..., rank:].contiguous())
        else:
            pool.set_kv_buffer(layer, loc, k, v)

    def _forward(self, prepared: Prepared, backend: Any, view: Any) -> Any:
        """Every attention step through its real step backend over the metadata just built: the
        prefix K/V and each step's draft K/V written at their slots, the step's queries (one per
        branch; padded rows zero) attended; output packed (request, branch, step)."""
        import torch
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        case = prepared.case
        truth = case.truth = self._truth(case, case.seed)
        layer = self._layer(truth)
        pool = case.runner.token_to_kv_pool
        slots = case.slots
        bs, topk, steps = slots.batch_size, slots.topk, slots.num_steps
        dev = case.device
        loc = torch.tensor([s for row in slots.prefix for s in row], dtype=torch.int64, device=dev)
        if loc.numel():
            self._write(pool, layer, loc, torch.cat(truth.prefix_k), torch.cat(truth.prefix_v))
        draft_loc = torch.tensor(slots.draft, dtype=torch.int64, device=dev)  # [bs, topk, steps]
        self._write(
            pool,
            layer,
            draft_loc.reshape(-1),
            truth.draft_k.reshape(bs * topk * steps, truth.kv_heads, -1),
            truth.draft_v.reshape(bs * topk * steps, truth.kv_heads, -1),
        )
        rows = view.batch_size * topk
        outs = []
        for i in range(steps - 1):
            q = torch.zeros(rows, truth.heads, truth.dim, dtype=case.dtype, device=dev)
            q[: bs * topk] = truth.q[:, :, i].reshape(bs * topk, truth.heads, truth.dim)
            step_view = SimpleNamespace(**vars(view))
            step_view.out_cache_loc = torch.zeros(rows, dtype=torch.int64, device=dev)
            step_view.out_cache_loc[: bs * topk] = draft_loc[:, :, i].reshape(-1)
            step = backend.attn_backends[i]
            with torch.no_grad(), forward_context(ForwardContext(attn_backend=step)):
                out = step.forward_decode(q.reshape(rows, -1), None, None, layer, step_view, save_kv_cache=False)
            outs.append(out.reshape(rows, truth.heads, truth.dim_v)[: bs * topk])
        # [bs * topk, steps - 1, H, Dv] -> packed in (request, branch, step) order
        case.output = torch.stack(outs, dim=1).reshape(-1, truth.heads, truth.dim_v)
        return case.output

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        """Branch (b, j) at step i attends b's prefix, then its own draft tokens of steps 0..i."""
        import torch

        from sglfix.harness.reference import reference_attention

        case = prepared.case
        truth = case.truth
        slots = case.slots
        bs, topk, steps = slots.batch_size, slots.topk, slots.num_steps
        nq = steps - 1
        longest = max(slots.prefix_lens) + nq
        rows = bs * topk
        dev = truth.q.device
        k_pad = torch.zeros(rows, longest, truth.kv_heads, truth.dim, dtype=truth.q.dtype, device=dev)
        v_pad = torch.zeros(rows, longest, truth.kv_heads, truth.dim_v, dtype=truth.q.dtype, device=dev)
        mask = torch.zeros(rows, nq, longest, dtype=torch.bool, device=dev)
        for b, p in enumerate(slots.prefix_lens):
            for j in range(topk):
                r = b * topk + j
                k_pad[r, :p], v_pad[r, :p] = truth.prefix_k[b], truth.prefix_v[b]
                k_pad[r, p : p + nq], v_pad[r, p : p + nq] = truth.draft_k[b, j, :nq], truth.draft_v[b, j, :nq]
                for i in range(nq):
                    mask[r, i, : p + i + 1] = True
        q_pad = truth.q[:, :, :nq].reshape(rows, nq, truth.heads, truth.dim)
        ref = reference_attention(q_pad=q_pad, k_pad=k_pad, v_pad=v_pad, mask=mask, scale=truth.scale)
        return ref, torch.ones(rows, nq, dtype=torch.bool, device=dev)


class _Owner:
    """The backend and its case, handed to the metadata hook (the hook's ``backend`` argument)."""

    def __init__(self, backend: Any, case: Any) -> None:
        self.backend, self.case = backend, case


def _observe_plan(wrapper: Any, plans: dict, step: int) -> None:
    """Record what an MLA decode wrapper is planned to read (``plan(qo_indptr, kv_indptr,
    kv_indices, kv_len_arr, ...)``: eager plans and sglang's replay fast plan share the order),
    then plan unchanged. Clones only: no host sync inside the forward."""
    original = wrapper.plan

    def plan(qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any, *args: Any, **kwargs: Any) -> Any:
        plans[step] = SimpleNamespace(
            kv_indptr=kv_indptr.clone(), kv_indices=kv_indices.clone(), kv_len=kv_len_arr.clone()
        )
        return original(qo_indptr, kv_indptr, kv_indices, kv_len_arr, *args, **kwargs)

    wrapper.plan = plan


def _slot_owners(slots: Any) -> dict[int, str]:
    owners = {}
    for b, row in enumerate(slots.prefix):
        for p, slot in enumerate(row):
            owners[slot] = f"request {b}'s prefix position {p}"
    for b, branches in enumerate(slots.draft):
        for j, path in enumerate(branches):
            for t, slot in enumerate(path):
                owners[slot] = f"request {b} branch {j}'s draft of step {t}"
    return owners


def _describe(missing: list[int], owner: dict[int, str]) -> str:
    shown = ", ".join(owner.get(s, f"slot {s}") for s in missing[:2])
    return shown + (f" and {len(missing) - 2} more" if len(missing) > 2 else "")


def _observe_steps(backend: Any, tables: dict) -> None:
    """Record, for real step backends, the page table each is handed (``spec_info.kv_indptr`` /
    ``kv_indices`` at the call), then call it unchanged."""
    for i, step in enumerate(backend.attn_backends):
        for method in ("init_forward_metadata", "init_forward_metadata_out_graph"):
            original = getattr(step, method)

            def observed(forward_batch: Any, *args: Any, _i: int = i, _original: Any = original, **kwargs: Any) -> Any:
                spec = forward_batch.spec_info
                tables[_i] = SimpleNamespace(kv_indptr=spec.kv_indptr.clone(), kv_indices=spec.kv_indices.clone())
                return _original(forward_batch, *args, **kwargs)

            setattr(step, method, observed)


ADAPTER = FlashInferDraftAdapter()
