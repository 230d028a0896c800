"""The FlashInfer-MLA draft judge reads what the kernel was *planned* to read.

FlashInfer's MLA schedule comes from the plan's host ``kv_indptr`` / ``kv_len_arr``; sglang 0.5.23
plans its multi-step MLA draft wrappers from ``seq_lens`` (eager: the decode updater builds the
prefix page table and ignores the spec one; replay: ``cumsum(seq_lens_cpu)`` over the spec
``kv_indices``). These tests hand the judge plans built by those two rules and by the correct one,
and check it names each and that its kernel cross-check tells a faithful kernel from a wrong one.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch

from sglfix.harness.adapters.sglang.flashinfer_mla import FlashInferMLADraftAdapter
from sglfix.harness.kits.sglang_0_5_23.drafts import DraftSlots

# The multi-step draft side of backend flashinfer_mla (the dense side is sglang.flashinfer_mla_dense).
ADAPTER = FlashInferMLADraftAdapter()


def _case(plans_of) -> SimpleNamespace:
    slots = DraftSlots.allocate((5, 9, 3), topk=1, num_steps=3, num_slots=64, seed=3)
    case = SimpleNamespace(slots=slots, topk=1, num_steps=3, dtype=torch.float32, output=None, plans={})
    for i in range(slots.num_steps - 1):
        ptr, lens, idx = plans_of(slots, i)
        case.plans[i] = SimpleNamespace(
            kv_indptr=torch.tensor(ptr), kv_len=torch.tensor(lens), kv_indices=torch.tensor(idx)
        )
    return case


def _spec(slots, i):  # what the spec page table says: the correct plan
    ptr, idx = slots.step_page_table(i)
    return ptr, [b - a for a, b in itertools.pairwise(ptr)], idx


def _eager_0_5_23(slots, i):  # decode updater without spec_info: the prefix page table
    lens = list(slots.prefix_lens)
    ptr = [0]
    for n in lens:
        ptr.append(ptr[-1] + n)
    return ptr, lens, [s for row in slots.prefix for s in row]


def _replay_0_5_23(slots, i):  # fast plan: cumsum(seq_lens_cpu) over the spec kv_indices
    lens = list(slots.prefix_lens)
    ptr = [0]
    for n in lens:
        ptr.append(ptr[-1] + n)
    return ptr, lens, slots.step_page_table(i)[1]


def test_a_correct_plan_has_no_finding():
    assert ADAPTER._check_planned_reads(_case(_spec)) == []


def test_the_eager_plan_over_the_prefix_misses_the_draft_path():
    found = ADAPTER._check_planned_reads(_case(_eager_0_5_23))
    assert [v for v, _ in found] == ["DIVERGE", "DIVERGE"]
    assert "step 0 row 0 (request 0 branch 0) reads 5 slots, its page table has 6" in found[0][1]
    assert "leaves out request 0 branch 0's draft of step 0" in found[0][1] and "3/3 rows wrong" in found[0][1]


def test_the_replay_plan_reads_another_requests_slots():
    found = ADAPTER._check_planned_reads(_case(_replay_0_5_23))
    msg = found[0][1]
    # Row 0 is its prefix cut short; row 1 starts inside row 0's draft path.
    assert msg.startswith("planned read: step 0 row 0") and "3/3 rows wrong" in msg
    case = _case(_replay_0_5_23)
    reads = ADAPTER._planned_reads(case, 0)
    assert reads[1][0] == case.slots.draft[0][0][0]  # request 0's draft slot, read as request 1's


def _with_kernel(case, *, faithful: bool):
    """A pool and an output: attention over the planned reads (a faithful kernel) or over the
    spec page table (one that ignored its plan)."""
    heads, dim, dim_v = 2, 8, 6
    gen = torch.Generator().manual_seed(0)
    kbuf = torch.randn(64, 1, dim, generator=gen)
    rows, nq = case.slots.batch_size, case.num_steps - 1
    q = torch.randn(case.slots.batch_size, 1, nq, heads, dim, generator=gen)
    case.truth = SimpleNamespace(q=q, heads=heads, dim=dim, dim_v=dim_v, scale=dim**-0.5)
    case.runner = SimpleNamespace(token_to_kv_pool=SimpleNamespace(get_key_buffer=lambda layer: kbuf))
    out = torch.zeros(rows, nq, heads, dim_v)
    for i in range(nq):
        ptr, idx = case.slots.step_page_table(i)
        for r in range(rows):
            read = ADAPTER._planned_reads(case, i)[r] if faithful else idx[ptr[r] : ptr[r + 1]]
            k = kbuf[torch.tensor(read), 0]
            p = torch.softmax((q[r, 0, i] @ k.T) * case.truth.scale, dim=-1)
            out[r, i] = p @ k[:, :dim_v]
    case.output = out.reshape(-1, heads, dim_v)
    return case


def test_the_kernel_cross_check_says_whose_divergence_it_is():
    faithful = ADAPTER._check_planned_reads(_with_kernel(_case(_replay_0_5_23), faithful=True))
    assert (
        faithful[-1][0] == "PASS" and "equals attention over what its wrappers were planned to read" in faithful[-1][1]
    )
    assert "the plan's, not the kernel's" in faithful[-1][1]
    other = ADAPTER._check_planned_reads(_with_kernel(_case(_replay_0_5_23), faithful=False))
    assert "differs from attention over what its wrappers were planned to read" in other[-1][1]
