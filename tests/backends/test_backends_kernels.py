"""The Triton kernels of sglfix.backends against plain torch, on small shapes."""

import math

import pytest
import torch

from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import default_device
from sglfix.backends.kernels.ops.attention import create_flashinfer_kv_indices_triton, decode_attention_fwd, extend_attention_fwd

DEVICE = default_device()
H, HKV, D = 4, 2, 64


def _indptr(lens):
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.tensor(lens), 0)
    return out.to(DEVICE)


def test_create_flashinfer_kv_indices_gathers_rows():
    gen = torch.Generator().manual_seed(0)
    req_to_token = torch.randint(0, 1000, (6, 64), generator=gen, dtype=torch.int32).to(DEVICE)
    req_pool_indices = torch.tensor([4, 1, 3], dtype=torch.int64, device=DEVICE)
    lens = torch.tensor([7, 0, 33], dtype=torch.int32, device=DEVICE)
    kv_indptr = _indptr([7, 0, 33])
    kv_indices = torch.full((50,), -1, dtype=torch.int64, device=DEVICE)
    create_flashinfer_kv_indices_triton[(3,)](
        req_to_token, req_pool_indices, lens, kv_indptr, None, kv_indices, req_to_token.stride(0)
    )
    expected = torch.cat([req_to_token[4, :7], req_to_token[3, :33]]).to(torch.int64)
    assert torch.equal(kv_indices[:40], expected)
    assert bool((kv_indices[40:] == -1).all())


def test_create_flashinfer_kv_indices_negative_length_writes_nothing():
    req_to_token = torch.arange(2 * 16, dtype=torch.int32, device=DEVICE).view(2, 16)
    kv_indptr = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    kv_indices = torch.full((8,), -1, dtype=torch.int64, device=DEVICE)
    create_flashinfer_kv_indices_triton[(1,)](
        req_to_token,
        torch.tensor([1], device=DEVICE),
        torch.tensor([-3], dtype=torch.int32, device=DEVICE),
        kv_indptr,
        None,
        kv_indices,
        req_to_token.stride(0),
    )
    assert bool((kv_indices == -1).all())


def _extend_reference(q, k, v, kb, vb, prefix, ext, kv_indices, masks):
    outs = []
    qs = ks = 0
    for b, (p, e) in enumerate(zip(prefix, ext)):
        idx = kv_indices[ks : ks + p]
        kk = torch.cat([kb[idx], k[qs : qs + e]]).float().repeat_interleave(H // HKV, 1)
        vv = torch.cat([vb[idx], v[qs : qs + e]]).float().repeat_interleave(H // HKV, 1)
        s = torch.einsum("qhd,khd->hqk", q[qs : qs + e].float(), kk) / math.sqrt(D)
        s = s.masked_fill(~masks[b], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vv))
        qs += e
        ks += p
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("use_custom_mask", [False, True])
def test_extend_attention_matches_torch(dtype, use_custom_mask):
    gen = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)

    prefix, ext = [5, 40, 0], [3, 7, 33]
    kb, vb = randn(300, HKV, D), randn(300, HKV, D)
    kv_indices = torch.randperm(300, generator=gen)[: sum(prefix)].to(DEVICE)
    T = sum(ext)
    q, k, v = randn(T, H, D), randn(T, HKV, D), randn(T, HKV, D)
    masks, flat = [], []
    for p, e in zip(prefix, ext):
        m = torch.ones(e, p + e, dtype=torch.bool)
        if use_custom_mask:
            m = torch.rand((e, p + e), generator=gen) < 0.6
            m[torch.arange(e), p + torch.arange(e)] = True  # every query sees itself
        else:
            m[:, p:] = torch.tril(torch.ones(e, e, dtype=torch.bool))
        masks.append(m.to(DEVICE))
        flat.append(m.reshape(-1))
    custom_mask = torch.cat(flat).to(DEVICE) if use_custom_mask else None
    mask_indptr = None
    if use_custom_mask:
        mask_indptr = torch.zeros(len(ext) + 1, dtype=torch.int64, device=DEVICE)
        mask_indptr[1:] = torch.cumsum(torch.tensor([e * (p + e) for p, e in zip(prefix, ext)]), 0)
    o = torch.zeros(T, H, D, dtype=dtype, device=DEVICE)
    extend_attention_fwd(
        q, k, v, o, kb, vb, _indptr(ext), _indptr(prefix), kv_indices,
        custom_mask, True, mask_indptr, max(ext), 1 / math.sqrt(D),
    )
    ref = _extend_reference(q, k, v, kb, vb, prefix, ext, kv_indices, masks)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
    assert (o.float() - ref).abs().max().item() < tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_matches_torch(dtype):
    gen = torch.Generator().manual_seed(2)

    def randn(*shape):
        return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)

    seq = [5, 47, 1]
    bs, max_kv_splits = len(seq), 4
    kb, vb = randn(300, HKV, D), randn(300, HKV, D)
    kv_indices = torch.randperm(300, generator=gen)[: sum(seq)].to(DEVICE)
    kv_indptr = _indptr(seq)
    q = randn(bs, H, D)
    o = torch.zeros(bs, H, D, dtype=dtype, device=DEVICE)
    attn_logits = torch.empty(bs, H, max_kv_splits, D, device=DEVICE)
    attn_lse = torch.empty(bs, H, max_kv_splits, device=DEVICE)
    num_kv_splits = torch.tensor([1, 3, 4], dtype=torch.int32, device=DEVICE)
    decode_attention_fwd(
        q, kb, vb, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
        max_kv_splits, 1 / math.sqrt(D),
    )
    for b in range(bs):
        idx = kv_indices[kv_indptr[b] : kv_indptr[b + 1]]
        kk = kb[idx].float().repeat_interleave(H // HKV, 1)
        vv = vb[idx].float().repeat_interleave(H // HKV, 1)
        s = torch.einsum("hd,khd->hk", q[b].float(), kk) / math.sqrt(D)
        ref = torch.einsum("hk,khd->hd", s.softmax(-1), vv)
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-2
        assert (o[b].float() - ref).abs().max().item() < tol
