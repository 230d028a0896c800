"""The multi-step EAGLE draft's forward batches as sglang's draft worker and its CUDA-graph runner
hand them to the draft backend: the real batch, the batch a size is captured with, and the view a
replay pads a batch to."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from .environment import bind_own_plan
from .slots import DraftSlots

__all__ = ["make_capture_batch", "make_draft_batch", "pad_for_replay"]


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


def pad_for_replay(batch: Any, *, bs: int, topk: int, num_steps: int, fill: int) -> Any:
    """What ``EAGLEDraftCudaGraphRunner.execute`` hands ``init_forward_metadata_out_graph`` for a batch
    of ``raw_bs`` requests replayed at the captured size ``bs``: padded rows have seq_lens = fill,
    req_pool_indices / positions / out_cache_loc 0, seq_lens_sum grown by the padding."""
    raw_bs = batch.batch_size
    if bs == raw_bs:
        return SimpleNamespace(**vars(batch), num_padding=0)

    def pad(t: torch.Tensor, n: int, value: int) -> torch.Tensor:
        out = torch.full((n,), value, dtype=t.dtype, device=t.device)
        out[: t.numel()] = t
        return out

    view = dict(vars(batch))
    view.update(
        batch_size=bs,
        seq_lens=pad(batch.seq_lens, bs, fill),
        seq_lens_cpu=pad(batch.seq_lens_cpu, bs, fill) if batch.seq_lens_cpu is not None else None,
        req_pool_indices=pad(batch.req_pool_indices, bs, 0),
        positions=pad(batch.positions, bs * topk, 0),
        out_cache_loc=pad(batch.out_cache_loc, bs * topk * num_steps, 0),
        seq_lens_sum=batch.seq_lens_sum + (bs - raw_bs) * fill,
        num_padding=bs - raw_bs,
    )
    return SimpleNamespace(**view)
