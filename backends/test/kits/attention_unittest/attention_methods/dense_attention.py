"""Scenario kit: builds one concrete attention batch (pools, cached prefix K/V,
new q/k/v, the ForwardBatch) plus the ground truth a reference needs, like the
engine's attention test kit.

The ground truth never goes through backend metadata: it is the padded, batched
K/V each query must see (``k_pad``/``v_pad``: prefix tokens then the new tokens,
in sequence order) and a boolean ``visible`` mask, so a reference is one masked
softmax over ``[bs, Qmax, Lmax]``.

Two ways to build a DRAFT_EXTEND_V2 batch:
- ``builder="kit"``: the fixture sets the fields directly, with the production
  convention ``seq_lens = prefix + num_draft_tokens``;
- ``builder="glue"``: the pre-step scheduler state goes through the spec-v2 glue
  (``decide_needs_cpu_seq_lens`` -> ``resolve_seq_lens_cpu`` ->
  ``prepare_for_draft_extend_v2``), exactly as production builds it. The glue is
  called while the case is built, so a crash in it surfaces from ``build_case``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from sglfix.backends.srt.layers.radix_attention import AttentionLayer
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.mem_cache.allocator import ScatteredPageAllocator
from sglfix.backends.srt.speculative.eagle_worker_v2 import EagleWorkerV2, LegacyAttnBackend, prepare_for_draft_extend_v2
from sglfix.backends.srt.managers.schedule_batch import ScheduleBatch
from sglfix.backends.srt.managers.overlap_utils import resolve_seq_lens_cpu
from sglfix.backends.test.kits.attention_unittest import staging

_MODE_NAMES = {
    "extend": ForwardMode.EXTEND,
    "decode": ForwardMode.DECODE,
    "target_verify": ForwardMode.TARGET_VERIFY,
    "verify": ForwardMode.TARGET_VERIFY,
    "draft_extend": ForwardMode.DRAFT_EXTEND,
    "draft_extend_v2": ForwardMode.DRAFT_EXTEND_V2,
}

_DTYPES = {
    "fp16": torch.float16,
    "float16": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def parse_mode(mode: str | ForwardMode) -> ForwardMode:
    if isinstance(mode, ForwardMode):
        return mode
    try:
        return _MODE_NAMES[mode.lower()]
    except KeyError:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(_MODE_NAMES)}") from None


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}") from None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class AttentionCase:
    """One scenario batch, its inputs and its ground truth.

    Packed inputs (``qo_indptr`` order, request-major): ``q`` [T, H, D],
    ``k``/``v`` [T, Hkv, D]. Ground truth: ``q_pad`` [bs, Qmax, H, D],
    ``k_pad``/``v_pad`` [bs, Lmax, Hkv, D], ``visible`` [bs, Qmax, Lmax] bool,
    ``q_valid`` [bs, Qmax] bool; ``qo_index`` [T] maps packed row t to the flat
    row ``b * Qmax + i`` of the padded layout.
    """

    mode: ForwardMode
    builder: str
    gpu_only: bool
    seed: int
    device: torch.device
    dtype: torch.dtype
    page_size: int
    topk: int
    num_steps: int
    num_draft_tokens: int
    model_runner: ModelRunner
    forward_batch: ForwardBatch
    layer: AttentionLayer
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    prefix_lens: list[int]
    extend_lens: list[int]
    q_pad: torch.Tensor
    k_pad: torch.Tensor
    v_pad: torch.Tensor
    visible: torch.Tensor
    q_valid: torch.Tensor
    qo_index: torch.Tensor
    sm_scale: float
    # Tokens per request the CUDA-graph runner lays out for this mode.
    num_tokens_per_bs: int
    worker: Optional[EagleWorkerV2] = None
    notes: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    def make_backend(self, **kwargs):
        """A fresh TritonAttnBackend over this case's pools."""
        from sglfix.backends.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(model_runner=self.model_runner, **kwargs)

    def pad_output(self, o: torch.Tensor) -> torch.Tensor:
        """Packed output [T, H, D] -> padded [bs, Qmax, H, D] (invalid rows zero)."""
        bs, qmax = self.q_valid.shape
        out = torch.zeros((bs * qmax,) + tuple(o.shape[1:]), dtype=o.dtype, device=o.device)
        out[self.qo_index] = o
        return out.view((bs, qmax) + tuple(o.shape[1:]))


def default_req_pool_size(*, batch_size: int, max_graph_bs: int = 0) -> int:
    """Request slots a case allocates: the batch or the largest graph, plus the reserved row 0.

    Never below 32, so that the random pool indices of small batches stay what they always were
    (the seeded draws that follow depend on them).
    """
    return max(32, batch_size + 1, max_graph_bs + 1)


def _draft_tree(num_draft_tokens: int, topk: int, num_steps: int, gen: torch.Generator):
    """Parents (-1 for the root) of a random draft tree in BFS order: node 0 is
    the verified token, each node has at most ``topk`` children and depth at most
    ``num_steps``. ``topk == 1`` gives a chain."""
    parents = [-1]
    depth = [0]
    children = [0]
    for i in range(1, num_draft_tokens):
        cands = [j for j in range(i) if children[j] < topk and depth[j] < num_steps]
        if not cands:
            raise ValueError(
                f"num_draft_tokens={num_draft_tokens} does not fit a tree of "
                f"topk={topk}, num_steps={num_steps}"
            )
        if topk == 1:
            j = cands[-1]
        else:
            j = cands[int(torch.randint(len(cands), (1,), generator=gen))]
        parents.append(j)
        depth.append(depth[j] + 1)
        children.append(0)
        children[j] += 1
    # visible[i, j]: j is i or an ancestor of i.
    vis = torch.zeros((num_draft_tokens, num_draft_tokens), dtype=torch.bool)
    for i in range(num_draft_tokens):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = parents[j]
    return parents, depth, vis


def _set_draft_extend_v2_prefix_lens(
    forward_batch: ForwardBatch,
    *,
    prefix_lens: torch.Tensor,
    num_draft_tokens: int,
    gpu_only: bool,
) -> None:
    """Fixture for DRAFT_EXTEND_V2 batches built without the glue."""
    bs = forward_batch.batch_size
    # PR 26651 (fixture): match production, which bumps seq_lens to prefix +
    # extend before init_forward_metadata (see eagle_worker_v2.prepare_for_draft_extend_v2).
    seq_lens = prefix_lens + num_draft_tokens
    forward_batch.seq_lens = seq_lens
    forward_batch.extend_prefix_lens = prefix_lens
    forward_batch.extend_seq_lens = torch.full(
        (bs,), num_draft_tokens, dtype=torch.int32, device=prefix_lens.device
    )
    # The window length is a host constant in production, even on gpu_only.
    forward_batch.extend_seq_lens_cpu = [num_draft_tokens] * bs
    if gpu_only:
        forward_batch.seq_lens_cpu = None
        forward_batch.seq_lens_sum = None
        forward_batch.extend_prefix_lens_cpu = None
    else:
        forward_batch.seq_lens_cpu = seq_lens.cpu()
        forward_batch.seq_lens_sum = int(forward_batch.seq_lens_cpu.sum())
        forward_batch.extend_prefix_lens_cpu = prefix_lens.cpu().tolist()


def build_case(
    *,
    mode: str | ForwardMode,
    prefix_lens: Sequence[int],
    extend_lens: int | Sequence[int] | None = None,
    accept_lens: Sequence[int] | None = None,
    page_size: int = 1,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    dtype: str | torch.dtype = torch.float16,
    topk: int = 1,
    num_steps: int = 3,
    num_draft_tokens: int = 4,
    gpu_only: bool = False,
    seed: int = 0,
    device: str | torch.device | None = None,
    builder: str = "kit",
    max_context_len: int | None = None,
    req_pool_size: int | None = None,
    capture_bs: Sequence[int] | None = None,
    max_kv_splits: int = 4,
) -> AttentionCase:
    """Build one scenario batch.

    Per mode, the new tokens per request are: EXTEND ``extend_lens`` (int or
    list); DECODE 1; TARGET_VERIFY ``num_draft_tokens`` (a draft tree: chain when
    ``topk == 1``); DRAFT_EXTEND ``accept_lens[b] + 1``; DRAFT_EXTEND_V2
    ``num_draft_tokens``. ``gpu_only`` leaves the CPU mirrors (``seq_lens_cpu``,
    ``seq_lens_sum``, ``*_cpu`` lists) None, as the spec-v2 overlap path does.
    ``builder="glue"`` is only meaningful for DRAFT_EXTEND_V2. A prefix may be 0
    (a fresh prefill, or a first token attending only itself). ``capture_bs``
    names the CUDA-graph sizes the case will be replayed on, so that the request
    pool holds the largest of them.
    """
    mode = parse_mode(mode)
    dtype = parse_dtype(dtype)
    device = torch.device(device) if device is not None else default_device()
    if builder not in ("kit", "glue"):
        raise ValueError(f"builder must be 'kit' or 'glue', got {builder!r}")
    if builder == "glue" and mode != ForwardMode.DRAFT_EXTEND_V2:
        raise ValueError("builder='glue' reproduces the DRAFT_EXTEND_V2 glue only")
    if num_heads % num_kv_heads:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    prefix = [int(x) for x in prefix_lens]
    bs = len(prefix)
    if bs == 0:
        raise ValueError("prefix_lens must name at least one request")
    if any(p < 0 for p in prefix):
        raise ValueError(f"prefix_lens must be >= 0, got {prefix}")
    max_graph_bs = max(capture_bs) if capture_bs else 0
    if req_pool_size is None:
        req_pool_size = default_req_pool_size(batch_size=bs, max_graph_bs=max_graph_bs)
    if max(bs, max_graph_bs) + 1 > req_pool_size:
        raise ValueError(
            f"req_pool_size={req_pool_size} too small for bs={max(bs, max_graph_bs)} (+1 reserved)"
        )

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)

    # New tokens per request.
    if mode == ForwardMode.EXTEND:
        if extend_lens is None:
            raise ValueError("EXTEND needs extend_lens")
        ext = [int(extend_lens)] * bs if isinstance(extend_lens, int) else [int(x) for x in extend_lens]
    elif mode == ForwardMode.DECODE:
        ext = [1] * bs
    elif mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2):
        ext = [num_draft_tokens] * bs
    elif mode == ForwardMode.DRAFT_EXTEND:
        if accept_lens is None:
            raise ValueError("DRAFT_EXTEND needs accept_lens")
        ext = [int(a) + 1 for a in accept_lens]
        if any(e < 1 or e > num_steps + 1 for e in ext):
            raise ValueError("accept_lens must lie in [0, num_steps]")
    else:
        raise ValueError(f"mode {mode.name} is not buildable")
    if len(ext) != bs:
        raise ValueError("extend_lens/accept_lens must have one entry per request")
    accept = [e - 1 for e in ext] if mode == ForwardMode.DRAFT_EXTEND else None

    totals = [p + e for p, e in zip(prefix, ext)]
    if max_context_len is None:
        max_context_len = max(64, 32 * math.ceil((max(totals) + num_draft_tokens) / 32))
    if max(totals) > max_context_len:
        raise ValueError(f"a request needs {max(totals)} > max_context_len={max_context_len}")

    # Pools: twice the pages needed (plus the reserved page) so slots scatter.
    pages_needed = sum(math.ceil(t / page_size) for t in totals)
    num_pages = 2 * pages_needed + 8
    req_to_token_pool = ReqToTokenPool(
        size=req_pool_size, max_context_len=max_context_len, device=device
    )
    token_to_kv_pool = MHATokenToKVPool(
        size=(num_pages - 1) * page_size,
        page_size=page_size,
        dtype=dtype,
        head_num=num_kv_heads,
        head_dim=head_dim,
        layer_num=1,
        device=device,
    )
    # Every slot holds random K/V, so a wrong index reads wrong numbers, never zeros. The host
    # copies stay for the ground truth, which is laid out on the host and sent once.
    host_buffers = staging.fill_random_(
        token_to_kv_pool.k_buffer + token_to_kv_pool.v_buffer, generator=gen, dtype=dtype
    )
    allocator = ScatteredPageAllocator(num_pages=num_pages, page_size=page_size, generator=gen)

    req_pool_indices_list = (torch.randperm(req_pool_size - 1, generator=gen)[:bs] + 1).tolist()
    slots_per_req = [allocator.alloc_token_slots(t) for t in totals]
    for r, slots in zip(req_pool_indices_list, slots_per_req):
        staging.fill_(req_to_token_pool.req_to_token[r, : len(slots)], slots.to(torch.int32))

    k_cache, v_cache = host_buffers

    def randn(*shape):
        return staging.randn(shape, generator=gen, dtype=dtype)

    T = sum(ext)
    q_host = randn(T, num_heads, head_dim)
    k_host = randn(T, num_kv_heads, head_dim)
    v_host = randn(T, num_kv_heads, head_dim)
    q, k, v = (staging.to_device(t, device) for t in (q_host, k_host, v_host))
    out_cache_loc = staging.to_device(
        torch.cat([s[p : p + e] for s, p, e in zip(slots_per_req, prefix, ext)]), device
    )

    # Ground truth, padded.
    qmax = max(ext)
    lmax = max(totals)
    q_pad = torch.zeros((bs, qmax, num_heads, head_dim), dtype=dtype)
    k_pad = torch.zeros((bs, lmax, num_kv_heads, head_dim), dtype=dtype)
    v_pad = torch.zeros_like(k_pad)
    visible = torch.zeros((bs, qmax, lmax), dtype=torch.bool)
    q_valid = torch.zeros((bs, qmax), dtype=torch.bool)
    qo_index = torch.empty(T, dtype=torch.int64)

    custom_masks = []
    positions = []
    tree_parents = []
    start = 0
    for b in range(bs):
        p, e = prefix[b], ext[b]
        slots = slots_per_req[b]
        k_pad[b, :p] = k_cache[slots[:p]]
        v_pad[b, :p] = v_cache[slots[:p]]
        k_pad[b, p : p + e] = k_host[start : start + e]
        v_pad[b, p : p + e] = v_host[start : start + e]
        q_pad[b, :e] = q_host[start : start + e]
        q_valid[b, :e] = True
        qo_index[start : start + e] = b * qmax + torch.arange(e)
        visible[b, :e, :p] = True
        if mode == ForwardMode.TARGET_VERIFY:
            parents, depth, tree_vis = _draft_tree(num_draft_tokens, topk, num_steps, gen)
            visible[b, :e, p : p + e] = tree_vis
            row_mask = torch.ones((e, p + e), dtype=torch.bool)
            row_mask[:, p:] = tree_vis
            custom_masks.append(row_mask.reshape(-1))
            positions.append(torch.tensor(depth, dtype=torch.int64) + p)
            tree_parents.append(torch.tensor(parents, dtype=torch.int64))
        else:
            visible[b, :e, p : p + e] = torch.tril(torch.ones((e, e), dtype=torch.bool))
            positions.append(torch.arange(p, p + e, dtype=torch.int64))
        start += e
    positions = staging.to_device(torch.cat(positions), device)
    q_pad, k_pad, v_pad, visible, q_valid, qo_index = (
        staging.to_device(t, device) for t in (q_pad, k_pad, v_pad, visible, q_valid, qo_index)
    )

    model_runner = ModelRunner(
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=token_to_kv_pool,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        page_size=page_size,
        speculative_eagle_topk=topk,
        speculative_num_steps=num_steps,
        speculative_num_draft_tokens=num_draft_tokens,
        max_kv_splits=max_kv_splits,
    )
    sm_scale = 1.0 / math.sqrt(head_dim)
    layer = AttentionLayer(
        layer_id=0,
        tp_q_head_num=num_heads,
        tp_k_head_num=num_kv_heads,
        head_dim=head_dim,
        scaling=sm_scale,
    )

    req_pool_indices = staging.tensor(req_pool_indices_list, dtype=torch.int64, device=device)
    prefix_t = staging.tensor(prefix, dtype=torch.int32, device=device)
    ext_t = staging.tensor(ext, dtype=torch.int32, device=device)
    worker = None

    def cpu_mirror(seq_lens: torch.Tensor, host_values: Sequence[int]):
        if gpu_only:
            return None, None
        cpu = staging.mirror(seq_lens, torch.tensor(host_values, dtype=seq_lens.dtype))
        return cpu, int(cpu.sum())

    if mode == ForwardMode.DRAFT_EXTEND_V2 and builder == "glue":
        # Production: the worker's backends decide whether CPU mirrors exist; a
        # gpu_only config leaves the draft-extend backend slot unset.
        from sglfix.backends.srt.layers.attention.triton_backend import TritonAttnBackend

        worker = EagleWorkerV2(
            target_attn_backend=TritonAttnBackend(model_runner=model_runner),
            draft_attn_backend=TritonAttnBackend(model_runner=model_runner),
            draft_extend_attn_backend=None if gpu_only else LegacyAttnBackend(),
        )
        needs_cpu_seq_lens = worker.needs_cpu_seq_lens
        batch = ScheduleBatch(
            req_pool_indices=req_pool_indices,
            seq_lens=prefix_t.clone(),
            out_cache_loc=out_cache_loc,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            positions=positions,
        )
        resolve_seq_lens_cpu(batch, needs_cpu_seq_lens=needs_cpu_seq_lens)
        forward_batch = prepare_for_draft_extend_v2(
            batch,
            num_draft_tokens=num_draft_tokens,
            gpu_only=not needs_cpu_seq_lens,
            topk=topk,
            num_steps=num_steps,
        )
    else:
        forward_batch = ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            req_pool_indices=req_pool_indices,
            seq_lens=prefix_t + ext_t,
            out_cache_loc=out_cache_loc,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool=token_to_kv_pool,
            positions=positions,
            extend_num_tokens=T,
        )
        if mode == ForwardMode.DECODE:
            forward_batch.seq_lens_cpu, forward_batch.seq_lens_sum = cpu_mirror(forward_batch.seq_lens, totals)
        elif mode == ForwardMode.TARGET_VERIFY:
            # Verify: seq_lens counts the cached tokens only; the draft tokens
            # are the dense extend part, described by the tree mask.
            forward_batch.seq_lens = prefix_t.clone()
            forward_batch.seq_lens_cpu, forward_batch.seq_lens_sum = cpu_mirror(forward_batch.seq_lens, prefix)
            forward_batch.extend_prefix_lens = prefix_t.clone()
            forward_batch.extend_seq_lens = ext_t.clone()
            forward_batch.spec_info = EagleVerifyInput(
                topk=topk,
                num_steps=num_steps,
                num_draft_tokens=num_draft_tokens,
                custom_mask=staging.to_device(torch.cat(custom_masks), device),
                retrive_parent=staging.to_device(torch.stack(tree_parents), device),
                positions=positions,
            )
        elif mode == ForwardMode.DRAFT_EXTEND_V2:
            _set_draft_extend_v2_prefix_lens(
                forward_batch,
                prefix_lens=prefix_t.clone(),
                num_draft_tokens=num_draft_tokens,
                gpu_only=gpu_only,
            )
            forward_batch.spec_info = EagleDraftInput(
                topk=topk, num_steps=num_steps, num_draft_tokens=num_draft_tokens
            )
        else:
            # EXTEND and DRAFT_EXTEND (v1): seq_lens = prefix + new tokens.
            forward_batch.seq_lens_cpu, forward_batch.seq_lens_sum = cpu_mirror(forward_batch.seq_lens, totals)
            forward_batch.extend_prefix_lens = prefix_t.clone()
            forward_batch.extend_seq_lens = ext_t.clone()
            if not gpu_only:
                forward_batch.extend_prefix_lens_cpu = list(prefix)
                forward_batch.extend_seq_lens_cpu = list(ext)
            if mode == ForwardMode.DRAFT_EXTEND:
                forward_batch.spec_info = EagleDraftInput(
                    topk=topk,
                    num_steps=num_steps,
                    num_draft_tokens=num_draft_tokens,
                    accept_length=staging.tensor(accept, dtype=torch.int32, device=device),
                    accept_length_cpu=None if gpu_only else list(accept),
                )
    forward_batch.tags.update(builder=builder, gpu_only=gpu_only, seed=seed)

    if mode == ForwardMode.DECODE:
        num_tokens_per_bs = 1
    elif mode == ForwardMode.DRAFT_EXTEND:
        num_tokens_per_bs = num_steps + 1
    elif mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2):
        num_tokens_per_bs = num_draft_tokens
    else:
        num_tokens_per_bs = max(ext)

    return AttentionCase(
        mode=mode,
        builder=builder,
        gpu_only=gpu_only,
        seed=seed,
        device=device,
        dtype=dtype,
        page_size=page_size,
        topk=topk,
        num_steps=num_steps,
        num_draft_tokens=num_draft_tokens,
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
        num_tokens_per_bs=num_tokens_per_bs,
        worker=worker,
    )
