"""The torch stand-ins of FlashInfer's wrappers read what FlashInfer's kernels read: the device
buffers at run time, the packed custom mask bit by bit, raw kv_indices memory, and they merge
partial attentions as merge_state does. Each is checked against attention written out by hand."""

from __future__ import annotations

import math
import types

import pytest
import torch

from sglfix.harness import torchfi
from sglfix.harness.codefault import OutOfBounds
from sglfix.harness.torchfi import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    fast_decode_plan,
    merge_state,
)

H, HKV, D, SLOTS = 4, 2, 16, 64


def _by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [Q, H, D] against k/v [L, HKV, D] where visible[Q, L]."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,lhd->hql", q.float(), kk) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("hql,lhd->qhd", torch.softmax(scores, -1), vv)


@pytest.fixture
def cache():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(SLOTS, HKV, D, generator=gen), torch.randn(SLOTS, HKV, D, generator=gen)


def _workspace() -> torch.Tensor:
    return torch.empty(16, dtype=torch.uint8)


def test_paged_prefill_reads_the_packed_custom_mask_of_each_request(cache):
    k_cache, v_cache = cache
    gen = torch.Generator().manual_seed(1)
    q_lens, kv_lens = [3, 2], [7, 5]
    slots = torch.randperm(SLOTS, generator=gen)[: sum(kv_lens)].to(torch.int32)
    masks = [torch.rand(ql, kl, generator=gen) > 0.4 for ql, kl in zip(q_lens, kv_lens)]
    for m in masks:
        m[:, 0] = True  # every row sees something
    q = torch.randn(sum(q_lens), H, D, generator=gen)
    qo = torch.tensor([0, 3, 5], dtype=torch.int32)
    kv = torch.tensor([0, 7, 12], dtype=torch.int32)
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace(), "NHD", backend="fa2")
    w.plan(qo, kv, slots, torch.ones(2, dtype=torch.int32), H, HKV, D, 1,
           custom_mask=torch.cat([m.reshape(-1) for m in masks]))  # fmt: skip
    out = w.forward(q, (k_cache, v_cache), causal=True)
    for r in range(len(q_lens)):
        rows, keys = slice(int(qo[r]), int(qo[r + 1])), slots[int(kv[r]) : int(kv[r + 1])].long()
        want = _by_hand(q[rows], k_cache[keys], v_cache[keys], masks[r])
        torch.testing.assert_close(out[rows].float(), want, atol=1e-4, rtol=1e-4)


def test_graph_decode_after_fast_plan_reads_the_buffers_as_they_are_at_run_time(cache):
    k_cache, v_cache = cache
    indptr_buf = torch.zeros(3, dtype=torch.int32)
    indices_buf = torch.zeros(32, dtype=torch.int32)
    w = BatchDecodeWithPagedKVCacheWrapper(
        _workspace(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=torch.ones(2, dtype=torch.int32),
    )  # fmt: skip
    w.plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([5, 6], dtype=torch.int32),
           torch.ones(2, dtype=torch.int32), H, HKV, D, 1)  # fmt: skip
    w.begin_forward = types.MethodType(fast_decode_plan, w)
    # The caller writes the graph buffers itself; fast_decode_plan copies nothing.
    indptr_buf.copy_(torch.tensor([0, 3, 5], dtype=torch.int32))
    indices_buf[:5] = torch.tensor([10, 11, 12, 20, 21], dtype=torch.int32)
    w.begin_forward(torch.zeros(3, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
                    torch.ones(2, dtype=torch.int32), H, HKV, D, 1)  # fmt: skip
    q = torch.randn(2, H, D)
    out = w.forward(q, (k_cache, v_cache))
    for r, keys in enumerate(([10, 11, 12], [20, 21])):
        want = _by_hand(q[r : r + 1], k_cache[keys], v_cache[keys], torch.ones(1, len(keys), dtype=torch.bool))
        torch.testing.assert_close(out[r : r + 1].float(), want, atol=1e-4, rtol=1e-4)
    # A later write to the buffer changes what the next launch reads.
    indices_buf[0] = 30
    moved = w.forward(q, (k_cache, v_cache))
    assert not torch.allclose(moved[0], out[0]) and torch.allclose(moved[1], out[1])


def test_ragged_and_paged_parts_merge_into_attention_over_both(cache):
    """EXTEND with a prefix: causal over the new tokens (ragged), all of the prefix (paged)."""
    k_cache, v_cache = cache
    gen = torch.Generator().manual_seed(2)
    prefix, new = 6, 4
    slots = torch.randperm(SLOTS, generator=gen)[:prefix].to(torch.int32)
    q, k, v = (torch.randn(new, n, D, generator=gen) for n in (H, HKV, HKV))
    qo = torch.tensor([0, new], dtype=torch.int32)
    ragged = BatchPrefillWithRaggedKVCacheWrapper(_workspace(), "NHD")
    ragged.begin_forward(qo, qo, H, HKV, D)
    paged = BatchPrefillWithPagedKVCacheWrapper(_workspace(), "NHD")
    paged.begin_forward(qo, torch.tensor([0, prefix], dtype=torch.int32), slots, torch.ones(1, dtype=torch.int32),
                        H, HKV, D, 1)  # fmt: skip
    o1, s1 = ragged.forward_return_lse(q, k, v, causal=True)
    o2, s2 = paged.forward_return_lse(q, (k_cache, v_cache), causal=False)
    merged, _ = merge_state(o1, s1, o2, s2)
    keys = torch.cat([k_cache[slots.long()], k])
    values = torch.cat([v_cache[slots.long()], v])
    visible = torch.arange(prefix + new)[None, :] <= prefix + torch.arange(new)[:, None]
    torch.testing.assert_close(merged.float(), _by_hand(q, keys, values, visible), atol=1e-4, rtol=1e-4)


def test_a_row_too_narrow_reads_on_into_its_allocation_and_past_it_raises(cache):
    k_cache, v_cache = cache
    allocation = torch.tensor([1, 2, 3, 40, 41], dtype=torch.int32)
    w = BatchDecodeWithPagedKVCacheWrapper(_workspace(), "NHD")
    w.plan(torch.tensor([0, 5], dtype=torch.int32), allocation[:3], torch.ones(1, dtype=torch.int32), H, HKV, D, 1)
    q = torch.randn(1, H, D)
    keys = [1, 2, 3, 40, 41]  # two entries past the 3-entry view, as the kernel reads them
    want = _by_hand(q, k_cache[keys], v_cache[keys], torch.ones(1, 5, dtype=torch.bool))
    torch.testing.assert_close(w.forward(q, (k_cache, v_cache)).float(), want, atol=1e-4, rtol=1e-4)
    w.plan(torch.tensor([0, 6], dtype=torch.int32), allocation, torch.ones(1, dtype=torch.int32), H, HKV, D, 1)
    with pytest.raises(RuntimeError, match="past the end of its allocation"):
        w.forward(q, (k_cache, v_cache))


def test_a_graph_plan_refuses_another_batch_size():
    w = BatchPrefillWithPagedKVCacheWrapper(
        _workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=torch.zeros(3, dtype=torch.int32),
        paged_kv_indptr_buf=torch.zeros(3, dtype=torch.int32), paged_kv_indices_buf=torch.zeros(8, dtype=torch.int32),
        paged_kv_last_page_len_buf=torch.ones(2, dtype=torch.int32),
    )  # fmt: skip
    with pytest.raises(ValueError, match="batch size should be fixed"):
        w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
               torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), H, HKV, D, 1)  # fmt: skip


def test_install_binds_the_names_only_where_flashinfer_is_missing():
    bare = types.ModuleType("bare")
    assert torchfi.install(bare) and torchfi.installed(bare)
    assert bare.fast_decode_plan is fast_decode_plan and bare._safe_merge_state is merge_state
    real = types.ModuleType("real")
    real.BatchDecodeWithPagedKVCacheWrapper = object
    assert not torchfi.install(real)
    assert real.BatchDecodeWithPagedKVCacheWrapper is object and not hasattr(real, "fast_decode_plan")


def test_a_window_given_only_at_run_time_is_not_applied(cache):
    """FlashInfer compiles the sliding-window mask into the variant plan() selects: a wrapper
    planned without a window ignores one handed to forward, as the GPU kernel does."""
    gen = torch.Generator().manual_seed(3)
    n, window = 12, 4
    q, k, v = (torch.randn(n, h, D, generator=gen) for h in (H, HKV, HKV))
    qo = torch.tensor([0, n], dtype=torch.int32)
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    windowed = causal & (torch.arange(n)[None, :] >= torch.arange(n)[:, None] - window)
    for planned, want in ((-1, causal), (window, windowed)):
        w = BatchPrefillWithRaggedKVCacheWrapper(_workspace(), "NHD")
        w.begin_forward(qo, qo, H, HKV, D, window_left=planned)
        out = w.forward(q, k, v, causal=True, window_left=window)
        torch.testing.assert_close(out.float(), _by_hand(q, k, v, want), atol=1e-4, rtol=1e-4)


def _kernel_multi_item_rule(p: int, k: int, prefix: int, t: int) -> bool:
    """prefill.cuh's logits_mask_multi_item_scoring for query position p and key k, as written
    there: out of boundary past p (causal); a query before its prefix keeps every key; past it, a
    key is kept when ``kv_idx < prefix_len | idx_in_original_seq < kv_idx + token_pos``."""
    if k > p:
        return False
    return p < prefix or k < prefix or p < k + t


def _multi_item_plan(*, q_lens, kv_lens, slots, prefix, positions, stride, longest):
    w = BatchPrefillWithPagedKVCacheWrapper(_workspace(), "NHD", backend="fa2")
    qo = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32)
    w.begin_forward(qo, kv, slots, torch.ones(len(q_lens), dtype=torch.int32), H, HKV, D, 1,
                    prefix_len_ptr=prefix, token_pos_in_items_ptr=positions, token_pos_in_items_len=stride,
                    max_item_len_ptr=longest)  # fmt: skip
    return w, qo, kv


def test_paged_prefill_applies_the_multi_item_mask_at_the_kernel_s_offsets(cache):
    """FlashInfer's own example (items of 3, 2 and 4 tokens after a 3-token query, the positions
    [0,1,2,3,0,1,2,0,1,2,3,4,0]) on a 5-token cached prefix, and a second request of one 2-token
    item, both at a padded stride of 16: every row against the kernel's rule written out by hand;
    the run's causal=False does not matter (the plan's prefix_len_ptr selects the mode)."""
    k_cache, v_cache = cache
    gen = torch.Generator().manual_seed(5)
    first = [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0]
    second = [0, 1, 2, 0]
    stride = 16
    q_lens = [3 + len(first), 2 + len(second)]
    kv_lens = [5 + q_lens[0], q_lens[1]]
    prefix = torch.tensor([5 + 3, 2], dtype=torch.uint32)
    positions = torch.zeros(2 * stride, dtype=torch.uint16)
    positions[: len(first)] = torch.tensor(first, dtype=torch.uint16)
    positions[stride : stride + len(second)] = torch.tensor(second, dtype=torch.uint16)
    longest = torch.tensor([4, 2], dtype=torch.uint16)
    slots = torch.randperm(SLOTS, generator=gen)[: sum(kv_lens)].to(torch.int32)
    q = torch.randn(sum(q_lens), H, D, generator=gen)
    w, qo, kv = _multi_item_plan(
        q_lens=q_lens, kv_lens=kv_lens, slots=slots, prefix=prefix, positions=positions, stride=stride, longest=longest
    )
    out = w.forward(q, (k_cache, v_cache), causal=False)
    cut = [int(x) for x in prefix.to(torch.int64)]
    for r, items in enumerate((first, second)):
        rows, keys = slice(int(qo[r]), int(qo[r + 1])), slots[int(kv[r]) : int(kv[r + 1])].long()
        start = kv_lens[r] - q_lens[r]
        visible = torch.tensor(
            [
                [
                    _kernel_multi_item_rule(p, key, cut[r], items[p - cut[r]] if p >= cut[r] else 0)
                    for key in range(kv_lens[r])
                ]
                for p in range(start, kv_lens[r])
            ]
        )
        if r == 0:
            # The second item's second token (position 14) sees the prefix and query (keys 0-7)
            # and its item's tokens 13 and 14, not the delimiter at 12 or any other item.
            assert visible[14 - start].tolist() == [True] * 8 + [False] * 5 + [True] * 2 + [False] * 6
        want = _by_hand(q[rows], k_cache[keys], v_cache[keys], visible)
        torch.testing.assert_close(out[rows].float(), want, atol=1e-4, rtol=1e-4)


def test_the_multi_item_arrays_are_read_with_the_kernel_s_widths_and_bounds(cache):
    """The kernel casts the arrays' pointers: positions handed as int32 are read as their uint16
    halves (what the GPU reads), and a position array one request short is read past its end
    (the code's fault: OutOfBounds, a CRASH)."""
    k_cache, v_cache = cache
    gen = torch.Generator().manual_seed(6)
    items = [0, 1, 2, 0, 1, 0]
    q_lens, kv_lens = [2 + len(items)] * 2, [2 + len(items)] * 2
    slots = torch.randperm(SLOTS, generator=gen)[: sum(kv_lens)].to(torch.int32)
    q = torch.randn(sum(q_lens), H, D, generator=gen)
    plan = dict(q_lens=q_lens, kv_lens=kv_lens, slots=slots, stride=len(items))
    prefix, longest = torch.tensor([2, 2], dtype=torch.uint32), torch.tensor([2, 1], dtype=torch.uint16)
    right = torch.tensor(items * 2, dtype=torch.uint16)
    w, _, _ = _multi_item_plan(prefix=prefix, positions=right, longest=longest, **plan)
    want = w.forward(q, (k_cache, v_cache), causal=True)
    # As int32 the first request's six positions are read from 12 bytes: 0, 0, 1, 0, 2, 0.
    w, _, _ = _multi_item_plan(prefix=prefix, positions=right.to(torch.int32), longest=longest, **plan)
    got = w.forward(q, (k_cache, v_cache), causal=True)
    assert not torch.allclose(got.float(), want.float(), atol=1e-3)
    w, _, _ = _multi_item_plan(prefix=prefix, positions=right[: len(items)].clone(), longest=longest, **plan)
    with pytest.raises(OutOfBounds, match="token_pos_in_items_ptr read past the end of its allocation"):
        w.forward(q, (k_cache, v_cache), causal=True)
    w, _, _ = _multi_item_plan(prefix=prefix[:1].clone(), positions=right, longest=longest, **plan)
    with pytest.raises(OutOfBounds, match="prefix_len_ptr read past the end of its allocation: entry 1"):
        w.forward(q, (k_cache, v_cache), causal=True)


# ------------------------------------------------------------------ MLA (absorbed, paged latent cache)

CKV, KPE, MLA_H, PAGE = 8, 4, 3, 4


def _mla_by_hand(q_nope, q_pe, ckv, kpe, slots, *, causal: bool, scale: float) -> torch.Tensor:
    """One request's query rows against the latent rows ``slots`` (value = the latent row)."""
    kc, kp = ckv[slots].float(), kpe[slots].float()
    scores = (torch.einsum("qhd,kd->hqk", q_nope.float(), kc) + torch.einsum("qhd,kd->hqk", q_pe.float(), kp)) * scale
    if causal:
        q_len, k_len = q_nope.shape[0], len(slots)
        pos = torch.arange(q_len) + (k_len - q_len)
        scores = scores.masked_fill(~(torch.arange(k_len)[None, :] <= pos[:, None])[None], float("-inf"))
    return torch.einsum("hqk,kd->qhd", torch.softmax(scores, -1), kc)


def test_mla_reads_each_request_s_pages_for_its_planned_length_causally():
    gen = torch.Generator().manual_seed(3)
    num_pages = 12
    ckv_cache = torch.randn(num_pages, PAGE, CKV, generator=gen)
    kpe_cache = torch.randn(num_pages, PAGE, KPE, generator=gen)
    kv_lens = [6, 9]  # 2 and 3 pages of 4 (query rows: 2 and 3); the last page partly used
    pages = torch.randperm(num_pages, generator=gen)[:5].to(torch.int32)
    qo = torch.tensor([0, 2, 5], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    q_nope = torch.randn(5, MLA_H, CKV, generator=gen)
    q_pe = torch.randn(5, MLA_H, KPE, generator=gen)
    w = torchfi.BatchMLAPagedAttentionWrapper(_workspace())
    w.plan(qo, kv_indptr, pages, torch.tensor(kv_lens, dtype=torch.int32), MLA_H, CKV, KPE, PAGE, True, 0.3,
           torch.float32, torch.float32)  # fmt: skip
    out, lse = w.run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse=True)
    flat_c, flat_p = ckv_cache.reshape(-1, CKV), kpe_cache.reshape(-1, KPE)
    for r in range(2):
        req_pages = pages[int(kv_indptr[r]) : int(kv_indptr[r + 1])].long()
        slots = (req_pages[:, None] * PAGE + torch.arange(PAGE)[None, :]).reshape(-1)[: kv_lens[r]]
        rows = slice(int(qo[r]), int(qo[r + 1]))
        want = _mla_by_hand(q_nope[rows], q_pe[rows], flat_c, flat_p, slots, causal=True, scale=0.3)
        assert torch.allclose(out[rows], want, atol=1e-5), r
    assert torch.isfinite(lse).all() and lse.shape == (5, MLA_H)


def test_mla_fast_plan_schedules_from_host_arrays_and_reads_the_graph_buffer_at_run_time():
    """sglang's sync-free re-plan hands ``_cached_module.plan`` host arrays only; the kernel then
    reads the graph's kv_indices buffer as it is when it runs, not as it was at plan time."""
    gen = torch.Generator().manual_seed(4)
    ckv_cache = torch.randn(8, PAGE, CKV, generator=gen)
    kpe_cache = torch.randn(8, PAGE, KPE, generator=gen)
    bufs = dict(
        qo_indptr=torch.zeros(2, dtype=torch.int32),
        kv_indptr=torch.zeros(2, dtype=torch.int32),
        kv_indices=torch.zeros(4, dtype=torch.int32),
        kv_len_arr=torch.zeros(1, dtype=torch.int32),
    )
    w = torchfi.BatchMLAPagedAttentionWrapper(_workspace(), use_cuda_graph=True, **bufs)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.zeros(1, MLA_H, CKV), torch.zeros(1, MLA_H, KPE), ckv_cache, kpe_cache)
    w.plan(torch.tensor([0, 1]), torch.tensor([0, 2]), torch.tensor([5, 6]), torch.tensor([7]), MLA_H, CKV, KPE,
           PAGE, False, 1.0, torch.float32, torch.float32)  # fmt: skip
    bufs["kv_indices"][:2] = torch.tensor([1, 2], dtype=torch.int32)  # rewritten after the plan
    q_nope, q_pe = torch.randn(1, MLA_H, CKV, generator=gen), torch.randn(1, MLA_H, KPE, generator=gen)
    out = w.run(q_nope, q_pe, ckv_cache, kpe_cache)
    slots = torch.tensor([4, 5, 6, 7, 8, 9, 10])  # pages 1 and 2, 7 tokens
    want = _mla_by_hand(
        q_nope, q_pe, ckv_cache.reshape(-1, CKV), kpe_cache.reshape(-1, KPE), slots, causal=False, scale=1.0
    )
    assert torch.allclose(out, want, atol=1e-5)
    with pytest.raises(ValueError, match="host memory"):
        w._cached_module.plan(None, None, None, torch.tensor([0, 1]).to("meta"), torch.tensor([0, 2]), torch.tensor([7]),
                              MLA_H, CKV, False)  # fmt: skip


def test_mla_refuses_what_it_does_not_model_and_rows_the_plan_did_not_count():
    w = torchfi.BatchMLAPagedAttentionWrapper(_workspace())
    with pytest.raises(NotImplementedError, match="MLAPlanMetadata"):
        w.plan(metadata=object())
    with pytest.raises(TypeError, match="missing required arguments: sm_scale"):
        w.plan(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1]), MLA_H, CKV, KPE,
               PAGE, True)  # fmt: skip
    w.plan(torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1]), MLA_H, CKV, KPE, PAGE,
           True, 1.0, torch.float32, torch.float32)  # fmt: skip
    cache = torch.zeros(2, PAGE, CKV), torch.zeros(2, PAGE, KPE)
    with pytest.raises(ValueError, match="the plan counted 1"):
        w.run(torch.zeros(2, MLA_H, CKV), torch.zeros(2, MLA_H, KPE), *cache)


def test_install_mla_binds_only_where_flashinfer_is_missing():
    bare = types.ModuleType("bare")
    assert torchfi.install_mla(bare) and bare.BatchMLAPagedAttentionWrapper is torchfi.BatchMLAPagedAttentionWrapper
    real = types.ModuleType("real")
    real.BatchMLAPagedAttentionWrapper = object
    assert not torchfi.install_mla(real) and real.BatchMLAPagedAttentionWrapper is object
