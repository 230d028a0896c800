"""Split-KV decode attention: one query token per request attends to its whole
sequence, read from the paged pool through ``kv_indptr``/``kv_indices``.

Stage 1 splits each request's KV range into ``num_kv_splits[b]`` chunks (at most
``max_kv_splits``) and writes per-chunk normalised partial outputs and their
log-sum-exp into ``attn_logits``/``attn_lse``; stage 2 merges the chunks. Both
scratch buffers are static under CUDA graphs, which is why they live in the
backend's metadata.
"""

import torch
import triton
import triton.language as tl

from .common import block_sizes


@triton.jit
def _fwd_kernel_stage1(
    Q,
    K_Buffer,
    V_Buffer,
    sm_scale,
    kv_indptr,
    kv_indices,
    Att_Out,
    Att_Lse,
    num_kv_splits,
    stride_qbs,
    stride_qh,
    stride_buf_kbs,
    stride_buf_kh,
    stride_buf_vbs,
    stride_buf_vh,
    stride_mid_ob,
    stride_mid_oh,
    stride_mid_os,
    kv_group_num,
    Lk: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)
    split_kv_id = tl.program_id(2)
    cur_kv_head = cur_head // kv_group_num

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < Lk

    cur_batch_kv_start_idx = tl.load(kv_indptr + cur_batch)
    cur_batch_seq_len = tl.load(kv_indptr + cur_batch + 1) - cur_batch_kv_start_idx
    kv_splits = tl.load(num_kv_splits + cur_batch)

    kv_len_per_split = tl.cdiv(cur_batch_seq_len, kv_splits)
    split_kv_start = kv_len_per_split * split_kv_id
    split_kv_end = tl.minimum(split_kv_start + kv_len_per_split, cur_batch_seq_len)

    if split_kv_end > split_kv_start:
        q = tl.load(
            Q + cur_batch * stride_qbs + cur_head * stride_qh + offs_d, mask=mask_d, other=0.0
        ).to(tl.float32)
        e_max = float("-inf")
        e_sum = 0.0
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for start_n in range(split_kv_start, split_kv_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            mask_n = offs_n < split_kv_end
            kv_loc = tl.load(
                kv_indices + cur_batch_kv_start_idx + offs_n, mask=mask_n, other=0
            ).to(tl.int64)
            offs_buf_k = (
                kv_loc[:, None] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[None, :]
            )
            k = tl.load(
                K_Buffer + offs_buf_k, mask=mask_n[:, None] & mask_d[None, :], other=0.0
            ).to(tl.float32)
            qk = tl.sum(q[None, :] * k, 1) * sm_scale
            qk = tl.where(mask_n, qk, float("-inf"))

            offs_buf_v = (
                kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_d[None, :]
            )
            v = tl.load(
                V_Buffer + offs_buf_v, mask=mask_n[:, None] & mask_d[None, :], other=0.0
            ).to(tl.float32)

            n_e_max = tl.maximum(tl.max(qk, 0), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max)
            acc = acc * re_scale + tl.sum(p[:, None] * v, 0)
            e_sum = e_sum * re_scale + tl.sum(p, 0)
            e_max = n_e_max

        offs_mid_o = cur_batch * stride_mid_ob + cur_head * stride_mid_oh + split_kv_id * stride_mid_os
        tl.store(Att_Out + offs_mid_o + offs_d, acc / e_sum, mask=mask_d)
        offs_mid_lse = (cur_batch * stride_mid_ob + cur_head * stride_mid_oh) // Lk + split_kv_id
        tl.store(Att_Lse + offs_mid_lse, e_max + tl.log(e_sum))


@triton.jit
def _fwd_kernel_stage2(
    Mid_O,
    Mid_Lse,
    O,
    kv_indptr,
    num_kv_splits,
    stride_mid_ob,
    stride_mid_oh,
    stride_mid_os,
    stride_obs,
    stride_oh,
    MAX_KV_SPLITS: tl.constexpr,
    Lv: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)

    cur_batch_seq_len = tl.load(kv_indptr + cur_batch + 1) - tl.load(kv_indptr + cur_batch)
    kv_splits = tl.load(num_kv_splits + cur_batch)

    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < Lv

    e_sum = 0.0
    e_max = float("-inf")
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)

    offs_v = cur_batch * stride_mid_ob + cur_head * stride_mid_oh + offs_d
    offs_logic = (cur_batch * stride_mid_ob + cur_head * stride_mid_oh) // Lv
    kv_len_per_split = tl.cdiv(cur_batch_seq_len, kv_splits)

    for split_kv_id in range(0, MAX_KV_SPLITS):
        split_kv_start = kv_len_per_split * split_kv_id
        split_kv_end = tl.minimum(split_kv_start + kv_len_per_split, cur_batch_seq_len)
        if split_kv_end > split_kv_start:
            tv = tl.load(Mid_O + offs_v + split_kv_id * stride_mid_os, mask=mask_d, other=0.0)
            tlogic = tl.load(Mid_Lse + offs_logic + split_kv_id)
            n_e_max = tl.maximum(tlogic, e_max)
            old_scale = tl.exp(e_max - n_e_max)
            acc *= old_scale
            exp_logic = tl.exp(tlogic - n_e_max)
            acc += exp_logic * tv
            e_sum = e_sum * old_scale + exp_logic
            e_max = n_e_max

    # An empty sequence (broken metadata) outputs 0 rather than NaN.
    e_sum = tl.where(e_sum > 0, e_sum, 1.0)
    tl.store(
        O + cur_batch * stride_obs + cur_head * stride_oh + offs_d,
        (acc / e_sum).to(O.dtype.element_ty),
        mask=mask_d,
    )


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    max_kv_splits: int,
    sm_scale: float,
) -> None:
    """Write into ``o`` [bs, H, D] the decode attention of ``q`` [bs, H, D].

    ``attn_logits`` is fp32 [>=bs, H, max_kv_splits, D] and ``attn_lse`` fp32
    [>=bs, H, max_kv_splits]; both must be contiguous.
    """
    batch, num_heads = q.shape[0], q.shape[1]
    head_dim = q.shape[-1]
    if batch == 0:
        return
    kv_group_num = num_heads // k_buffer.shape[1]
    BLOCK_D, _, BLOCK_N = block_sizes(head_dim)
    # The lse offset is derived from the logits strides (one lse per D-row).
    assert attn_logits.is_contiguous() and attn_lse.is_contiguous()
    assert attn_logits.shape[-1] == head_dim and attn_logits.shape[2] == max_kv_splits

    _fwd_kernel_stage1[(batch, num_heads, max_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        sm_scale,
        kv_indptr,
        kv_indices,
        attn_logits,
        attn_lse,
        num_kv_splits,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        attn_logits.stride(0),
        attn_logits.stride(1),
        attn_logits.stride(2),
        kv_group_num,
        Lk=head_dim,
        BLOCK_D=BLOCK_D,
        BLOCK_N=BLOCK_N,
        num_warps=4,
        num_stages=1,
    )
    _fwd_kernel_stage2[(batch, num_heads)](
        attn_logits,
        attn_lse,
        o,
        kv_indptr,
        num_kv_splits,
        attn_logits.stride(0),
        attn_logits.stride(1),
        attn_logits.stride(2),
        o.stride(0),
        o.stride(1),
        MAX_KV_SPLITS=max_kv_splits,
        Lv=head_dim,
        BLOCK_D=BLOCK_D,
        num_warps=4,
        num_stages=1,
    )
