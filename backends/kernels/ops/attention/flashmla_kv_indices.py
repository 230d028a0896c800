"""Block-table construction for the paged MLA kernels (FlashMLA, trtllm-gen MLA): per request,
the page id of each of its ``ceil(seq_len / page_size)`` pages, written into one row of a dense
``[bs, max_blocks]`` int32 table (upstream ``create_flashmla_kv_indices_triton``).

Entries past a row's last page are left as they are (callers fill the table with -1 first).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Tokens one loop iteration of the kernel covers; also the "Triton" constraint on the table
# width (a multiple of this many pages) that the trtllm backend pads to.
_FLASHMLA_CREATE_KV_BLOCK_SIZE = 4096
FLASHMLA_CREATE_KV_BLOCK_SIZE_TRITON = tl.constexpr(_FLASHMLA_CREATE_KV_BLOCK_SIZE)


def get_num_page_per_block_flashmla(page_size: int = 64) -> int:
    return _FLASHMLA_CREATE_KV_BLOCK_SIZE // page_size


@triton.jit
def create_flashmla_kv_indices_triton(
    req_to_token_ptr,  # [max_batch, max_context_len] int32 slots
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_start_idx,
    kv_indices_ptr,  # [bs, kv_indices_ptr_stride] int32 page ids
    req_to_token_ptr_stride: tl.constexpr,
    kv_indices_ptr_stride: tl.constexpr,
    PAGED_SIZE: tl.constexpr = 64,
):
    """One program per request (grid ``(bs,)``). A page's id is the slot of its first token
    divided by the page size: slots are ``page * PAGED_SIZE + offset``."""
    NUM_PAGE_PER_BLOCK: tl.constexpr = FLASHMLA_CREATE_KV_BLOCK_SIZE_TRITON // PAGED_SIZE
    pid = tl.program_id(axis=0)

    req_pool_index = tl.load(req_pool_indices_ptr + pid)

    kv_start = 0
    kv_end = 0
    if kv_start_idx:
        kv_start = tl.load(kv_start_idx + pid).to(tl.int32)
        kv_end = kv_start
    kv_end += tl.load(page_kernel_lens_ptr + pid).to(tl.int32)

    num_paged = tl.cdiv(kv_end - kv_start, PAGED_SIZE)
    num_pages_loop = tl.cdiv(kv_end - kv_start, FLASHMLA_CREATE_KV_BLOCK_SIZE_TRITON)

    for i in range(num_pages_loop):
        # Index into req_to_token in int64: rows * stride overflows int32 on big pools.
        paged_offset = (
            tl.arange(0, NUM_PAGE_PER_BLOCK).to(tl.int64) + i * NUM_PAGE_PER_BLOCK
        ) * PAGED_SIZE
        paged_offset_out = tl.arange(0, NUM_PAGE_PER_BLOCK) + i * NUM_PAGE_PER_BLOCK

        mask = paged_offset < num_paged * PAGED_SIZE
        mask_out = paged_offset_out < num_paged

        data = tl.load(
            req_to_token_ptr
            + req_pool_index * req_to_token_ptr_stride
            + kv_start
            + paged_offset,
            mask=mask,
        )
        tl.store(
            kv_indices_ptr + pid * kv_indices_ptr_stride + paged_offset_out,
            data // PAGED_SIZE,
            mask=mask_out,
        )
