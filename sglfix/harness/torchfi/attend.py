"""The attention the FlashInfer stand-ins compute, from exactly what FlashInfer's FA2 kernels read.

One function serves every wrapper: per request ``r`` of the planned batch, the query rows
``qo_indptr[r] .. qo_indptr[r + 1]`` and the keys named by ``kv_indices[kv_indptr[r] ..]`` (or, for
the ragged wrapper, the K/V rows ``kv_indptr[r] .. kv_indptr[r + 1]``), masked as the kernel masks
them: causal aligned to the end of the KV (query row ``i`` of a ``q_len``-row request sits at
position ``kv_len - q_len + i``), the sliding window ``window_left`` (a key ``k`` is seen from
position ``p`` when ``p - window_left <= k``), or the packed custom mask read bit by bit from the
byte offset ``mask_indptr[r]`` (little bit order, ``q * kv_len + k``) and the window on top, or
FlashInfer's multi-item scoring mask (``MaskMode::kMultiItemScoring``, set by ``prefix_len_ptr``;
``_multi_item_mask``).

Every offset, length and index is read from the buffers the kernel reads, on the device, when the
kernel would run (not from the host plan): a stale buffer, a row written past its end or a mask
packed at the wrong offset changes the output here as it does on the GPU. ``kv_indices`` is read
through raw memory from its first element on, so a row that is too narrow reads what lies next in
the same allocation; past the allocation itself the read raises (on the GPU: garbage or an illegal
address).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from sglfix.harness.codefault import OutOfBounds

__all__ = ["Batch", "attend", "raw_entries", "raw_unsigned"]

_LOG2E = 1.0 / math.log(2.0)


def raw_entries(buffer: torch.Tensor, count: int, *, name: str) -> torch.Tensor:
    """``count`` entries of ``buffer``'s memory from its first element on, as a kernel handed its
    pointer reads them (past a sliced view's end: what follows it in the allocation)."""
    available = buffer.untyped_storage().nbytes() // buffer.element_size() - buffer.storage_offset()
    if count > available:
        raise RuntimeError(
            f"{name} read past the end of its allocation: {count} entries from the buffer's first element, "
            f"{available} exist there ({buffer.numel()} in the tensor)"
        )
    return torch.as_strided(buffer, (count,), (1,), buffer.storage_offset())


def raw_unsigned(buffer: torch.Tensor, count: int, *, width: int, name: str) -> torch.Tensor:
    """``count`` unsigned little-endian integers of ``width`` bytes (int64 on the host) from
    ``buffer``'s first byte on, as a kernel that casts the tensor's pointer to ``uint16_t*`` or
    ``uint32_t*`` reads them, whatever the tensor's own dtype: past a sliced view's end it reads
    what follows in the allocation; past the allocation itself it raises ``OutOfBounds`` (on the
    GPU: garbage or an illegal address), the code's fault."""
    start = buffer.storage_offset() * buffer.element_size()
    available = (buffer.untyped_storage().nbytes() - start) // width
    if count > available:
        raise OutOfBounds(
            f"{name} read past the end of its allocation: entry {count - 1} ({width}-byte entries from the "
            f"tensor's first byte), {available} exist there ({buffer.numel()} {buffer.dtype} elements in the tensor)"
        )
    raw = torch.empty(0, dtype=torch.uint8, device=buffer.device).set_(buffer.untyped_storage())
    data = raw[start : start + count * width].to("cpu", torch.int64).view(count, width)
    return (data << (8 * torch.arange(width, dtype=torch.int64))).sum(dim=1)


@dataclass
class Batch:
    """What one kernel launch reads. Offsets are host int64 copies of the device buffers, taken
    when the kernel runs; ``rows`` is the batch size the host plan scheduled."""

    rows: int
    qo_indptr: torch.Tensor  # [rows + 1]
    kv_starts: torch.Tensor  # [rows]: first entry of each request in kv_indices (or in K/V rows)
    kv_lens: torch.Tensor  # [rows]
    causal: bool
    window_left: int = -1
    kv_indices: torch.Tensor | None = None  # None: ragged, K/V rows are contiguous
    page_size: int = 1
    mask: torch.Tensor | None = None  # packed custom mask (uint8)
    mask_indptr: torch.Tensor | None = None  # [rows]: byte offset of each request's mask
    sm_scale: float | None = None  # None: 1 / sqrt(head_dim)
    logits_soft_cap: float | None = None
    k_scale: float | None = None
    v_scale: float | None = None
    # Multi-item scoring (FlashInfer's plan keeps them by reference; the kernel reads them as
    # uint32 / uint16 / uint16 arrays): per request its prefix length, each suffix token's position
    # in its item at request * token_pos_in_items_len, and its longest item.
    prefix_len_ptr: torch.Tensor | None = None
    token_pos_in_items_ptr: torch.Tensor | None = None
    token_pos_in_items_len: int = 0
    max_item_len_ptr: torch.Tensor | None = None


def _keys(batch: Batch, lmax: int, num_pages: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(page, offset in page, valid) per request and key position, each [rows, lmax]."""
    pos = torch.arange(lmax, dtype=torch.int64)
    valid = pos[None, :] < batch.kv_lens[:, None]
    if batch.kv_indices is None:
        rows = torch.where(valid, batch.kv_starts[:, None] + pos[None, :], 0)
        if bool((rows[valid] < 0).any()):
            # The kernel reads before the K/V it was handed (on the GPU, another tensor's memory).
            raise RuntimeError("kv_indptr points before the first K/V row")
        return rows, torch.zeros_like(rows), valid
    entry = batch.kv_starts[:, None] + pos[None, :] // batch.page_size
    count = int(entry[valid].max()) + 1 if bool(valid.any()) else 0
    if bool((entry[valid] < 0).any()):
        raise RuntimeError("kv_indptr points before the start of kv_indices")
    flat = raw_entries(batch.kv_indices, count, name="kv_indices").to("cpu", torch.int64)
    pages = torch.zeros_like(entry)
    pages[valid] = flat[entry[valid]]
    bad = valid & ((pages < 0) | (pages >= num_pages))
    if bool(bad.any()):
        r, j = (int(x) for x in bad.nonzero()[0])
        raise RuntimeError(
            f"kv_indices[{int(entry[r, j])}] = {int(pages[r, j])} (request {r}, key {j}) is outside the "
            f"KV cache of {num_pages} pages"
        )
    return pages, (pos % batch.page_size)[None, :].expand_as(pages).clone(), valid


def _custom_mask(batch: Batch, q_lens: torch.Tensor, qmax: int, lmax: int) -> torch.Tensor:
    """[rows, qmax, lmax]: bit ``q * kv_len + k`` of request r's packed mask."""
    assert batch.mask is not None and batch.mask_indptr is not None
    q = torch.arange(qmax, dtype=torch.int64)[None, :, None]
    k = torch.arange(lmax, dtype=torch.int64)[None, None, :]
    kv_len = batch.kv_lens[:, None, None]
    inside = (q < q_lens[:, None, None]) & (k < kv_len)
    bit = torch.where(inside, q * kv_len + k, 0)
    byte = batch.mask_indptr[:, None, None] + bit // 8
    count = int(byte[inside].max()) + 1 if bool(inside.any()) else 0
    packed = raw_entries(batch.mask, count, name="the custom mask").to("cpu", torch.int64)
    values = torch.zeros_like(byte)
    values[inside] = packed[byte[inside]]
    return inside & (((values >> (bit % 8)) & 1) == 1)


def _multi_item_mask(batch: Batch, position: torch.Tensor, q_valid: torch.Tensor, lmax: int) -> torch.Tensor:
    """[rows, qmax, lmax]: FlashInfer's multi-item scoring mask (prefill.cuh,
    ``logits_mask_multi_item_scoring``). Always causal; a query at position ``p`` below its
    request's ``prefix_len`` sees keys as causal attention does; past it, with ``t`` its position in
    its item (``token_pos_in_items[r * token_pos_in_items_len + p - prefix_len]``; 0 for a
    delimiter), it sees the prefix (``k < prefix_len``) and the keys ``p - t < k <= p``: its item's
    tokens up to itself, not the delimiter before them (a delimiter sees the prefix alone).

    Each request's ``prefix_len`` and ``max_item_len`` are read (the kernel loads both for every
    request: ``max_item_len`` only skips KV tiles no item token can see, so it changes nothing here
    when it is at least every item's length), and each position of a query past its prefix, at the
    kernel's offsets, through raw memory: a short or mistyped array reads what the kernel would."""
    rows = batch.rows
    assert batch.prefix_len_ptr is not None
    prefix = raw_unsigned(batch.prefix_len_ptr, rows, width=4, name="prefix_len_ptr")  # [rows]
    if batch.max_item_len_ptr is None:
        raise OutOfBounds("max_item_len_ptr is None under multi-item scoring: the kernel dereferences it")
    raw_unsigned(batch.max_item_len_ptr, rows, width=2, name="max_item_len_ptr")
    suffix = q_valid & (position >= prefix[:, None])  # the queries that read their item position
    stride = int(batch.token_pos_in_items_len) & 0xFFFFFFFF  # the kernel's uint32_t
    entry = torch.arange(rows, dtype=torch.int64)[:, None] * stride + position - prefix[:, None]
    t = torch.zeros_like(position)
    if bool(suffix.any()):
        if batch.token_pos_in_items_ptr is None:
            raise OutOfBounds("token_pos_in_items_ptr is None under multi-item scoring: the kernel dereferences it")
        count = int(entry[suffix].max()) + 1
        items = raw_unsigned(batch.token_pos_in_items_ptr, count, width=2, name="token_pos_in_items_ptr")
        t[suffix] = items[entry[suffix]]
    key = torch.arange(lmax, dtype=torch.int64)[None, None, :]
    p = position[:, :, None]
    inside_item = (key < prefix[:, None, None]) | (key > p - t[:, :, None])
    return (key <= p) & (~suffix[:, :, None] | inside_item)


def attend(
    batch: Batch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [tokens, H, Dv] in q's dtype, log2-sum-exp [tokens, H] in float32) for ``q`` against
    the paged cache ``k_cache``/``v_cache`` ([pages, page_size, Hkv, D], or [slots, Hkv, D] as pages
    of one token) or, for a ragged batch, the K/V rows themselves. Rows no request covers are left
    as they are in ``out`` (a fresh output is NaN there: the kernel never writes them)."""
    if k_cache.dim() == 3:
        k_cache, v_cache = k_cache.unsqueeze(1), v_cache.unsqueeze(1)
    num_heads, dim = q.shape[1], q.shape[2]
    device = q.device
    if out is None:
        # The value width may differ from the key's (an MLA model's multi-head prefill: 192 / 128).
        out = q.new_full((q.shape[0], num_heads, v_cache.shape[-1]), float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), dtype=torch.float32, device=device)
    rows = batch.rows
    if rows == 0:
        return out, lse
    q_lens = (batch.qo_indptr[1 : rows + 1] - batch.qo_indptr[:rows]).clamp(min=0)
    qmax = int(q_lens.max())
    if qmax == 0:
        return out, lse
    # A batch of empty KV still launches: its rows come out 0, log2-sum-exp -inf.
    lmax = max(int(batch.kv_lens.max()) if batch.kv_lens.numel() else 0, 1)
    qpos = torch.arange(qmax, dtype=torch.int64)
    q_valid = qpos[None, :] < q_lens[:, None]
    q_rows = torch.where(q_valid, batch.qo_indptr[:rows, None] + qpos[None, :], 0)
    if bool((q_rows[q_valid] >= q.shape[0]).any()):
        raise RuntimeError(f"qo_indptr reaches row {int(q_rows[q_valid].max())} of a {q.shape[0]}-row query")

    pages, offsets, k_valid = _keys(batch, lmax, k_cache.shape[0])
    keys = k_cache[pages.to(device), offsets.to(device)].float()  # [rows, lmax, Hkv, D]
    values = v_cache[pages.to(device), offsets.to(device)].float()
    num_kv = keys.shape[2]
    group = num_heads // num_kv
    qs = q[q_rows.to(device)].float().view(rows, qmax, num_kv, group, dim)
    scale = batch.sm_scale if batch.sm_scale is not None else 1.0 / math.sqrt(dim)
    if batch.k_scale is not None:
        scale = scale * batch.k_scale
    scores = torch.einsum("bqkgd,blkd->bkgql", qs, keys) * scale
    cap = batch.logits_soft_cap
    if cap is not None and cap > 0:
        scores = cap * torch.tanh(scores / cap)

    position = batch.kv_lens[:, None] - q_lens[:, None] + qpos[None, :]  # [rows, qmax]
    key = torch.arange(lmax, dtype=torch.int64)[None, None, :]
    seen = k_valid[:, None, :] & q_valid[:, :, None]
    if batch.prefix_len_ptr is not None:
        # FlashInfer's kernel runs MaskMode::kMultiItemScoring whenever a plan set prefix_len_ptr,
        # over a custom mask and the run's causal alike.
        seen = seen & _multi_item_mask(batch, position, q_valid, lmax)
    elif batch.mask is not None:
        seen = seen & _custom_mask(batch, q_lens, qmax, lmax)
    elif batch.causal:
        seen = seen & (key <= position[:, :, None])
    if batch.window_left >= 0:
        seen = seen & (key >= position[:, :, None] - batch.window_left)
    scores = scores.masked_fill(~seen.to(device)[:, None, None], float("-inf"))

    top = scores.amax(dim=-1, keepdim=True)
    empty = torch.isinf(top) & (top < 0)
    weights = torch.exp(scores - torch.where(empty, 0.0, top))
    total = weights.sum(dim=-1, keepdim=True)
    o = torch.einsum("bkgql,blkd->bqkgd", weights / torch.where(total > 0, total, 1.0), values)
    if batch.v_scale is not None:
        o = o * batch.v_scale
    row_lse = ((torch.log(total) + torch.where(empty, 0.0, top)) * _LOG2E).squeeze(-1)  # [rows, Hkv, g, qmax]
    row_lse = row_lse.permute(0, 3, 1, 2).reshape(rows, qmax, num_heads)
    flat = q_rows[q_valid].to(device)
    out[flat] = o.reshape(rows, qmax, num_heads, -1)[q_valid.to(device)].to(out.dtype)
    lse[flat] = row_lse[q_valid.to(device)]
    return out, lse


def host_int64(t: Any) -> torch.Tensor:
    """A host int64 snapshot of an offsets tensor (what a planner or a launch reads then)."""
    return torch.as_tensor(t).detach().to("cpu", torch.int64).clone()
