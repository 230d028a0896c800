"""The multi-step EAGLE draft's page tables and write slots (upstream ``spec_utils``).

``generate_draft_decode_kv_indices`` fills one kv_indices row per draft step: row ``iters - 1``
lists, for every request and every one of its ``topk`` branches, the request's prefix slots
followed by the branch's first ``iters`` draft slots. Its stores are bounded by these lengths
only, never by the row width, so an undersized row spills into the next step's row (and the
last row past the end of the buffer): the bug of PRs 27338 / 27460.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def generate_draft_decode_kv_indices(
    req_pool_indices,
    req_to_token,
    paged_kernel_lens,
    kv_indices,
    kv_indptr,
    positions,
    pool_len: tl.constexpr,
    kv_indices_stride: tl.constexpr,
    kv_indptr_stride: tl.constexpr,
    bs_upper: tl.constexpr,
    iter_upper: tl.constexpr,
    num_tokens_upper: tl.constexpr,
    page_size: tl.constexpr,
):
    """Grid ``(num_steps, num_seqs, topk)``: program (step, request ``bid``, branch ``topk_id``)
    writes ``seq_len + iters`` slots at ``cum_seq_len * topk + bid * iters * topk +
    topk_id * (seq_len + iters)`` of row ``step`` (``iters = step + 1``) and one kv_indptr entry
    computed from ``positions``. Draft slots come from ``req_to_token[req, seq_len + topk_id *
    num_steps + s]`` (page_size 1, or topk 1)."""
    BLOCK_SIZE: tl.constexpr = 128
    iters = tl.program_id(axis=0)
    bid = tl.program_id(axis=1)
    topk_id = tl.program_id(axis=2)

    num_steps = tl.num_programs(axis=0)
    num_seqs = tl.num_programs(axis=1)
    topk = tl.num_programs(axis=2)

    kv_indices += kv_indices_stride * iters
    kv_indptr += kv_indptr_stride * iters
    iters += 1

    load_offset = tl.arange(0, bs_upper)
    seq_lens = tl.load(paged_kernel_lens + load_offset, mask=load_offset < bid, other=0)
    seq_len = tl.load(paged_kernel_lens + bid)
    cum_seq_len = tl.sum(seq_lens)

    # Where this branch's sequence starts in the row: no bound against the row width.
    kv_offset = cum_seq_len * topk + bid * iters * topk + topk_id * (seq_len + iters)
    kv_ptr = kv_indices + kv_offset
    token_pool_ptr = req_to_token + tl.load(req_pool_indices + bid) * pool_len

    kv_offset = tl.arange(0, BLOCK_SIZE)
    num_loop = tl.cdiv(seq_len, BLOCK_SIZE)
    for _ in range(num_loop):
        mask = kv_offset < seq_len
        data = tl.load(token_pool_ptr + kv_offset, mask=mask)
        tl.store(kv_ptr + kv_offset, data, mask=mask)
        kv_offset += BLOCK_SIZE

    extend_offset = tl.arange(0, iter_upper)
    if page_size == 1 or topk == 1:
        extend_data = tl.load(
            token_pool_ptr + seq_len + topk_id * num_steps + tl.arange(0, iter_upper),
            mask=extend_offset < iters,
        )
    else:
        # Paged topk > 1: each branch owns whole pages after the shared last prefix page.
        prefix_len = seq_len
        last_page_len = prefix_len % page_size
        num_new_pages_per_topk = (last_page_len + num_steps + page_size - 1) // page_size
        prefix_base = seq_len // page_size * page_size
        start = prefix_base + topk_id * num_new_pages_per_topk * page_size + last_page_len
        extend_data = tl.load(
            token_pool_ptr + start + extend_offset,
            mask=extend_offset < iters,
        )

    tl.store(kv_ptr + seq_len + extend_offset, extend_data, mask=extend_offset < iters)

    # kv_indptr[zid] from positions (the branch's prefix length); program (0, 0) writes the last.
    bs_offset = tl.arange(0, num_tokens_upper)

    zid = bid * topk + topk_id
    if zid == 0:
        zid = num_seqs * topk
    positions = tl.load(positions + bs_offset, mask=bs_offset < zid, other=0)
    base = tl.sum(positions)
    tl.store(kv_indptr + zid, base + zid * iters)
