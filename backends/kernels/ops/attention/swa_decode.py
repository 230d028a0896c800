"""DeepSeek-V4's sliding-window (SWA) decode path as two Triton kernels that consume exactly what
the backend's metadata holds:

- ``store_kv_at_locs``: the KV write. Token ``t``'s new latent K (``kv_lora_rank`` values then
  the RoPE values) goes to pool slot ``loc[t]``: for DSv4 the location baked into the metadata
  when it was built (``raw_out_loc``), not read from the batch at forward time.
- ``swa_decode_attention_fwd``: absorbed-MLA decode over a sparse window, FlashMLA's sparse
  interface (``indices`` / ``topk_length``): query row ``t`` attends the pool slots
  ``indices[t, :lengths[t]]`` (entries ``< 0`` are skipped, as FlashMLA skips ``-1``). Scores
  over all ``kv_lora_rank + qk_rope_head_dim`` dims, values the first ``kv_lora_rank``.

The pool is ``[num_slots, 1, D]`` with token-granular slots (``page * page_size + offset``), so a
window index addresses a paged cache directly. Both kernels compile on CUDA and run under the
Triton interpreter on CPU; one constexpr combination per model shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import DOT_FP32

# Heads per program: tl.dot needs >= 16 rows; the scenarios use 16 to 128 heads.
_BLOCK_H = 16
# Window entries per inner step (a window is 128 entries: 4 steps).
_BLOCK_N = 32


@triton.jit
def _store_kv_kernel(
    K,
    Loc,
    Cache,
    stride_kt,
    stride_ct,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    loc = tl.load(Loc + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    k = tl.load(K + t * stride_kt + offs_d, mask=mask_d, other=0.0)
    tl.store(Cache + loc * stride_ct + offs_d, k.to(Cache.dtype.element_ty), mask=mask_d)


def store_kv_at_locs(k: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor) -> None:
    """cache[loc[t], 0, :] = k[t] for every new token t; k is [T, D] or [T, 1, D]."""
    num_tokens = loc.shape[0]
    dim = cache.shape[-1]
    k = k.reshape(-1, dim)
    if k.shape[0] != num_tokens:
        raise ValueError(f"{k.shape[0]} new tokens for {num_tokens} write locations")
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or cache.stride(-1) != 1 or loc.dim() != 1:
        raise ValueError("store_kv_at_locs needs unit-stride rows and a 1-D loc")
    loc = loc if loc.is_contiguous() else loc.contiguous()
    _store_kv_kernel[(num_tokens,)](
        k,
        loc,
        cache,
        k.stride(0),
        cache.stride(0),
        D=dim,
        BLOCK_D=triton.next_power_of_2(dim),
    )


@triton.jit
def _swa_decode_kernel(
    Q,
    Cache,
    Indices,
    Lengths,
    Out,
    sm_scale,
    num_heads,
    width,
    stride_qt,
    stride_qh,
    stride_ct,
    stride_it,
    stride_ot,
    stride_oh,
    DV: tl.constexpr,
    DPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_dv = tl.arange(0, DV)
    offs_dpe = tl.arange(0, DPE)

    q_base = Q + t * stride_qt + offs_h[:, None] * stride_qh
    q_nope = tl.load(q_base + offs_dv[None, :], mask=mask_h[:, None], other=0.0)
    q_pe = tl.load(q_base + DV + offs_dpe[None, :], mask=mask_h[:, None], other=0.0)
    if DOT_FP32:
        q_nope = q_nope.to(tl.float32)
        q_pe = q_pe.to(tl.float32)

    # A length past the indices row would read another row's indices: clamp to the row.
    length = tl.minimum(tl.load(Lengths + t), width)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)
    for start_n in range(0, length, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_row = offs_n < length
        idx = tl.load(Indices + t * stride_it + offs_n, mask=in_row, other=-1)
        valid = in_row & (idx >= 0)
        slot = tl.where(valid, idx, 0).to(tl.int64)
        k_base = Cache + slot[:, None] * stride_ct
        k_nope = tl.load(k_base + offs_dv[None, :], mask=valid[:, None], other=0.0)
        k_pe = tl.load(k_base + DV + offs_dpe[None, :], mask=valid[:, None], other=0.0)
        if DOT_FP32:
            k_nope = k_nope.to(tl.float32)
            k_pe = k_pe.to(tl.float32)

        qk = tl.dot(q_nope, tl.trans(k_nope)) + tl.dot(q_pe, tl.trans(k_pe))
        qk = tl.where(valid[None, :], qk * sm_scale, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A step with no valid entry keeps m at -inf: shift by 0 instead (exp(-inf) = 0, no NaN).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope)
        m_i = m_new

    # A row that sees nothing (no valid entry) gives zeros.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptr = Out + t * stride_ot + offs_h[:, None] * stride_oh + offs_dv[None, :]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=mask_h[:, None])


def swa_decode_attention_fwd(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    *,
    v_head_dim: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D], kv_cache [num_slots, 1, D], indices [T, W] (slots, -1 = none), lengths [T]
    -> out [T, H, v_head_dim] in q's dtype. D = v_head_dim + rope dim, both powers of two."""
    num_tokens, num_heads, dim = q.shape
    dpe = dim - v_head_dim
    if kv_cache.shape[-1] != dim:
        raise ValueError(f"kv_cache head dim {kv_cache.shape[-1]} != query head dim {dim}")
    for d in (v_head_dim, dpe):
        if d < 16 or d & (d - 1):
            raise ValueError(f"latent {v_head_dim} / rope {dpe} dims must be powers of two >= 16")
    if indices.dim() != 2 or indices.shape[0] < num_tokens or lengths.shape[0] < num_tokens:
        raise ValueError(f"indices {tuple(indices.shape)} / lengths {tuple(lengths.shape)} for {num_tokens} queries")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1 or indices.stride(-1) != 1:
        raise ValueError("swa_decode_attention_fwd needs unit-stride last dims")
    if out is None:
        out = q.new_empty((num_tokens, num_heads, v_head_dim))
    if num_tokens == 0:
        return out
    grid = (num_tokens, triton.cdiv(num_heads, _BLOCK_H))
    _swa_decode_kernel[grid](
        q,
        kv_cache,
        indices,
        lengths,
        out,
        sm_scale,
        num_heads,
        indices.shape[1],
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        indices.stride(0),
        out.stride(0),
        out.stride(1),
        DV=v_head_dim,
        DPE=dpe,
        BLOCK_H=_BLOCK_H,
        BLOCK_N=_BLOCK_N,
        DOT_FP32=DOT_FP32,
        num_warps=4,
        num_stages=1,
    )
    return out
