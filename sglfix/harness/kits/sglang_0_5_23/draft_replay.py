"""The EAGLE draft CUDA-graph runner's replay, run for real: ``EAGLEDraftCudaGraphRunner.execute``
(``replay`` before 0.5.14) pads a batch of ``raw_bs`` requests to its captured size, hands the
padded batch to the draft backend's ``init_forward_metadata_out_graph`` and replays the graph.

What the runner does to the batch on the way (the padded ``seq_lens``, ``req_pool_indices``,
``positions``, ``out_cache_loc`` and, since PR 26880, ``seq_lens_sum``) is sglang's code and is
what a revert of that code changes, so it runs unchanged here. The runner is built without its
constructor (which captures a model's graphs): its static buffers are made as the constructor makes
them, and its graph replay records the batch the graph would run on instead of launching it; the
cell then runs the step kernels (or records their page tables on the host) on that batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from sglfix.harness.misfit import Standin

__all__ = ["extend_buffers", "replay_draft", "replay_draft_extend"]

# Every static buffer some release's runner reads; None where the feature is off, as the
# constructor leaves them (token oracle, rejection sampling, DSA seeding, DP gather).
_OFF = (
    "rids_int",
    "bootstrap_room_ids_int",
    "draft_probs",
    "sampling_seed",
    "dsa_seed_topk",
    "global_num_tokens_gpu",
    "global_num_tokens_for_logprob_gpu",
)


def _buffers(*, max_bs: int, topk: int, num_steps: int, fill: int, hidden_size: int, dtype: Any, device: str) -> Any:
    max_num_token = max_bs * topk
    with torch.device(device):
        buffers = Standin(
            input_ids=torch.zeros((max_num_token,), dtype=torch.int64),
            req_pool_indices=torch.zeros((max_bs,), dtype=torch.int64),
            out_cache_loc=torch.zeros((max_num_token * num_steps,), dtype=torch.int64),
            positions=torch.zeros((max_num_token,), dtype=torch.int64),
            mrope_positions=torch.zeros((3, max_num_token), dtype=torch.int64),
            seq_lens=torch.full((max_bs,), fill, dtype=torch.int64),
            extend_seq_lens=torch.ones((max_bs,), dtype=torch.int32),
            topk_p=torch.zeros((max_bs, topk), dtype=torch.float32),
            topk_index=torch.zeros((max_bs, topk), dtype=torch.int64),
            hidden_states=torch.zeros((max_bs, hidden_size), dtype=dtype),
            **dict.fromkeys(_OFF),
        )
    buffers.seq_lens_cpu = torch.full((max_bs,), fill, dtype=torch.int64, device="cpu")
    return buffers


def _shell(runner_class: Any, launch: Any, **state: Any) -> tuple[Any, Any]:
    """A ``runner_class`` instance built without its constructor, holding ``state``, whose graph
    launch is ``launch``; and its replay method (``execute``; ``replay`` in 0.5.13)."""
    try:
        from sglang.srt.model_executor.runner import DeepEPCudaGraphRunnerAdapter
    except ImportError:  # before 0.5.14
        from sglang.srt.model_executor.cuda_graph_runner import DeepEPCudaGraphRunnerAdapter

    runner = object.__new__(runner_class)
    runner.__dict__.update(deepep_adapter=DeepEPCudaGraphRunnerAdapter(), **state)
    # The graph launch is the one thing not run: no model is captured here.
    runner._replay_graph = launch  # 0.5.14+
    runner._replay = launch  # 0.5.13
    return runner, getattr(runner, "execute", None) or runner.replay


def replay_draft(backend: Any, batch: Any, *, case: Any, capture_bs: list[int], fill: int) -> Any:
    """Replay ``batch`` through the installed ``EAGLEDraftCudaGraphRunner``'s own replay method with
    ``backend`` as its draft backend (sizes and device from the draft ``case``); return the batch as
    the graph replay saw it (a snapshot: the runner restores the raw fields afterwards)."""
    import copy

    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    topk, num_steps, device = case.topk, case.num_steps, case.device
    buckets = sorted(capture_bs)
    seen: dict[str, Any] = {}

    def record(*args: Any) -> tuple:
        forward_batch = args[-1]
        # The graph's launch re-runs what its capture recorded in-graph, before the steps.
        backend.init_forward_metadata_in_graph(forward_batch)
        seen["batch"] = SimpleNamespace(**vars(forward_batch))
        runner.output_buffers = {forward_batch.batch_size: ()}
        return ()

    runner, replay = _shell(
        EAGLEDraftCudaGraphRunner,
        record,
        buffers=_buffers(
            max_bs=buckets[-1],
            topk=topk,
            num_steps=num_steps,
            fill=fill,
            hidden_size=case.hidden_size,
            dtype=case.dtype,
            device=device,
        ),
        capture_bs=buckets,
        captured_req_width=topk,  # 0.5.17+
        num_tokens_per_bs=topk,  # before 0.5.17
        speculative_num_steps=num_steps,
        topk=topk,
        seq_len_fill_value=fill,
        require_mlp_tp_gather=False,
        require_gathered_buffer=False,
        draft_attn_backend=backend,
        model_runner=Standin(
            model_config=Standin(vocab_size=1 << 20, model_is_mrope=False),
            server_args=Standin(speculative_use_rejection_sampling=False),
            device_timer=None,
        ),
    )
    # The cell runs the step kernels itself; the launch's outputs (three or four tensors, by
    # release) are nobody's, so they are not cut back either.
    runner._postprocess_output_to_raw_bs = lambda out, raw_bs: out
    replay(copy.copy(batch))
    return seen["batch"]


def replay_draft_extend(
    recorder: Any,
    batch: Any,
    *,
    capture_bs: list[int],
    width: int,
    fill: int,
    device: str,
    buffers: Any = None,
    launch: Any = None,
) -> Any:
    """Replay a spec-v2 draft-extend ``batch`` (``width`` tokens per request) through the installed
    ``EAGLEDraftExtendCudaGraphRunner``'s own replay method, ``recorder`` as its draft-extend
    backend (a stand-in that keeps the batch view it is handed, or a real backend whose captured
    metadata the replay refreshes); return the runner.

    Built like ``replay_draft``'s runner: static buffers as the constructor makes them (no hidden
    states, no DP gather, no mamba tracks) unless ``buffers`` gives the runner's own (a graph
    runner's, whose slices its capture bound), and the graph launch replaced by ``launch`` (called
    with the replayed batch) before empty outputs are returned."""
    import inspect

    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    buckets = sorted(capture_bs)
    max_bs = buckets[-1]
    if buffers is None:
        buffers = extend_buffers(max_bs=max_bs, width=width, fill=fill, device=device)

    def graph_launch(*args: Any) -> Any:
        if launch is not None:
            launch(args[-1])  # the replayed batch, as the captured graph would run on it
        bs = max_bs  # an output of the largest bucket covers any replayed size's rows
        out = Standin(
            next_token_logits=torch.zeros((bs * width, 1), device=device),
            hidden_states=torch.zeros((bs * width, 1), device=device),
            topk_p=None,
            topk_index=None,
        )
        # Releases that read the output back by the replayed size (the replay sets it first).
        runner.output_buffers = {getattr(runner, "bs", bs): out}
        return out

    runner, replay = _shell(
        EAGLEDraftExtendCudaGraphRunner,
        graph_launch,
        buffers=buffers,
        device=device,
        device_module=torch.get_device_module(device),
        forward_mode=batch.forward_mode,
        capture_bs=buckets,
        max_bs=max_bs,
        captured_req_width=width,  # 0.5.17+
        num_tokens_per_bs=width,  # before 0.5.17
        seq_len_fill_value=fill,
        extend_seq_lens_cpu=[width] * max_bs,
        require_mlp_tp_gather=False,
        require_gathered_buffer=False,
        draft_extend_attn_backend=recorder,
        model_runner=Standin(
            model_config=Standin(vocab_size=1 << 20, model_is_mrope=False),
            device_timer=None,
            shared_read_done_event=None,
        ),
    )
    runner._publish_read_done = lambda **_: None
    if "select_index" in inspect.signature(replay).parameters:  # later releases
        replay(batch, torch.arange(batch.batch_size, dtype=torch.int64, device=device) * width)
    else:
        replay(batch)
    return runner


def extend_buffers(*, max_bs: int, width: int, fill: int, device: str, **own: Any) -> Any:
    """The draft-extend runner's static buffers, as its constructor makes them; ``own`` gives
    some of them instead (a graph runner's, whose slices its capture bound)."""
    max_num_token = max_bs * width
    with torch.device(device):
        buffers = Standin(
            input_ids=torch.zeros((max_num_token,), dtype=torch.int64),
            req_pool_indices=torch.zeros((max_bs,), dtype=torch.int64),
            mamba_track_indices=None,
            out_cache_loc=torch.zeros((max_num_token,), dtype=torch.int64),
            positions=torch.zeros((max_num_token,), dtype=torch.int64),
            mrope_positions=torch.zeros((3, max_num_token), dtype=torch.int64),
            hidden_states=None,
            seq_lens=torch.full((max_bs,), fill, dtype=torch.int64),
            extend_seq_lens=torch.full((max_bs,), width, dtype=torch.int32),
            num_correct_drafts=torch.full((max_bs,), width, dtype=torch.int32),
            num_accept_tokens=torch.full((max_bs,), width, dtype=torch.int32),
            select_index=torch.arange(max_bs, dtype=torch.int64) * width,
            global_num_tokens_gpu=None,
            global_num_tokens_for_logprob_gpu=None,
            dsa_seed_topk_capture=None,
        )
    buffers.seq_lens_cpu = torch.full((max_bs,), fill, dtype=torch.int64, device="cpu")
    for name, value in own.items():
        setattr(buffers, name, value)
    return buffers
