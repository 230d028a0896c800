"""TRT-LLM MLA's draft extend (v2) on sglang 0.5.23's kit: the batch the spec-v2 glue hands the
draft-extend backend, over the kit's MLA mock runner and a paged slot ground truth, and the batches
``EAGLEDraftExtendCudaGraphRunner`` captures and replays with."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from .draft_cases import mla_runner, round_up, torch_dtype
from .environment import bind_own_plan, prepare
from .slots import PagedSlots

__all__ = ["build_trtllm_draft_extend", "trtllm_capture_batch", "trtllm_prefill_case", "trtllm_replay_view"]


def build_trtllm_draft_extend(scenario: Any, *, device: str) -> SimpleNamespace:
    """A TRT-LLM MLA draft extend (v2) as the spec-v2 glue hands it to the draft-extend backend:
    every request extends a window of ``num_draft_tokens`` rows (the captured layout), seq_lens =
    prefix + num_draft_tokens, and the accept lengths only feed the spec input
    (``num_correct_drafts``; ``num_accept_tokens_cpu`` as the kit fills it). The kit's MLA mock
    runner holds the pools and publishes the server args (speculative_num_draft_tokens)."""
    prepare()
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    n = scenario.spec.num_draft_tokens
    prefix = tuple(scenario.prefix_lens)
    accept = tuple(scenario.accept_lens or (n - 1,) * len(prefix))
    bs = len(prefix)
    dtype = torch_dtype(scenario.model.dtype)
    capture = tuple(scenario.capture_bs) if scenario.capture_bs else None
    page = scenario.page_size
    case, runner, max_context_len = _trtllm_runner(
        scenario,
        model=scenario.model,
        mode=ForwardMode.DRAFT_EXTEND_V2,
        new_tokens=n,
        graphs=capture is not None,
        pool_bs=max(capture) if capture else bs,
        device=device,
    )
    seq_lens = tuple(p + n for p in prefix)
    num_slots = int(runner.token_to_kv_pool.size)
    slots = PagedSlots.allocate(seq_lens, page_size=page, num_slots=num_slots, seed=scenario.seed)
    runner.req_to_token_pool.req_to_token.zero_()
    slots.fill_req_to_token(runner.req_to_token_pool.req_to_token)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    extend = torch.full((bs,), n, dtype=torch.int32, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        batch_size=bs,
        input_ids=torch.zeros(bs * n, dtype=torch.int64, device=device),
        req_pool_indices=torch.arange(bs, dtype=torch.int32, device=device),
        seq_lens=seq,
        seq_lens_cpu=seq.cpu(),
        seq_lens_sum=sum(seq_lens),
        out_cache_loc=torch.tensor(
            [slots.slot(b, p + t) for b, p in enumerate(prefix) for t in range(n)], dtype=torch.int64, device=device
        ),
        positions=torch.tensor([p + t for p in prefix for t in range(n)], dtype=torch.int64, device=device),
    )
    batch.extend_seq_lens, batch.extend_seq_lens_cpu = extend, [n] * bs
    batch.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=device)
    batch.extend_prefix_lens_cpu = list(prefix)
    batch.extend_start_loc = torch.arange(bs, dtype=torch.int32, device=device) * n
    batch.extend_num_tokens = bs * n
    bind_own_plan(runner, batch)
    correct = torch.tensor(accept, dtype=torch.int32, device=device)
    spec = EagleDraftExtendInput(
        hidden_states=None,
        num_correct_drafts=correct,
        num_accept_tokens=correct + 1,
        num_accept_tokens_cpu=[a + 1 for a in accept],
        input_ids=batch.input_ids,
        seq_lens=batch.seq_lens,
        seq_lens_cpu=batch.seq_lens_cpu,
        req_pool_indices=batch.req_pool_indices,
        positions=batch.positions,
        capture_hidden_mode=CaptureHiddenMode.LAST,
        num_tokens_per_req=n,
        num_tokens_for_logprob_per_req=1,
    )
    spec.extend_seq_lens_tensor, spec.extend_seq_lens_cpu = extend, [n] * bs
    if scenario.gpu_only:
        batch.seq_lens_cpu = None
        batch.seq_lens_sum = None
        spec.seq_lens_cpu = None
        spec.num_accept_tokens_cpu = None
    batch.spec_info = spec
    return SimpleNamespace(
        case=case,
        runner=runner,
        slots=slots,
        batch=batch,
        num_draft_tokens=n,
        accept=accept,
        prefix=prefix,
        page_size=page,
        dtype=dtype,
        device=device,
        num_slots=num_slots,
        capture_bs=capture,
        max_context_len=max_context_len,
    )


def trtllm_replay_view(batch: Any, *, bs: int, n: int, fill: int) -> SimpleNamespace:
    """What ``EAGLEDraftExtendCudaGraphRunner.execute`` hands the draft-extend backend for a batch
    of ``raw_bs`` requests replayed at the captured size ``bs``: padded rows have seq_lens = fill,
    req_pool_indices / positions / out_cache_loc 0 and num_correct_drafts = num_accept_tokens =
    extend lengths = the captured width."""
    raw_bs = batch.batch_size
    spec = batch.spec_info

    def pad(t: Any, size: int, value: int) -> Any:
        if t is None:
            return None
        out = torch.full((size,), value, dtype=t.dtype, device=t.device)
        out[: t.numel()] = t
        return out

    spec.num_correct_drafts = pad(spec.num_correct_drafts, bs, n)
    spec.num_accept_tokens = pad(spec.num_accept_tokens, bs, n)
    spec.extend_seq_lens_tensor = pad(spec.extend_seq_lens_tensor, bs, n)
    spec.extend_seq_lens_cpu = list(spec.extend_seq_lens_cpu or [n] * raw_bs) + [n] * (bs - raw_bs)
    sum_ = batch.seq_lens_sum
    return SimpleNamespace(
        batch_size=bs,
        forward_mode=batch.forward_mode,
        input_ids=batch.input_ids,
        req_pool_indices=pad(batch.req_pool_indices, bs, 0),
        seq_lens=pad(batch.seq_lens, bs, fill),
        seq_lens_sum=None if sum_ is None else sum_ + (bs - raw_bs) * fill,
        seq_lens_cpu=None if batch.seq_lens_cpu is None else pad(batch.seq_lens_cpu, bs, fill),
        max_seq_len_host=None,
        encoder_lens=None,
        out_cache_loc=pad(batch.out_cache_loc, bs * n, 0),
        out_cache_loc_virtual=getattr(batch, "out_cache_loc_virtual", None),
        kv_loc_plan=getattr(batch, "kv_loc_plan", None),
        kv_loc_cols=getattr(batch, "kv_loc_cols", None),
        out_cache_loc_dsv4=None,
        mamba_track_indices=None,
        spec_info=spec,
    )


def trtllm_capture_batch(bs: int, *, n: int, fill: int, device: str, runner: Any) -> Any:
    """The batch ``EAGLEDraftExtendCudaGraphRunner`` captures a size with: seq_lens = fill, every
    request extending the captured width."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    seq = torch.full((bs,), fill, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        batch_size=bs,
        input_ids=torch.zeros(bs * n, dtype=torch.int64, device=device),
        req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
        seq_lens=seq,
        seq_lens_cpu=seq.cpu(),
        seq_lens_sum=int(bs * fill),
        out_cache_loc=torch.zeros(bs * n, dtype=torch.int64, device=device),
        positions=torch.zeros(bs * n, dtype=torch.int64, device=device),
    )
    batch.extend_seq_lens = torch.full((bs,), n, dtype=torch.int32, device=device)
    batch.extend_seq_lens_cpu = [n] * bs
    bind_own_plan(runner, batch)
    full = torch.full((bs,), n, dtype=torch.int32, device=device)
    batch.spec_info = EagleDraftExtendInput(
        hidden_states=None,
        num_correct_drafts=full.clone(),
        num_accept_tokens=full.clone(),
        num_accept_tokens_cpu=None,
        input_ids=batch.input_ids,
        seq_lens=seq,
        seq_lens_cpu=batch.seq_lens_cpu,
        req_pool_indices=batch.req_pool_indices,
        positions=batch.positions,
        capture_hidden_mode=CaptureHiddenMode.LAST,
        num_tokens_per_req=n,
        num_tokens_for_logprob_per_req=1,
    )
    return batch


def trtllm_prefill_case(
    scenario: Any, *, model: Any, new_tokens: int, device: str, disable_chunked_prefix_cache: bool
) -> tuple[Any, Any]:
    """A TRT-LLM MLA prefill on cached prefixes (the kit's MLA EXTEND batch: each request of
    ``scenario.prefix_lens`` extends ``new_tokens``) over the kit's MLA mock runner, with the
    speculative sizes and ``disable_chunked_prefix_cache`` published over its server args (put back
    by ``attention.restore_server_args``). Returns (the batch, the runner)."""
    prepare()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods.mla_attention import _make_forward_batch

    from .attention import publish_over, published_now, restore_server_args, track_published

    restore_server_args()
    before = published_now()
    case, runner, max_context_len = _trtllm_runner(
        scenario,
        model=model,
        mode=ForwardMode.EXTEND,
        new_tokens=new_tokens,
        graphs=True,
        pool_bs=len(scenario.prefix_lens),
        device=device,
    )
    track_published(runner, before=before)
    publish_over(
        runner,
        disable_chunked_prefix_cache=disable_chunked_prefix_cache,
        speculative_algorithm="EAGLE",
        speculative_eagle_topk=scenario.spec.topk,
        speculative_num_steps=scenario.spec.num_steps,
        speculative_num_draft_tokens=new_tokens,
    )
    batch = _make_forward_batch(case, runner, max_context_len=max_context_len, device=device)
    return batch, runner


def _trtllm_runner(
    scenario: Any, *, model: Any, mode: Any, new_tokens: int, graphs: bool, pool_bs: int, device: str
) -> tuple[Any, Any, int]:
    """The kit's MLA case of ``mode`` (each request of ``scenario.prefix_lens`` extends
    ``new_tokens``) for the TRT-LLM MLA backend, its mock runner over ``model``'s latent sizes and
    the context length the pools are sized for: (case, runner, max_context_len)."""
    from sglang.test.kits.attention_unittest.attention_methods.mla_attention import MLAAttentionCase

    prefix, page = tuple(scenario.prefix_lens), scenario.page_size
    max_context_len = round_up(max(scenario.max_context_len or 0, max(prefix) + new_tokens + 1), page)
    case = MLAAttentionCase(
        name=scenario.name,
        backend="trtllm_mla",
        forward_mode=mode,
        num_heads=model.num_heads,
        page_size=page,
        prefix_lens=prefix,
        extend_lens=(new_tokens,) * len(prefix),
    )
    runner, _hidden_size = mla_runner(
        case,
        model,
        dtype=torch_dtype(scenario.model.dtype),
        device=device,
        max_context_len=max_context_len,
        graphs=graphs,
        pool_bs=pool_bs,
    )
    return case, runner, max_context_len
