"""Scenario kit for the decode-path backends (FlashInfer, FlashInfer MLA): one concrete batch
(pools, cached prefix K/V, new q/k/v, the ForwardBatch) plus the ground truth a reference needs.

Two batches:
- ``build_draft_decode_case``: the multi-step EAGLE draft. Every request has ``topk`` branches;
  draft step ``i`` (of ``num_steps - 1``) queries one row per branch, writes the branch's draft
  token ``i`` and attends the request's prefix plus the branch's draft tokens ``0..i``. Draft
  token ``(b, j, s)`` lives at ``req_to_token[req_b, prefix_b + j * num_steps + s]`` (page size
  1, as ``generate_draft_decode_kv_indices`` reads it) and ``out_cache_loc`` is laid out
  [bs, topk, num_steps];
- ``build_decode_case``: plain decode, one new token per request attending its prefix and itself.

MLA batches use an ``MLATokenToKVPool`` (latent K of ``kv_lora_rank + qk_rope_head_dim``, one KV
head, V = the first ``kv_lora_rank`` values) and absorbed queries; GQA batches an
``MHATokenToKVPool``. Every pool slot holds random values and slots are scattered, so a wrong
index reads wrong numbers. The ground truth never goes through backend metadata: padded K/V per
request and a ``visible`` mask, for one batched reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from sglfix.backends.srt.layers.radix_attention import AttentionLayer
from sglfix.backends.srt.mem_cache.allocator import ScatteredPageAllocator
from sglfix.backends.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput
from sglfix.backends.test.kits.attention_unittest import staging
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import (
    default_device,
    default_req_pool_size,
    parse_dtype,
)

# DeepSeek's non-RoPE query/key head dim: with qk_rope_head_dim it sets the MLA softmax scale.
MLA_QK_NOPE_HEAD_DIM = 128


@dataclass
class DecodePathCase:
    """One decode-path batch, its inputs and its ground truth.

    Draft: ``q`` [num_steps - 1, bs * topk, H, D], ``k``/``v`` likewise (per step, branch-major
    within each request). Plain decode: ``q`` [bs, H, D], ``k``/``v`` [bs, Hkv, D]. MLA: D = 576,
    ``k`` is the new tokens' latent, ``v`` its first kv_lora_rank values (unused by the backend).
    Ground truth: ``q_pad`` [bs, Q, H, D] (draft: row ``j * (num_steps - 1) + i`` is branch ``j``
    step ``i``), ``k_pad``/``v_pad`` [bs, Lmax, Hkv, D/Dv], ``visible`` [bs, Q, Lmax],
    ``q_valid`` [bs, Q] (all True).
    """

    mode: ForwardMode
    draft: bool
    mla: bool
    seed: int
    device: torch.device
    dtype: torch.dtype
    page_size: int
    topk: int
    num_steps: int
    model_runner: ModelRunner
    forward_batch: ForwardBatch
    layer: AttentionLayer
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    prefix_lens: list[int]
    q_pad: torch.Tensor
    k_pad: torch.Tensor
    v_pad: torch.Tensor
    visible: torch.Tensor
    q_valid: torch.Tensor
    sm_scale: float
    max_context_len: int
    # Query rows a captured graph lays out per request (the runners' num_tokens_per_bs).
    num_tokens_per_bs: int
    num_draft_tokens: int = 2
    notes: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    def make_backend(self):
        """A fresh FlashInfer (MLA) backend over this case's pools: the multi-step draft backend
        for a draft batch, the plain backend otherwise."""
        if self.mla:
            from sglfix.backends.srt.layers.attention.flashinfer_mla_backend import (
                FlashInferMLAAttnBackend as Plain,
                FlashInferMLAMultiStepDraftBackend as Draft,
            )
        else:
            from sglfix.backends.srt.layers.attention.flashinfer_backend import (
                FlashInferAttnBackend as Plain,
                FlashInferMultiStepDraftBackend as Draft,
            )
        if self.draft:
            return Draft(self.model_runner, self.topk, self.num_steps)
        return Plain(self.model_runner)

    def pack_output(self, out) -> torch.Tensor:
        """The backend's output in the reference's (b, row) order."""
        return pack_draft_output(out) if self.draft else out


def pack_draft_output(out_steps: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-step outputs [bs * topk, H, Dv] -> [bs * topk * (num_steps - 1), H, Dv] in (b, j, i)
    order: request, branch, step, matching ``q_pad``'s rows."""
    stacked = torch.stack(list(out_steps), dim=1)  # [bs * topk, steps, H, Dv]
    return stacked.reshape(-1, *stacked.shape[2:])


def default_max_context_len(prefix_lens: Sequence[int], new_per_request: int) -> int:
    return max(64, 32 * math.ceil((max(prefix_lens) + new_per_request) / 32))


def build_draft_decode_case(
    *,
    mla: bool,
    prefix_lens: Sequence[int],
    topk: int,
    num_steps: int,
    page_size: int = 1,
    num_heads: int,
    num_kv_heads: Optional[int] = None,
    head_dim: Optional[int] = None,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    dtype: str | torch.dtype,
    seed: int,
    device: str | torch.device | None = None,
    max_context_len: Optional[int] = None,
    capture_bs: Optional[Sequence[int]] = None,
) -> DecodePathCase:
    """The multi-step draft batch: ``prefix_lens`` cached tokens per request, ``topk`` branches,
    ``num_steps - 1`` attention steps (``num_steps`` draft slots per branch are allocated)."""
    if num_steps < 2:
        raise ValueError("a multi-step draft needs num_steps >= 2 (num_steps - 1 attention steps)")
    if page_size != 1:
        raise ValueError("the draft's page tables are reproduced for page_size 1 only")
    return _build(
        draft=True, mla=mla, prefix_lens=prefix_lens, topk=topk, num_steps=num_steps, page_size=page_size,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim, dtype=dtype, seed=seed, device=device,
        max_context_len=max_context_len, capture_bs=capture_bs,
    )


def build_decode_case(
    *,
    mla: bool,
    prefix_lens: Sequence[int],
    page_size: int = 1,
    num_heads: int,
    num_kv_heads: Optional[int] = None,
    head_dim: Optional[int] = None,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    dtype: str | torch.dtype,
    seed: int,
    device: str | torch.device | None = None,
    max_context_len: Optional[int] = None,
    capture_bs: Optional[Sequence[int]] = None,
) -> DecodePathCase:
    """Plain decode: one new token per request (``seq_lens = prefix + 1``)."""
    return _build(
        draft=False, mla=mla, prefix_lens=prefix_lens, topk=1, num_steps=1, page_size=page_size,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim, dtype=dtype, seed=seed, device=device,
        max_context_len=max_context_len, capture_bs=capture_bs,
    )


def _build(
    *,
    draft: bool,
    mla: bool,
    prefix_lens: Sequence[int],
    topk: int,
    num_steps: int,
    page_size: int,
    num_heads: int,
    num_kv_heads: Optional[int],
    head_dim: Optional[int],
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    dtype: str | torch.dtype,
    seed: int,
    device: str | torch.device | None,
    max_context_len: Optional[int],
    capture_bs: Optional[Sequence[int]],
) -> DecodePathCase:
    dtype = parse_dtype(dtype)
    device = torch.device(device) if device is not None else default_device()
    prefix = [int(x) for x in prefix_lens]
    bs = len(prefix)
    if bs == 0:
        raise ValueError("prefix_lens must name at least one request")
    if any(p < 0 for p in prefix):
        raise ValueError(f"prefix_lens must be >= 0, got {prefix}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if mla:
        kv_heads, qk_dim, v_dim = 1, kv_lora_rank + qk_rope_head_dim, kv_lora_rank
    else:
        if num_kv_heads is None or head_dim is None:
            raise ValueError("a GQA case needs num_kv_heads and head_dim")
        if num_heads % num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        kv_heads, qk_dim, v_dim = num_kv_heads, head_dim, head_dim

    # Slots per request: the prefix, then topk * num_steps draft slots (plain decode: 1 new token).
    new_per_request = topk * num_steps if draft else 1
    totals = [p + new_per_request for p in prefix]
    if max_context_len is None:
        max_context_len = default_max_context_len(prefix, new_per_request)
    if max(totals) > max_context_len:
        raise ValueError(
            f"a request needs {max(totals)} slots (prefix + {new_per_request}) > max_context_len={max_context_len}"
        )
    max_graph_bs = max(capture_bs) if capture_bs else 0
    req_pool_size = default_req_pool_size(batch_size=bs, max_graph_bs=max_graph_bs)

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)

    def randn(*shape):
        return staging.randn(shape, generator=gen, dtype=dtype)

    # Pools: twice the pages needed (plus the reserved page) so slots scatter.
    pages_needed = sum(math.ceil(t / page_size) for t in totals)
    num_pages = 2 * pages_needed + 8
    req_to_token_pool = ReqToTokenPool(size=req_pool_size, max_context_len=max_context_len, device=device)
    if mla:
        pool = MLATokenToKVPool(
            size=(num_pages - 1) * page_size, page_size=page_size, dtype=dtype, kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim, layer_num=1, device=device,
        )
        buffers = pool.kv_buffer
    else:
        pool = MHATokenToKVPool(
            size=(num_pages - 1) * page_size, page_size=page_size, dtype=dtype, head_num=kv_heads,
            head_dim=qk_dim, layer_num=1, device=device,
        )
        buffers = pool.k_buffer + pool.v_buffer
    # Every slot holds random values, so a wrong index reads wrong numbers, never zeros. The host
    # copies stay for the ground truth, which is laid out on the host and sent once.
    host_buffers = staging.fill_random_(buffers, generator=gen, dtype=dtype)
    allocator = ScatteredPageAllocator(num_pages=num_pages, page_size=page_size, generator=gen)

    req_pool_indices_list = (torch.randperm(req_pool_size - 1, generator=gen)[:bs] + 1).tolist()
    slots_per_req = [allocator.alloc_token_slots(t) for t in totals]
    for r, slots in zip(req_pool_indices_list, slots_per_req):
        staging.fill_(req_to_token_pool.req_to_token[r, : len(slots)], slots.to(torch.int32))

    if mla:
        k_cache = host_buffers[0]
        v_cache = host_buffers[0][..., :kv_lora_rank]
    else:
        k_cache, v_cache = host_buffers

    steps = num_steps - 1 if draft else 1
    rows = bs * topk
    # Per step, one row per branch (plain decode: one step, one row per request).
    q_host = randn(steps, rows, num_heads, qk_dim)
    k_host = randn(steps, rows, kv_heads, qk_dim)
    v_host = k_host[..., :v_dim] if mla else randn(steps, rows, kv_heads, v_dim)
    q, k = staging.to_device(q_host, device), staging.to_device(k_host, device)
    # MLA: v is k's first v_dim columns, the same memory, as the engine hands it.
    v = k[..., :v_dim] if mla else staging.to_device(v_host, device)

    # Ground truth: prefix tokens, then the new tokens of branch j, step i at p + j * steps + i.
    qmax = topk * steps
    lmax = max(prefix) + topk * steps
    q_pad = torch.zeros((bs, qmax, num_heads, qk_dim), dtype=dtype)
    k_pad = torch.zeros((bs, lmax, kv_heads, qk_dim), dtype=dtype)
    v_pad = torch.zeros((bs, lmax, kv_heads, v_dim), dtype=dtype)
    visible = torch.zeros((bs, qmax, lmax), dtype=torch.bool)
    out_cache_loc = torch.empty((bs, topk, num_steps if draft else 1), dtype=torch.int64)
    for b in range(bs):
        p = prefix[b]
        slots = slots_per_req[b]
        prefix_slots = slots[:p]
        k_pad[b, :p] = k_cache[prefix_slots]
        v_pad[b, :p] = v_cache[prefix_slots]
        visible[b, :, :p] = True
        for j in range(topk):
            out_cache_loc[b, j] = slots[p + j * num_steps : p + (j + 1) * num_steps] if draft else slots[p : p + 1]
            for i in range(steps):
                col = p + j * steps + i
                row = j * steps + i
                k_pad[b, col] = k_host[i, b * topk + j]
                v_pad[b, col] = v_host[i, b * topk + j]
                q_pad[b, row] = q_host[i, b * topk + j]
                visible[b, row, p + j * steps : col + 1] = True
    q_pad, k_pad, v_pad, visible = (staging.to_device(t, device) for t in (q_pad, k_pad, v_pad, visible))
    q_valid = torch.ones((bs, qmax), dtype=torch.bool, device=device)

    if mla:
        model_runner = ModelRunner(
            req_to_token_pool=req_to_token_pool, token_to_kv_pool=pool, num_heads=num_heads, num_kv_heads=1,
            head_dim=qk_dim, dtype=dtype, device=device, page_size=page_size, speculative_eagle_topk=topk,
            speculative_num_steps=num_steps, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
            qk_nope_head_dim=MLA_QK_NOPE_HEAD_DIM, context_len=max_context_len,
        )
        layer = AttentionLayer(
            layer_id=0, tp_q_head_num=num_heads, tp_k_head_num=1, head_dim=qk_dim,
            scaling=model_runner.scaling, v_head_dim_override=v_dim,
        )
    else:
        model_runner = ModelRunner(
            req_to_token_pool=req_to_token_pool, token_to_kv_pool=pool, num_heads=num_heads,
            num_kv_heads=kv_heads, head_dim=qk_dim, dtype=dtype, device=device, page_size=page_size,
            speculative_eagle_topk=topk, speculative_num_steps=num_steps, context_len=max_context_len,
        )
        layer = AttentionLayer(
            layer_id=0, tp_q_head_num=num_heads, tp_k_head_num=kv_heads, head_dim=qk_dim,
            scaling=model_runner.scaling,
        )

    req_pool_indices = staging.tensor(req_pool_indices_list, dtype=torch.int64, device=device)
    prefix_t = staging.tensor(prefix, dtype=torch.int32, device=device)
    if draft:
        # The draft decodes on top of the verified prefix: seq_lens counts no draft token.
        seq_lens = prefix_t
        positions = seq_lens.repeat_interleave(topk).to(torch.int64)
        spec_info = EagleDraftInput(topk=topk, num_steps=num_steps)
    else:
        seq_lens = prefix_t + 1
        positions = prefix_t.to(torch.int64)
        spec_info = None
        q, k, v = q[0], k[0], v[0]
    seq_lens_cpu = staging.mirror(
        seq_lens, torch.tensor(prefix, dtype=torch.int32) + (0 if draft else 1)
    )
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        out_cache_loc=staging.to_device(out_cache_loc.reshape(-1), device),
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=pool,
        seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=int(seq_lens_cpu.sum()),
        positions=positions,
        spec_info=spec_info,
        tags=dict(builder="kit", seed=seed, draft=draft),
    )

    return DecodePathCase(
        mode=ForwardMode.DECODE,
        draft=draft,
        mla=mla,
        seed=seed,
        device=device,
        dtype=dtype,
        page_size=page_size,
        topk=topk,
        num_steps=num_steps,
        model_runner=model_runner,
        forward_batch=forward_batch,
        layer=layer,
        q=q,
        k=k,
        v=v,
        prefix_lens=prefix,
        q_pad=q_pad,
        k_pad=k_pad,
        v_pad=v_pad,
        visible=visible,
        q_valid=q_valid,
        sm_scale=model_runner.scaling,
        max_context_len=max_context_len,
        num_tokens_per_bs=topk if draft else 1,
    )
