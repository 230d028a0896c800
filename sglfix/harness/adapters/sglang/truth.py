"""The ground truth of a ``backend: triton`` case on real sglang, sglfix's judge: what each query
must see (the pool's prefix K/V read at the layout's slots, then the new tokens, causally or by the
draft tree's visibility; a multi-item scoring request, its items' visibility; an encoder-decoder
model's cross layer, the request's cached encoder tokens), padded, and the reference computed from
it alone."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GroundTruth",
    "encoder_truth",
    "first_difference",
    "ground_truth",
    "host_ints",
    "item_visibility",
    "reference",
    "tree_visibility",
]


@dataclass
class GroundTruth:
    """What each query must see, padded: q [bs, Q, H, D], k [bs, L, Hkv, D], v [bs, L, Hkv, Dv]
    (Dv < D for absorbed MLA), visible [bs, Q, L]."""

    q_pad: Any
    k_pad: Any
    v_pad: Any
    visible: Any
    q_valid: Any
    sm_scale: float


def first_difference(have: Sequence[Any], want: Sequence[Any]) -> int | None:
    """The first index where ``have`` differs from ``want`` (where one ends first, its length),
    None where the two are equal: what a judge names of a value the code under test built."""
    if list(have) == list(want):
        return None
    return next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))


def host_ints(t: Any, n: int | None = None) -> list[int]:
    """A tensor of the code under test as a flat list of ints on the host (its first ``n``)."""
    values = t.to("cpu").reshape(-1).tolist()
    return [int(x) for x in (values if n is None else values[:n])]


def tree_visibility(parents: list[int]) -> Any:
    """visible[i, j]: node j is node i or one of its ancestors."""
    import torch

    n = len(parents)
    vis = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = parents[j]
    return vis


def item_visibility(new: int, items: Sequence[int]) -> Any:
    """visible[i, j] among one multi-item scoring request's ``new`` tokens (query, then a delimiter
    before every item and one after the last): a query token sees the query up to itself; every
    other token sees the whole query, and an item's token its own item's tokens up to itself, never
    a delimiter (each item scored as if it alone followed the query). The cached prefix, before
    them, is seen by all."""
    import torch

    query = new - sum(items) - len(items) - 1
    vis = torch.zeros((new, new), dtype=torch.bool)
    vis[:query, :query] = torch.tril(torch.ones((query, query), dtype=torch.bool))
    vis[query:, :query] = True
    start = query + 1  # the first item's first token, after its delimiter
    for length in items:
        vis[start : start + length, start : start + length] = torch.tril(torch.ones((length, length), dtype=torch.bool))
        start += length + 1
    return vis


def ground_truth(
    *,
    scenario: Any,
    runner: Any,
    loc: Callable[[int, int], int],
    q: Any,
    k: Any,
    v: Any,
    trees: list[Any] | None,
    items: Sequence[Sequence[int] | None] | None = None,
) -> GroundTruth:
    """Padded ground truth from the pool's prefix K/V (read at the layout's slots) and the new
    tokens; causal within the new tokens, the draft tree's visibility for verify, a multi-item
    scoring request's (``items``, per request; None: causal), or every new token of the request
    (a diffusion LM's canvas, DLLM_EXTEND); a sliding-window layer's query sees no key more
    than the window back."""
    import torch

    prefix, ext = list(scenario.prefix_lens), list(scenario.extend_lens)
    window = None if scenario.model.full_layer else scenario.model.sliding_window
    bidirectional = scenario.mode == "DLLM_EXTEND"
    bs, qmax, lmax = len(prefix), max(ext), max(p + e for p, e in zip(prefix, ext))
    pool = runner.token_to_kv_pool
    k_cache, v_cache = pool.get_key_buffer(0), pool.get_value_buffer(0)
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    q_pad = q.new_zeros((bs, qmax, heads, dim))
    k_pad = k.new_zeros((bs, lmax, kv_heads, dim))
    v_pad = v.new_zeros((bs, lmax, kv_heads, v.shape[2]))
    visible = torch.zeros((bs, qmax, lmax), dtype=torch.bool, device=q.device)
    q_valid = torch.zeros((bs, qmax), dtype=torch.bool, device=q.device)
    start = 0
    for b, (p, e) in enumerate(zip(prefix, ext)):
        slots = torch.tensor([loc(b, i) for i in range(p)], dtype=torch.int64, device=k_cache.device)
        k_pad[b, :p], v_pad[b, :p] = k_cache[slots], v_cache[slots]
        k_pad[b, p : p + e], v_pad[b, p : p + e] = k[start : start + e], v[start : start + e]
        q_pad[b, :e] = q[start : start + e]
        q_valid[b, :e] = True
        visible[b, :e, :p] = True
        if trees is not None:
            new = trees[b]
        elif items is not None and items[b] is not None:
            new = item_visibility(e, items[b])
        elif bidirectional:
            new = torch.ones((e, e), dtype=torch.bool)
        else:
            new = torch.tril(torch.ones((e, e), dtype=torch.bool))
        visible[b, :e, p : p + e] = new.to(q.device)
        if window is not None:
            # Query i sits at position p + i; it sees no key more than `window` positions back.
            pos_q = torch.arange(p, p + e, device=q.device)[:, None]
            visible[b, :e, : p + e] &= pos_q - torch.arange(p + e, device=q.device)[None, :] <= window
        start += e
    return GroundTruth(
        q_pad=q_pad, k_pad=k_pad, v_pad=v_pad, visible=visible, q_valid=q_valid, sm_scale=1.0 / math.sqrt(dim)
    )


def encoder_truth(*, scenario: Any, runner: Any, slots: list[list[int]], q: Any) -> GroundTruth:
    """The ground truth of an encoder-decoder model's cross-attention layer: every query of request
    b sees its cached encoder tokens (the pool's K/V at ``slots[b]``, where the layout put them), all
    of them, no mask, and no decoder token."""
    import torch

    ext, enc = list(scenario.extend_lens), [len(s) for s in slots]
    bs, qmax, lmax = len(ext), max(ext), max(enc)
    pool = runner.token_to_kv_pool
    k_cache, v_cache = pool.get_key_buffer(0), pool.get_value_buffer(0)
    heads, dim = q.shape[1], q.shape[2]
    q_pad = q.new_zeros((bs, qmax, heads, dim))
    k_pad = k_cache.new_zeros((bs, lmax) + tuple(k_cache.shape[1:]))
    v_pad = v_cache.new_zeros((bs, lmax) + tuple(v_cache.shape[1:]))
    visible = torch.zeros((bs, qmax, lmax), dtype=torch.bool, device=q.device)
    q_valid = torch.zeros((bs, qmax), dtype=torch.bool, device=q.device)
    start = 0
    for b, (e, n) in enumerate(zip(ext, enc)):
        at = torch.tensor(slots[b], dtype=torch.int64, device=k_cache.device)
        k_pad[b, :n], v_pad[b, :n] = k_cache[at], v_cache[at]
        q_pad[b, :e] = q[start : start + e]
        q_valid[b, :e] = True
        visible[b, :e, :n] = True
        start += e
    return GroundTruth(
        q_pad=q_pad, k_pad=k_pad, v_pad=v_pad, visible=visible, q_valid=q_valid, sm_scale=1.0 / math.sqrt(dim)
    )


def reference(truth: GroundTruth) -> tuple[Any, Any]:
    """(reference output, rows to compare) from the ground truth only."""
    from sglfix.harness.reference import reference_attention

    ref = reference_attention(
        q_pad=truth.q_pad, k_pad=truth.k_pad, v_pad=truth.v_pad, mask=truth.visible, scale=truth.sm_scale
    )
    return ref, truth.q_valid
