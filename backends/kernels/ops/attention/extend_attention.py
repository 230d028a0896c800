"""Extend (prefill) attention: each request's queries attend to its cached prefix,
read from the paged pool through ``kv_indptr``/``kv_indices``, and to its new
tokens, passed as dense ``k_extend``/``v_extend`` in ``qo_indptr`` order.

The prefix part is never causal (every new token comes after the whole prefix);
the new-token part is causal, or follows ``custom_mask`` (speculative verify
trees). That split is why a page table that also covers the new tokens is wrong:
they would be attended twice, once without the causal mask.

Custom mask layout (as upstream): request ``b`` owns
``custom_mask[mask_indptr[b] : mask_indptr[b] + extend_len * (prefix_len + extend_len)]``,
row-major [query, kv position], prefix columns first.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import DOT_FP32, block_sizes


@triton.jit
def _fwd_kernel_extend(
    Q_Extend,
    K_Extend,
    V_Extend,
    O_Extend,
    K_Buffer,
    V_Buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    mask_ptr,
    mask_indptr,
    sm_scale,
    kv_group_num,
    stride_qbs,
    stride_qh,
    stride_kbs,
    stride_kh,
    stride_vbs,
    stride_vh,
    stride_obs,
    stride_oh,
    stride_buf_kbs,
    stride_buf_kh,
    stride_buf_vbs,
    stride_buf_vh,
    Lq: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_CUSTOM_MASK: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    cur_seq = tl.program_id(0)
    cur_head = tl.program_id(1)
    cur_block_m = tl.program_id(2)
    cur_kv_head = cur_head // kv_group_num

    cur_seq_extend_start_idx = tl.load(qo_indptr + cur_seq)
    cur_seq_len_extend = tl.load(qo_indptr + cur_seq + 1) - cur_seq_extend_start_idx
    cur_seq_kv_start_idx = tl.load(kv_indptr + cur_seq)
    cur_seq_len_prefix = tl.load(kv_indptr + cur_seq + 1) - cur_seq_kv_start_idx
    cur_seq_len = cur_seq_len_prefix + cur_seq_len_extend
    if USE_CUSTOM_MASK:
        cur_seq_mask_start_idx = tl.load(mask_indptr + cur_seq).to(tl.int64)

    offs_d = tl.arange(0, BLOCK_D)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_d = offs_d < Lq
    q_pos = cur_block_m * BLOCK_M + offs_m
    mask_m = q_pos < cur_seq_len_extend

    offs_q = (
        (cur_seq_extend_start_idx + q_pos[:, None]).to(tl.int64) * stride_qbs
        + cur_head * stride_qh
        + offs_d[None, :]
    )
    q = tl.load(Q_Extend + offs_q, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    e_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    deno = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Stage 1: the cached prefix, through the page table (no causal mask).
    for start_n in range(0, cur_seq_len_prefix, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        mask_n = (start_n + offs_n) < cur_seq_len_prefix
        offs_kv_loc = tl.load(
            kv_indices + cur_seq_kv_start_idx + start_n + offs_n, mask=mask_n, other=0
        ).to(tl.int64)

        offs_buf_k = (
            offs_kv_loc[None, :] * stride_buf_kbs
            + cur_kv_head * stride_buf_kh
            + offs_d[:, None]
        )
        k = tl.load(K_Buffer + offs_buf_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        qk = tl.dot(q, k) * sm_scale

        final_mask = mask_m[:, None] & mask_n[None, :]
        if USE_CUSTOM_MASK:
            custom_mask = tl.load(
                mask_ptr
                + cur_seq_mask_start_idx
                + q_pos[:, None].to(tl.int64) * cur_seq_len
                + start_n
                + offs_n[None, :],
                mask=final_mask,
                other=0,
            )
            final_mask &= custom_mask != 0
        qk = tl.where(final_mask, qk, float("-inf"))

        # A fully masked row keeps a finite running max so exp() never sees -inf - -inf.
        row_max = tl.max(qk, 1)
        row_max = tl.where(row_max == float("-inf"), -1e20, row_max)
        n_e_max = tl.maximum(row_max, e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)

        offs_buf_v = (
            offs_kv_loc[:, None] * stride_buf_vbs
            + cur_kv_head * stride_buf_vh
            + offs_d[None, :]
        )
        v = tl.load(V_Buffer + offs_buf_v, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
        p = p.to(v.dtype)
        acc = acc * re_scale[:, None] + tl.dot(p, v)
        e_max = n_e_max

    # Stage 2: the new tokens, dense; causal unless a custom mask decides.
    if USE_CUSTOM_MASK:
        cur_block_m_end = cur_seq_len_extend
    elif IS_CAUSAL:
        cur_block_m_end = tl.minimum(cur_seq_len_extend, (cur_block_m + 1) * BLOCK_M)
    else:
        cur_block_m_end = cur_seq_len_extend

    for start_n in range(0, cur_block_m_end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kv_pos = start_n + offs_n
        mask_n = kv_pos < cur_block_m_end

        offs_k = (
            (cur_seq_extend_start_idx + kv_pos[None, :]).to(tl.int64) * stride_kbs
            + cur_kv_head * stride_kh
            + offs_d[:, None]
        )
        k = tl.load(K_Extend + offs_k, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        qk = tl.dot(q, k) * sm_scale

        final_mask = mask_m[:, None] & mask_n[None, :]
        if USE_CUSTOM_MASK:
            custom_mask = tl.load(
                mask_ptr
                + cur_seq_mask_start_idx
                + q_pos[:, None].to(tl.int64) * cur_seq_len
                + cur_seq_len_prefix
                + kv_pos[None, :],
                mask=final_mask,
                other=0,
            )
            final_mask &= custom_mask != 0
        elif IS_CAUSAL:
            final_mask &= q_pos[:, None] >= kv_pos[None, :]
        qk = tl.where(final_mask, qk, float("-inf"))

        row_max = tl.max(qk, 1)
        row_max = tl.where(row_max == float("-inf"), -1e20, row_max)
        n_e_max = tl.maximum(row_max, e_max)
        re_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk - n_e_max[:, None])
        deno = deno * re_scale + tl.sum(p, 1)

        offs_v = (
            (cur_seq_extend_start_idx + kv_pos[:, None]).to(tl.int64) * stride_vbs
            + cur_kv_head * stride_vh
            + offs_d[None, :]
        )
        v = tl.load(V_Extend + offs_v, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        if DOT_FP32:
            v = v.to(tl.float32)
        p = p.to(v.dtype)
        acc = acc * re_scale[:, None] + tl.dot(p, v)
        e_max = n_e_max

    # A query that sees nothing (only possible with a broken mask) outputs 0, not NaN.
    deno = tl.where(deno > 0, deno, 1.0)
    offs_o = (
        (cur_seq_extend_start_idx + q_pos[:, None]).to(tl.int64) * stride_obs
        + cur_head * stride_oh
        + offs_d[None, :]
    )
    tl.store(
        O_Extend + offs_o,
        (acc / deno[:, None]).to(O_Extend.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def extend_attention_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: Optional[torch.Tensor],
    is_causal: bool,
    mask_indptr: Optional[torch.Tensor],
    max_len_extend: int,
    sm_scale: Optional[float] = None,
) -> None:
    """Write into ``o_extend`` [num_tokens, num_heads, head_dim] the attention of
    the new tokens. Shapes: q [T, H, D]; k/v_extend [T, Hkv, D]; k/v_buffer
    [num_slots, Hkv, D]; ``max_len_extend`` sizes the grid (a Python int, so a
    CUDA graph bakes it)."""
    num_heads = q_extend.shape[1]
    head_dim = q_extend.shape[-1]
    kv_group_num = num_heads // k_extend.shape[1]
    if sm_scale is None:
        sm_scale = 1.0 / (head_dim**0.5)
    BLOCK_D, BLOCK_M, BLOCK_N = block_sizes(head_dim)
    batch_size = qo_indptr.shape[0] - 1
    if batch_size <= 0 or max_len_extend <= 0:
        return

    use_custom_mask = custom_mask is not None
    grid = (batch_size, num_heads, triton.cdiv(max_len_extend, BLOCK_M))
    _fwd_kernel_extend[grid](
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        mask_indptr,
        sm_scale,
        kv_group_num,
        q_extend.stride(0),
        q_extend.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o_extend.stride(0),
        o_extend.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        Lq=head_dim,
        BLOCK_D=BLOCK_D,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        USE_CUSTOM_MASK=use_custom_mask,
        IS_CAUSAL=is_causal,
        DOT_FP32=DOT_FP32,
        num_warps=4,
        num_stages=1,
    )
