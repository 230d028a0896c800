"""Scenario kit for the DeepSeek-V4 backend's decode path: the batches of ``draft_decode`` (same
pools, scattered pages, per-step q/k, ``out_cache_loc`` laid out [bs, topk, num_steps]) on a
latent MLA pool with DSv4's page size (256), seen through DSv4's sliding window.

- ``build_dsv4_draft_decode_case``: the multi-step EAGLE draft, topk 1 (DSv4 pins topk <= 1).
  Draft step ``i`` queries one row per request at position ``prefix + i``, writes draft token
  ``i`` there and sees the last ``window`` positions of its own sequence: the prefix, the draft
  tokens of earlier steps and its own;
- ``build_dsv4_decode_case``: plain decode, one new token per request at position ``prefix``,
  seeing the last ``window`` positions up to itself.

The ground truth is draft_decode's (padded K/V per request, never through backend metadata) with
the ``visible`` mask cut to the window.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from sglfix.backends.test.kits.attention_unittest.attention_methods.draft_decode import DecodePathCase, _build
from sglfix.backends.test.kits.attention_unittest import staging

# DSv4's sliding window (its draft layer attends only this many latest tokens) and page size.
SWA_WINDOW = 128
DSV4_PAGE_SIZE = 256


@dataclass
class DSV4DecodeCase(DecodePathCase):
    """A decode-path batch judged through a sliding window of ``window`` tokens."""

    window: int = SWA_WINDOW

    def make_backend(self):
        """A fresh DeepSeek-V4 backend: the multi-step draft backend for a draft batch."""
        from sglfix.backends.srt.layers.attention.deepseek_v4_backend import (
            DeepseekV4AttnBackend,
            DeepseekV4MultiStepBackend,
        )

        if self.draft:
            return DeepseekV4MultiStepBackend(self.model_runner, self.topk, self.num_steps)
        return DeepseekV4AttnBackend(self.model_runner)


def build_dsv4_draft_decode_case(
    *,
    prefix_lens: Sequence[int],
    num_steps: int,
    topk: int = 1,
    window: int = SWA_WINDOW,
    page_size: int = DSV4_PAGE_SIZE,
    num_heads: int,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    dtype: str | torch.dtype,
    seed: int,
    device: str | torch.device | None = None,
    max_context_len: Optional[int] = None,
    capture_bs: Optional[Sequence[int]] = None,
) -> DSV4DecodeCase:
    """The multi-step draft: ``num_steps - 1`` attention steps over ``prefix_lens`` cached tokens."""
    if num_steps < 2:
        raise ValueError("a multi-step draft needs num_steps >= 2 (num_steps - 1 attention steps)")
    return _windowed(
        draft=True, topk=topk, num_steps=num_steps, window=window, prefix_lens=prefix_lens, page_size=page_size,
        num_heads=num_heads, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, dtype=dtype,
        seed=seed, device=device, max_context_len=max_context_len, capture_bs=capture_bs,
    )


def build_dsv4_decode_case(
    *,
    prefix_lens: Sequence[int],
    window: int = SWA_WINDOW,
    page_size: int = DSV4_PAGE_SIZE,
    num_heads: int,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    dtype: str | torch.dtype,
    seed: int,
    device: str | torch.device | None = None,
    max_context_len: Optional[int] = None,
    capture_bs: Optional[Sequence[int]] = None,
) -> DSV4DecodeCase:
    """Plain decode: one new token per request (``seq_lens = prefix + 1``)."""
    return _windowed(
        draft=False, topk=1, num_steps=1, window=window, prefix_lens=prefix_lens, page_size=page_size,
        num_heads=num_heads, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, dtype=dtype,
        seed=seed, device=device, max_context_len=max_context_len, capture_bs=capture_bs,
    )


def _windowed(*, draft: bool, topk: int, num_steps: int, window: int, prefix_lens: Sequence[int],
              **shape) -> DSV4DecodeCase:
    if topk != 1:
        raise ValueError(f"DeepSeek-V4 supports topk 1 only (MTP topk > 1 is refused), got {topk}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    base = _build(draft=draft, mla=True, topk=topk, num_steps=num_steps, prefix_lens=prefix_lens,
                  num_kv_heads=None, head_dim=None, **shape)
    case = DSV4DecodeCase(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, window=window)

    # With one branch, k_pad's column c is sequence position c (prefix, then the draft tokens in
    # step order) and query row i sits at position prefix + i.
    bs, qmax, lmax = case.visible.shape
    device = case.visible.device
    query_pos = torch.tensor(case.prefix_lens)[:, None] + torch.arange(qmax)[None, :]
    columns = torch.arange(lmax)
    in_window = columns[None, None, :] > query_pos[:, :, None] - window
    case.visible = case.visible & staging.to_device(in_window, device)
    case.notes["window"] = window
    return case
