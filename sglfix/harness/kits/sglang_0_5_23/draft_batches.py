"""The multi-step EAGLE draft's forward batches as sglang's draft worker and its CUDA-graph runner
hand them to the draft backend: the real batch and the batch a size is captured with."""

from __future__ import annotations

from typing import Any

import torch

from .environment import bind_own_plan
from .slots import DraftSlots

__all__ = ["make_capture_batch", "make_draft_batch"]


def make_draft_batch(slots: DraftSlots, *, device: str, hidden_size: int, dtype: torch.dtype, runner: Any) -> Any:
    """The EAGLE multi-step draft ``ForwardBatch`` (DECODE, spec_info an ``EagleDraftInput``) as the
    draft worker hands it to the draft backend: seq_lens = prefix, out_cache_loc for every step."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs, topk = slots.batch_size, slots.topk
    spec_info = EagleDraftInput(
        topk_p=torch.full((bs, topk), 1.0 / topk, dtype=torch.float32, device=device),
        topk_index=torch.arange(bs * topk, dtype=torch.int64, device=device).view(bs, topk),
        hidden_states=torch.zeros(bs, hidden_size, dtype=dtype, device=device),
        capture_hidden_mode=CaptureHiddenMode.LAST,
        num_tokens_per_req=topk,
        num_tokens_for_logprob_per_req=topk,
    )
    seq_lens = torch.tensor(slots.prefix_lens, dtype=torch.int32, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        input_ids=None,
        req_pool_indices=torch.arange(bs, dtype=torch.int32, device=device),
        seq_lens=seq_lens,
        seq_lens_cpu=torch.tensor(slots.prefix_lens, dtype=torch.int32),
        out_cache_loc=torch.tensor(slots.out_cache_loc(), dtype=torch.int64, device=device),
        seq_lens_sum=sum(slots.prefix_lens),
        positions=seq_lens.repeat_interleave(topk).to(torch.int64),
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
        spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    bind_own_plan(runner, batch)
    return batch


def make_capture_batch(
    bs: int, *, topk: int, num_steps: int, fill: int, device: str, hidden_size: int, dtype: torch.dtype, runner: Any
) -> Any:
    """The batch ``EAGLEDraftCudaGraphRunner.capture_one_shape`` builds from its static buffers:
    seq_lens = the fill value, everything else zero."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    spec_info = EagleDraftInput(
        topk_p=torch.zeros((bs, topk), dtype=torch.float32, device=device),
        topk_index=torch.zeros((bs, topk), dtype=torch.int64, device=device),
        hidden_states=torch.zeros(bs, hidden_size, dtype=dtype, device=device),
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    seq_lens = torch.full((bs,), fill, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        input_ids=None,
        req_pool_indices=torch.zeros((bs,), dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        seq_lens_cpu=torch.full((bs,), fill, dtype=torch.int64),
        out_cache_loc=torch.zeros((bs * topk * num_steps,), dtype=torch.int64, device=device),
        seq_lens_sum=int(bs * fill),
        positions=torch.zeros((bs * topk,), dtype=torch.int64, device=device),
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
        spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    bind_own_plan(runner, batch)
    return batch
