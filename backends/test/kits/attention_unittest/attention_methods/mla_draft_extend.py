"""Scenario kit for MLA draft extend (the trtllm MLA backend): one concrete batch over a
latent KV pool, plus the ground truth a reference needs.

The batch convention is the padded draft-extend layout the backend's CUDA graphs capture, for
DRAFT_EXTEND and DRAFT_EXTEND_V2 alike: every request extends a window of
``num_draft_tokens`` (N) new tokens, ``seq_lens = prefix + N``, positions ``prefix ..
prefix + N - 1``; the accept lengths (each at most N - 1) only feed
``spec_info.accept_length`` / ``accept_length_cpu``. Query row ``j`` of a request sees its
prefix and window rows ``0..j``.

MLA is absorbed: q is ``[T, heads, kv_lora_rank + qk_rope_head_dim]``, the new latent k is
``[T, 1, 576]`` and v (what the backend never reads) its first ``kv_lora_rank`` values. The
ground truth is built from the pool and the new tokens only, never from backend metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from sglfix.backends.srt.layers.radix_attention import AttentionLayer
from sglfix.backends.srt.mem_cache.allocator import ScatteredPageAllocator
from sglfix.backends.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput
from sglfix.backends.test.kits.attention_unittest import staging
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import (
    AttentionCase,
    default_device,
    default_req_pool_size,
    parse_dtype,
    parse_mode,
)

# DeepSeek's non-RoPE query/key head dim: with the RoPE dims it sets the softmax scale.
QK_NOPE_HEAD_DIM = 128


@dataclass
class MLADraftExtendCase(AttentionCase):
    """An ``AttentionCase`` over an ``MLATokenToKVPool``; ``accept_lens`` as the spec input has them."""

    accept_lens: tuple[int, ...] = ()

    def make_backend(self, **kwargs):
        """A fresh TRTLLMMLABackend over this case's pools."""
        from sglfix.backends.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend

        return TRTLLMMLABackend(model_runner=self.model_runner, **kwargs)


def default_mla_context_len(*, longest: int, num_draft_tokens: int) -> int:
    """``req_to_token`` row length: the longest request plus a window of headroom, rounded to 32
    (as the dense kit and the scenario memory estimate)."""
    return max(64, 32 * math.ceil((longest + num_draft_tokens) / 32))


def build_mla_draft_extend_case(
    *,
    mode: str | ForwardMode,
    prefix_lens: Sequence[int],
    accept_lens: Sequence[int],
    num_draft_tokens: int,
    page_size: int,
    num_heads: int = 16,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    dtype: str | torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: str | torch.device | None = None,
    max_context_len: int | None = None,
    capture_bs: Sequence[int] | None = None,
    num_steps: int = 3,
    gpu_only: bool = False,
) -> MLADraftExtendCase:
    """Build one MLA draft-extend batch (see the module docstring for the convention).

    ``gpu_only`` leaves the host mirrors None (``seq_lens_cpu``, ``seq_lens_sum``,
    ``extend_prefix_lens_cpu``, ``accept_length_cpu``), as the overlap scheduler does; the
    window length ``extend_seq_lens_cpu`` stays, a host constant.
    """
    mode = parse_mode(mode)
    if not mode.is_draft_extend(include_v2=True):
        raise ValueError(f"MLA draft-extend cases are DRAFT_EXTEND or DRAFT_EXTEND_V2, not {mode.name}")
    dtype = parse_dtype(dtype)
    device = torch.device(device) if device is not None else default_device()
    prefix = [int(x) for x in prefix_lens]
    accept = [int(a) for a in accept_lens]
    bs = len(prefix)
    n = int(num_draft_tokens)
    if bs == 0:
        raise ValueError("prefix_lens must name at least one request")
    if any(p < 0 for p in prefix):
        raise ValueError(f"prefix_lens must be >= 0, got {prefix}")
    if len(accept) != bs:
        raise ValueError("accept_lens must have one entry per request")
    if any(a < 0 or a > n - 1 for a in accept):
        raise ValueError(f"accept_lens must lie in [0, num_draft_tokens - 1 = {n - 1}], got {accept}")
    max_graph_bs = max(capture_bs) if capture_bs else 0
    req_pool_size = default_req_pool_size(batch_size=bs, max_graph_bs=max_graph_bs)

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)

    ext = [n] * bs
    totals = [p + n for p in prefix]
    if max_context_len is None:
        max_context_len = default_mla_context_len(longest=max(totals), num_draft_tokens=n)
    if max(totals) > max_context_len:
        raise ValueError(f"a request needs {max(totals)} > max_context_len={max_context_len}")

    # Twice the pages needed (plus spares and the reserved page 0) so that pages scatter.
    pages_needed = sum(math.ceil(t / page_size) for t in totals)
    num_pages = 2 * pages_needed + 8
    req_to_token_pool = ReqToTokenPool(size=req_pool_size, max_context_len=max_context_len, device=device)
    pool = MLATokenToKVPool(
        size=(num_pages - 1) * page_size,
        page_size=page_size,
        dtype=dtype,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        layer_num=1,
        device=device,
    )
    # Every slot holds a random latent, so a wrong page or length reads wrong numbers. The host
    # copies stay for the ground truth, which is laid out on the host and sent once.
    host_buffers = staging.fill_random_(pool.kv_buffer, generator=gen, dtype=dtype)
    allocator = ScatteredPageAllocator(num_pages=num_pages, page_size=page_size, generator=gen)

    req_pool_indices_list = (torch.randperm(req_pool_size - 1, generator=gen)[:bs] + 1).tolist()
    slots_per_req = [allocator.alloc_token_slots(t) for t in totals]
    for r, slots in zip(req_pool_indices_list, slots_per_req):
        staging.fill_(req_to_token_pool.req_to_token[r, : len(slots)], slots.to(torch.int32))

    def randn(*shape):
        return staging.randn(shape, generator=gen, dtype=dtype)

    dim = kv_lora_rank + qk_rope_head_dim
    T = bs * n
    q_host = randn(T, num_heads, dim)
    k_host = randn(T, 1, dim)
    q, k = staging.to_device(q_host, device), staging.to_device(k_host, device)
    v = k[..., :kv_lora_rank].clone()
    out_cache_loc = staging.to_device(torch.cat([s[p : p + n] for s, p in zip(slots_per_req, prefix)]), device)

    # Ground truth, padded: prefix latents from the pool, then the window's new latents.
    latent = host_buffers[0]
    lmax = max(totals)
    q_pad = torch.zeros((bs, n, num_heads, dim), dtype=dtype)
    k_pad = torch.zeros((bs, lmax, 1, dim), dtype=dtype)
    visible = torch.zeros((bs, n, lmax), dtype=torch.bool)
    q_valid = torch.ones((bs, n), dtype=torch.bool, device=device)
    qo_index = torch.arange(T, dtype=torch.int64, device=device)  # rows are already b * n + j
    positions = []
    for b in range(bs):
        p = prefix[b]
        slots = slots_per_req[b]
        k_pad[b, :p] = latent[slots[:p]]
        k_pad[b, p : p + n] = k_host[b * n : (b + 1) * n]
        q_pad[b] = q_host[b * n : (b + 1) * n]
        visible[b, :, :p] = True
        visible[b, :, p : p + n] = torch.tril(torch.ones((n, n), dtype=torch.bool))
        positions.append(torch.arange(p, p + n, dtype=torch.int64))
    q_pad, k_pad, visible = (staging.to_device(t, device) for t in (q_pad, k_pad, visible))
    v_pad = k_pad[..., :kv_lora_rank].clone()
    positions = staging.to_device(torch.cat(positions), device)

    model_runner = ModelRunner(
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=pool,
        num_heads=num_heads,
        num_kv_heads=1,
        head_dim=dim,
        dtype=dtype,
        device=device,
        page_size=page_size,
        speculative_eagle_topk=1,
        speculative_num_steps=num_steps,
        speculative_num_draft_tokens=n,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=QK_NOPE_HEAD_DIM,
        context_len=max_context_len,
    )
    sm_scale = model_runner.scaling
    layer = AttentionLayer(
        layer_id=0,
        tp_q_head_num=num_heads,
        tp_k_head_num=1,
        head_dim=dim,
        scaling=sm_scale,
        v_head_dim_override=kv_lora_rank,
    )

    prefix_t = staging.tensor(prefix, dtype=torch.int32, device=device)
    ext_t = staging.tensor(ext, dtype=torch.int32, device=device)
    seq_lens = prefix_t + ext_t
    seq_lens_cpu = staging.mirror(seq_lens, torch.tensor(totals, dtype=torch.int32))
    forward_batch = ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        req_pool_indices=staging.tensor(req_pool_indices_list, dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        out_cache_loc=out_cache_loc,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=pool,
        seq_lens_cpu=None if gpu_only else seq_lens_cpu,
        seq_lens_sum=None if gpu_only else int(seq_lens_cpu.sum()),
        positions=positions,
        extend_num_tokens=T,
        extend_prefix_lens=prefix_t.clone(),
        extend_prefix_lens_cpu=None if gpu_only else list(prefix),
        extend_seq_lens=ext_t.clone(),
        extend_seq_lens_cpu=list(ext),
        spec_info=EagleDraftInput(
            topk=1,
            num_steps=num_steps,
            num_draft_tokens=n,
            accept_length=staging.tensor(accept, dtype=torch.int32, device=device),
            accept_length_cpu=None if gpu_only else list(accept),
        ),
    )
    forward_batch.tags.update(builder="kit", gpu_only=gpu_only, seed=seed)

    return MLADraftExtendCase(
        mode=mode,
        builder="kit",
        gpu_only=gpu_only,
        seed=seed,
        device=device,
        dtype=dtype,
        page_size=page_size,
        topk=1,
        num_steps=num_steps,
        num_draft_tokens=n,
        model_runner=model_runner,
        forward_batch=forward_batch,
        layer=layer,
        q=q,
        k=k,
        v=v,
        prefix_lens=prefix,
        extend_lens=ext,
        q_pad=q_pad,
        k_pad=k_pad,
        v_pad=v_pad,
        visible=visible,
        q_valid=q_valid,
        qo_index=qo_index,
        sm_scale=sm_scale,
        num_tokens_per_bs=n,
        accept_lens=tuple(accept),
    )
