"""The spec-v2 draft-extend glue of a ``builder: glue`` case on real sglang: the scheduler state
before the draft extend (a real ``ScheduleBatch``, ``seq_lens`` = accepted prefix) and the
production glue (``eagle_worker_common.prepare_for_draft_extend``) run over it, which bumps
``seq_lens`` and builds the ForwardBatch the backend sees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import Unavailable

__all__ = ["GlueInputs", "glue_inputs", "make_schedule_batch", "run_glue"]

# The draft model's vocabulary for the glue (it checks the window's token ids against it); the
# kit's production draft-extend harness configures its runner the same way.
_VOCAB = 64


@dataclass
class GlueInputs:
    """The scheduler state before the draft extend (``seq_lens`` = accepted prefix) and what the
    worker hands ``prepare_for_draft_extend``."""

    schedule_batch: Any
    predict: Any  # next token ids, one window per request
    num_accept_tokens: Any


def _configure_draft_runner(runner: Any) -> None:
    """What ``ForwardBatch.init_new`` and the glue read of a draft runner beyond what the kit's
    stand-in sets up: the model config's derived fields, each computed the way sglang's
    ``ModelConfig`` computes it (the kit's production draft harness fills ``vocab_size`` and
    ``dtype`` likewise), and the runner's feature managers, made by ``ModelRunner``'s own init
    methods (the kit's stand-in skips ``ModelRunner.__init__``); LoRA off, as ``__init__`` leaves it."""
    from sglang.srt.configs import model_config

    config, hf = runner.model_config, runner.model_config.hf_config
    config.vocab_size = hf.vocab_size = _VOCAB
    config.dtype = runner.dtype
    requires = getattr(model_config, "requires_mm_token_modalities", None)  # 0.5.20 on
    if requires is not None:
        config.requires_mm_token_modalities = requires(hf.architectures, config.hf_text_config)
    config.use_ngram_embedding = getattr(hf, "use_ngram_embedding", False)
    config.ngram_embedding_n = hf.ngram_embedding_n if config.use_ngram_embedding else 0
    config.use_engram = bool(getattr(hf, "engram_layer_ids", ()))
    runner.lora_manager = None
    _kit("attention").single_rank_moe()
    if not hasattr(config, "model_is_mrope"):  # 0.5.18-0.5.19's ForwardBatch.init_new reads it
        config.model_is_mrope = False
    if not hasattr(runner, "attn_dcp_size"):  # 0.5.21's ForwardBatch.init_new reads it; the kit's stand-in lacks it
        runner.attn_dcp_size = 1
    # 0.5.16-0.5.17's stand-in lacks what the manager's init passes along (read only with ngram
    # embedding on, off here): the pool's size is the running-request bound ModelRunner gives it.
    if hasattr(runner, "init_ngram_embedding_manager"):  # 0.5.16 on
        if not hasattr(runner, "model"):
            runner.model = None
        if not hasattr(runner, "max_running_requests"):
            runner.max_running_requests = runner.req_to_token_pool.size
        runner.init_ngram_embedding_manager()
    else:  # before 0.5.16 ModelRunner's init copies these onto itself, where init_new reads them
        runner.use_ngram_embedding = config.use_ngram_embedding
        if not hasattr(runner, "model_is_mrope"):
            runner.model_is_mrope = config.model_is_mrope
    if hasattr(runner, "maybe_init_watermark_state"):  # 0.5.22 on
        runner.maybe_init_watermark_state()


def make_schedule_batch(
    *,
    runner: Any,
    req_pool_indices: Any,
    seq_lens: Any,
    gpu_only: bool,
    out_cache_loc: Any,
    device: str,
    idle: bool = False,
) -> Any:
    """A real EAGLE ScheduleBatch over ``runner``'s pools: ``seq_lens`` (host tensor) with its CPU
    mirrors unless ``gpu_only``, mode DECODE, or IDLE for a rank with no requests."""
    import torch
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs = int(seq_lens.shape[0])
    return ScheduleBatch(
        reqs=[],
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        model_config=runner.model_config,
        device=device,
        forward_mode=ForwardMode.IDLE if idle else ForwardMode.DECODE,
        req_pool_indices=req_pool_indices.to(device=device, dtype=torch.int64),
        seq_lens=seq_lens.to(device),
        seq_lens_cpu=None if gpu_only else seq_lens.clone(),
        seq_lens_sum=None if gpu_only else int(seq_lens.sum()),
        out_cache_loc=out_cache_loc,
        multimodal_inputs=[None] * bs,
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
    )


def glue_inputs(*, batch: Any, runner: Any, scenario: Any, device: str) -> GlueInputs:
    """A real ScheduleBatch holding the pre-step state: the kit's slot layout and write slots,
    ``seq_lens`` = prefix (the glue bumps it), CPU mirrors unless gpu_only."""
    import torch

    prefix = torch.tensor(scenario.prefix_lens, dtype=torch.int64)
    _configure_draft_runner(runner)
    schedule_batch = make_schedule_batch(
        runner=runner,
        req_pool_indices=batch.req_pool_indices,
        seq_lens=prefix,
        gpu_only=scenario.gpu_only,
        out_cache_loc=batch.out_cache_loc,
        device=device,
    )
    ndt = scenario.spec.num_draft_tokens
    return GlueInputs(
        schedule_batch=schedule_batch,
        predict=batch.input_ids.to(torch.int64) % _VOCAB,
        num_accept_tokens=torch.full((len(scenario.prefix_lens),), ndt, dtype=torch.int32, device=device),
    )


def run_glue(*, case: Any, backend: Any, graph_runner: Any) -> Any:
    """The production spec-v2 draft-extend glue on the pre-step state: decides the CPU mirrors as
    the scheduler does (gpu_only: the draft-extend slot unset), bumps ``seq_lens`` and, unless a
    graph runner takes the batch, runs the backend's eager metadata init. Returns its ForwardBatch."""
    glue, ndt = case.glue, case.scenario.spec.num_draft_tokens
    if case.scenario.gpu_only and _kit("attention").decide_needs_cpu_seq_lens([backend, None]):
        raise Unavailable("the scheduler keeps CPU seq_lens for this backend set: not a gpu_only batch")
    return _kit("attention").prepare_for_draft_extend(
        num_accept_tokens=glue.num_accept_tokens,
        batch=glue.schedule_batch,
        predict=glue.predict,
        num_draft_tokens=ndt,
        runner=case.runner,
        graph_runner=graph_runner,
    )
