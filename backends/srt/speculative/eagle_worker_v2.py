"""Speculative-decoding (EAGLE, spec v2 / overlap scheduler) glue between the
scheduler's batch state and the attention backends.

Reproduces the pieces whose bugs the toggles revert:
- ``decide_needs_cpu_seq_lens`` (overlap utils): whether the scheduler must
  publish ``seq_lens_cpu``/``seq_lens_sum`` (a device->host sync per step), an OR
  over the spec-v2 attention backends' ``needs_cpu_seq_lens`` flags;
- ``resolve_seq_lens_cpu``: the FutureMap step that publishes (or, on the
  ``gpu_only`` path, withholds) the CPU mirrors;
- ``prepare_for_draft_extend_v2``: builds the DRAFT_EXTEND_V2 forward batch the
  way production does, bumping ``seq_lens`` to ``prefix + num_draft_tokens``
  *before* the backend's ``init_forward_metadata``;
- ``draft_forward``: the multi-step draft's attention steps, each writing through its own
  slice of the all-steps ``out_cache_loc`` (the layout every backend shares).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from sglfix.backends.srt.managers.overlap_utils import decide_needs_cpu_seq_lens
from sglfix.backends.srt.managers.schedule_batch import ScheduleBatch
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput
from sglfix.backends.srt.speculative.eagle_utils import per_step_draft_out_cache_loc


class LegacyAttnBackend:
    """A backend written before the ``needs_cpu_seq_lens`` flag existed (an
    out-of-tree or not-yet-ported backend): it does not declare the flag."""

    def __repr__(self) -> str:
        return "LegacyAttnBackend()"


@dataclass
class EagleWorkerV2:
    """The spec-v2 worker's attention backends: the draft-extend slot may be
    unset (None), as on some production configs."""

    target_attn_backend: Any
    draft_attn_backend: Any
    draft_extend_attn_backend: Optional[Any] = None

    @property
    def spec_v2_attn_backends(self) -> list[Any]:
        return [self.target_attn_backend, self.draft_attn_backend, self.draft_extend_attn_backend]

    @property
    def needs_cpu_seq_lens(self) -> bool:
        return decide_needs_cpu_seq_lens(self.spec_v2_attn_backends)


def prepare_for_draft_extend_v2(
    batch: ScheduleBatch,
    *,
    num_draft_tokens: int,
    gpu_only: bool,
    topk: int = 1,
    num_steps: int = 1,
) -> ForwardBatch:
    """The DRAFT_EXTEND_V2 forward batch: each request extends its
    ``num_draft_tokens`` window on top of ``batch.seq_lens`` cached tokens."""
    bs = len(batch.req_pool_indices)
    device = batch.seq_lens.device
    prefix_lens = batch.seq_lens.to(torch.int32)
    extend_lens = torch.full((bs,), num_draft_tokens, dtype=torch.int32, device=device)
    if gpu_only:
        # Device tensors only: no host mirror, no sync.
        extend_prefix_lens_cpu = None
        extend_seq_lens_cpu = None
    else:
        extend_prefix_lens_cpu = batch.seq_lens_cpu.tolist()
        extend_seq_lens_cpu = [num_draft_tokens] * bs

    positions = batch.positions
    if positions is None:
        positions = (
            prefix_lens[:, None]
            + torch.arange(num_draft_tokens, dtype=torch.int32, device=device)[None, :]
        ).reshape(-1).to(torch.int64)
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        batch_size=bs,
        req_pool_indices=batch.req_pool_indices,
        seq_lens=batch.seq_lens,
        out_cache_loc=batch.out_cache_loc,
        req_to_token_pool=batch.req_to_token_pool,
        token_to_kv_pool=batch.token_to_kv_pool,
        seq_lens_cpu=batch.seq_lens_cpu,
        seq_lens_sum=batch.seq_lens_sum,
        positions=positions,
        extend_num_tokens=bs * num_draft_tokens,
        extend_prefix_lens=prefix_lens,
        extend_prefix_lens_cpu=extend_prefix_lens_cpu,
        extend_seq_lens=extend_lens,
        extend_seq_lens_cpu=extend_seq_lens_cpu,
        spec_info=EagleDraftInput(
            topk=topk, num_steps=num_steps, num_draft_tokens=num_draft_tokens
        ),
    )
    # Forward sees the post-write length (draft extend writes num_draft_tokens
    # slots); the scheduler's own batch.seq_lens stays the prefix.
    forward_batch.seq_lens = forward_batch.seq_lens + num_draft_tokens
    if not gpu_only:
        forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu + num_draft_tokens
        forward_batch.seq_lens_sum = int(forward_batch.seq_lens_cpu.sum())
    else:
        # PR 26738: extend lengths are all num_draft_tokens, a host constant:
        # the backend reads max() from this list instead of syncing on the device.
        forward_batch.extend_seq_lens_cpu = [num_draft_tokens] * bs
    return forward_batch


def draft_forward(draft_backend, forward_batch: ForwardBatch, q: torch.Tensor, k: torch.Tensor,
                  v: Optional[torch.Tensor], layer) -> list[torch.Tensor]:
    """The attention of the multi-step draft (upstream ``EagleWorkerV2.draft_forward``, model
    forward reduced to its attention layer): step ``i`` writes its tokens' K/V through
    ``out_cache_loc`` step ``i`` and attends with ``draft_backend.attn_backends[i]``.

    ``q``/``k``/``v`` are [num_steps - 1, bs * topk, heads, dim] (``v`` None for MLA); the draft
    token of the last step is sampled, never attended, hence num_steps - 1 steps. Returns one
    output per step.
    """
    bs = forward_batch.batch_size
    topk = draft_backend.topk
    num_steps = draft_backend.speculative_num_steps
    all_steps = forward_batch.out_cache_loc
    # PR 26239: one helper for the [bs, topk, num_steps] layout, shared with the backends.
    out_cache_loc = per_step_draft_out_cache_loc(forward_batch.out_cache_loc, bs=bs, topk=topk, num_steps=num_steps)
    outs = []
    try:
        for i in range(num_steps - 1):
            forward_batch.out_cache_loc = out_cache_loc[i]
            outs.append(
                draft_backend.attn_backends[i].forward(
                    q[i], k[i], v[i] if v is not None else None, layer, forward_batch
                )
            )
    finally:
        forward_batch.out_cache_loc = all_steps
    return outs
