"""What the judge records of a FlashInfer multi-step draft on real sglang and checks after the run,
beside the invariant table: the page table each step backend is handed (``observe_steps``) and,
for MLA, what each decode wrapper is planned to read (``observe_plan``); the replayed batch's
``seq_lens_sum`` against its ``seq_lens`` (the draft backend slices from the sum); the kv_indices row width
against what the draft kernel writes; each step's page table against the slot ground truth (each
branch's prefix, then its own draft path); and each MLA step's planned read against it, with
whether the kernel's output is attention over what it was planned to read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.sglang.truth import first_difference

__all__ = [
    "attention_over",
    "check_draft_metadata",
    "check_planned_reads",
    "observe_plan",
    "observe_steps",
    "planned_reads",
    "step_tables",
]


def step_tables(case: Any, backend: Any) -> dict:
    """Step -> the page table its step backend was handed last: kept by the recorders that stand
    in for the step backends on the host, by ``observe_steps`` where the real ones run."""
    if case.host:
        return {i: step.page_table for i, step in enumerate(backend.attn_backends) if step.page_table is not None}
    return case.tables


def check_draft_metadata(case: Any, backend: Any, *, mla: bool) -> list[tuple[str, str]]:
    """Row width against the kernel's need, and each step's page table against the ground truth."""
    import torch

    view = case.replayed
    if view is None:
        return []
    findings: list[tuple[str, str]] = [
        ("INVARIANT", f"capture bs={bs}: step {i} was handed no page table (the captured draft forward reads none)")
        for bs, i in case.unhanded
    ]
    topk, steps = case.topk, case.num_steps
    bs = view.batch_size
    lens_sum = int(view.seq_lens.to(torch.int64).sum())
    if view.seq_lens_sum is not None and int(view.seq_lens_sum) != lens_sum:
        # The draft backend sizes and slices every step's kv_indices from this sum.
        findings.append(
            (
                "INVARIANT",
                f"the batch the draft backend was handed says seq_lens_sum {int(view.seq_lens_sum)}, "
                f"its {bs} seq_lens sum to {lens_sum}",
            )
        )
    buffer = getattr(backend, "cuda_graph_kv_indices", None) if case.capture_bs else None
    if buffer is not None:
        need = lens_sum * topk + bs * topk * steps
        width = int(buffer.shape[1])
        if width < need:
            findings.append(
                (
                    "INVARIANT",
                    f"kv_indices rows are {width} wide, the draft kernel writes {need} per "
                    f"row (seq_lens sum {lens_sum} x topk {topk} + "
                    f"{bs} x {topk} branches x {steps} steps)",
                )
            )
    tables = step_tables(case, backend)
    raw_rows = case.slots.batch_size * topk
    checked = 0
    for i in range(steps - 1):
        table = tables.get(i)
        if table is None:
            findings.append(("INVARIANT", f"step {i}: no page table was handed to the step backend"))
            continue
        want_ptr, want_idx = case.slots.step_page_table(i)
        wrong = _first_difference(table.kv_indptr, want_ptr)
        if wrong is not None:
            r, got = wrong
            findings.append(("DIVERGE", f"metadata reference: step {i} kv_indptr[{r}] = {got}, expected {want_ptr[r]}"))
            continue
        # The step's plan may read the host's indptr instead of the device's: the two must agree
        # on every live row (padded rows may differ: their host lengths are the fill value).
        host = getattr(table, "host_indptr", None)
        wrong = None if host is None else _first_difference(host, want_ptr)
        if wrong is not None:
            r, got = wrong
            findings.append(
                (
                    "DIVERGE",
                    f"metadata reference: step {i}'s host plan indptr[{r}] = {got}, expected "
                    f"{want_ptr[r]} (the plan reads it in place of the device's kv_indptr)",
                )
            )
            continue
        if table.kv_indices is None:
            findings.append(("INVARIANT", f"step {i}: its metadata has kv_indptr but kv_indices is None"))
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
    if mla and not case.host:
        findings += check_planned_reads(case)
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


def planned_reads(case: Any, step: int) -> list[list[int]] | None:
    """Per real branch row, the slots step ``step``'s MLA kernel was planned to read."""
    import torch

    plan = case.plans.get(step)
    if plan is None:
        return None
    ptr = plan.kv_indptr.to(torch.int64).cpu().tolist()
    lens = plan.kv_len.to(torch.int64).cpu().tolist()
    idx = plan.kv_indices.to(torch.int64).cpu()
    rows = case.slots.batch_size * case.topk
    return [idx[ptr[r] : ptr[r] + lens[r]].tolist() if r < len(lens) and r + 1 < len(ptr) else [] for r in range(rows)]


def check_planned_reads(case: Any) -> list[tuple[str, str]]:
    """Each step's planned read (``kv_indptr``/``kv_len_arr`` of the plan over its
    ``kv_indices``) against the branch's page table; and, when attention ran, whether the
    kernel's output is attention over the planned read."""
    slots = case.slots
    topk, steps = case.topk, case.num_steps
    owner = _slot_owners(slots)
    findings: list[tuple[str, str]] = []
    planned: dict[int, list[list[int]]] = {}
    for i in range(steps - 1):
        reads = planned_reads(case, i)
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
                k for k in range(min(len(got), len(want)) + 1) if k >= len(got) or k >= len(want) or got[k] != want[k]
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
                f"planned read: step {i} row {r} (request {b} branch {j}) {what}; {len(bad)}/{len(reads)} rows wrong",
            )
        )
    if findings and case.output is not None and planned:
        err = attention_over(case, planned)
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


def attention_over(case: Any, planned: dict[int, list[list[int]]]) -> float | None:
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


def observe_plan(wrapper: Any, plans: dict, step: int) -> None:
    """Record what an MLA decode wrapper is planned to read (``plan(qo_indptr, kv_indptr,
    kv_indices, kv_len_arr, ...)``: eager plans and sglang's replay fast plan share the order),
    then plan unchanged. Clones only: no host sync inside the forward."""
    original = wrapper.plan

    def plan(qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any, *args: Any, **kwargs: Any) -> Any:
        # What fails from here on (FlashInfer refusing the plan, an argument that is no tensor)
        # is the planning code's, which this only watches (sglfix.harness.misfit).
        __sglfix_passthrough__ = True  # noqa: F841
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


def observe_steps(backend: Any, tables: dict) -> None:
    """Record, for real step backends, the page table each is handed (``spec_info.kv_indptr`` /
    ``kv_indices`` at the call), then call it unchanged."""
    for i, step in enumerate(backend.attn_backends):
        for method in ("init_forward_metadata", "init_forward_metadata_out_graph"):
            original = getattr(step, method)

            def observed(
                forward_batch: Any, *args: Any, _i: int = i, _original: Any = original, _step: Any = step, **kwargs: Any
            ) -> Any:
                # Reads only what the caller passed, as the step's own code would: what fails is the caller's.
                __sglfix_passthrough__ = True  # noqa: F841
                spec = forward_batch.spec_info
                tables[_i] = SimpleNamespace(
                    kv_indptr=spec.kv_indptr.clone(), kv_indices=spec.kv_indices.clone(), host_indptr=_host_plan(_step)
                )
                return _original(forward_batch, *args, **kwargs)

            setattr(step, method, observed)


def _first_difference(got: Any, want: list[int]) -> tuple[int, int | None] | None:
    """The first index where the indptr ``got`` (over ``want``'s rows) differs from ``want``, and
    its value there (None: ``got`` ends first); None where they agree."""
    import torch

    given = got.to(torch.int64).cpu()[: len(want)].tolist()
    r = first_difference(given, want)
    if r is None:
        return None
    return r, given[r] if r < len(given) else None


def _host_plan(step: Any) -> Any:
    """The host plan published for ``step``'s call by its module (``kit.host_plan``)."""
    import sys

    from sglfix.harness.kits import kit

    return kit("drafts").host_plan(sys.modules.get(type(step).__module__))
