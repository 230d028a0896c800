"""The multi-step EAGLE draft's attention, eager and through CUDA graphs, as the engine's
``EAGLEDraftCudaGraphRunner`` drives a multi-step draft backend.

One draft forward runs ``num_steps - 1`` decode steps (``eagle_worker_v2.draft_forward``): step
``i`` queries one row per branch (``bs * topk`` rows), writes the branch's new draft token at
``out_cache_loc`` step ``i`` and attends with ``draft_backend.attn_backends[i]``. The metadata of
all steps is built once, before the steps (``init_forward_metadata*``).

Graphs are captured at fixed batch sizes over static inputs, all steps in one graph; a replay
with ``raw_bs`` requests pads up to the smallest captured size as upstream: padded rows get
``seq_lens = fill`` (1), request pool index 0 (the all-zeros row), write slot 0 and position 0.
FlashInfer's rules hold: wrappers are created at capture with reserved buffers and planned
before the graph is captured; nothing plans inside a graph. Without CUDA the same capture and
replay metadata code runs on the same static buffers, then the steps run eagerly.

``on_metadata(draft_backend, forward_batch, phase)`` is called after every metadata init
(phase ``"eager"``, ``"capture"`` or ``"replay"``).
"""

from __future__ import annotations

import bisect
from typing import Callable, Optional, Sequence

import torch

from sglfix.backends.srt.layers.radix_attention import AttentionLayer
from sglfix.backends.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import alloc_static
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput
from sglfix.backends.srt.speculative.eagle_worker_v2 import draft_forward

MetadataHook = Callable[[object, ForwardBatch, str], None]


def run_draft_eager(
    draft_backend,
    forward_batch: ForwardBatch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    layer: AttentionLayer,
    on_metadata: Optional[MetadataHook] = None,
) -> list[torch.Tensor]:
    """The non-graph path: metadata for every step, hook, then the steps."""
    draft_backend.init_forward_metadata(forward_batch)
    if on_metadata is not None:
        on_metadata(draft_backend, forward_batch, "eager")
    return draft_forward(draft_backend, forward_batch, q, k, v, layer)


class EAGLEDraftCudaGraphRunner:
    """Captures the draft's attention steps at several batch sizes and replays them with padding.

    ``use_cuda_graph`` defaults to True on CUDA devices; when False (always on CPU) capture and
    replay run the same metadata code on the static buffers and the steps eagerly.
    """

    def __init__(
        self,
        *,
        draft_backend,
        capture_bs: Sequence[int],
        layer: AttentionLayer,
        req_to_token_pool,
        token_to_kv_pool,
        on_metadata: Optional[MetadataHook] = None,
        use_cuda_graph: Optional[bool] = None,
        capture: bool = True,
    ):
        self.draft_backend = draft_backend
        self.capture_bs = sorted(set(int(b) for b in capture_bs))
        self.layer = layer
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.on_metadata = on_metadata
        self.device = token_to_kv_pool.device
        if use_cuda_graph is None:
            use_cuda_graph = self.device.type == "cuda"
        self.use_cuda_graph = use_cuda_graph
        self.topk = draft_backend.topk
        self.speculative_num_steps = draft_backend.speculative_num_steps

        # Attention backend
        self.num_tokens_per_bs = self.topk
        self.max_bs = self.capture_bs[-1]
        if self.max_bs + 1 > req_to_token_pool.size:
            raise ValueError("capture batch size exceeds the request pool")
        self.max_num_token = self.max_bs * self.num_tokens_per_bs

        draft_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)
        self.seq_len_fill_value = draft_backend.attn_backends[0].get_cuda_graph_seq_len_fill_value()

        # Graph inputs, registered with the backend's buffers (one guard check).
        reg = draft_backend.static_buffers
        dev = self.device
        steps = self.speculative_num_steps - 1
        self.req_pool_indices = alloc_static(
            (self.max_bs,), dtype=torch.int64, device=dev, name="draft_runner.req_pool_indices", registry=reg
        )
        self.seq_lens = alloc_static(
            (self.max_bs,), dtype=torch.int32, device=dev, name="draft_runner.seq_lens",
            registry=reg, fill=self.seq_len_fill_value,
        )
        self.seq_lens_cpu = torch.full((self.max_bs,), self.seq_len_fill_value, dtype=torch.int32)
        # The kernel's kv_indptr comes from positions. At capture they match the fill seq_lens
        # (upstream: zeros), so the capture-time plan's kv_indptr agrees with its kv lengths:
        # FlashInfer >= 0.7 refuses a CSR plan whose page counts disagree with kv_len_arr.
        # Replay pads them with 0, as upstream (replays re-plan from the host only).
        self.positions = alloc_static(
            (self.max_num_token,), dtype=torch.int64, device=dev, name="draft_runner.positions",
            registry=reg, fill=self.seq_len_fill_value,
        )
        self.out_cache_loc = alloc_static(
            (self.max_num_token * self.speculative_num_steps,), dtype=torch.int64, device=dev,
            name="draft_runner.out_cache_loc", registry=reg,
        )
        dtype = token_to_kv_pool.dtype
        self.q = alloc_static(
            (steps, self.max_num_token, layer.tp_q_head_num, layer.head_dim), dtype=dtype, device=dev,
            name="draft_runner.q", registry=reg,
        )
        self.k = alloc_static(
            (steps, self.max_num_token, layer.tp_k_head_num, layer.head_dim), dtype=dtype, device=dev,
            name="draft_runner.k", registry=reg,
        )
        # MLA writes the latent from k alone; GQA needs v.
        self.v = None
        if not isinstance(token_to_kv_pool, MLATokenToKVPool):
            self.v = alloc_static(
                (steps, self.max_num_token, layer.tp_v_head_num, layer.v_head_dim), dtype=dtype, device=dev,
                name="draft_runner.v", registry=reg,
            )

        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: dict[int, list[torch.Tensor]] = {}
        self.captured_metadata: dict[int, list[object]] = {}
        self.static_forward_batches: dict[int, ForwardBatch] = {}
        self.graph_memory_pool = None
        if capture:
            self.capture()

    # --------------------------------------------------------------- helpers

    def _static_forward_batch(self, bs: int, **tags) -> ForwardBatch:
        num_tokens = bs * self.num_tokens_per_bs
        seq_lens_cpu = self.seq_lens_cpu[:bs].clone()
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[: num_tokens * self.speculative_num_steps],
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=int(seq_lens_cpu.sum()),
            positions=self.positions[:num_tokens],
            spec_info=EagleDraftInput(topk=self.topk, num_steps=self.speculative_num_steps),
            tags=dict(tags),
        )

    def _run_steps(self, forward_batch: ForwardBatch, bs: int) -> list[torch.Tensor]:
        num_tokens = bs * self.num_tokens_per_bs
        return draft_forward(
            self.draft_backend,
            forward_batch,
            self.q[:, :num_tokens],
            self.k[:, :num_tokens],
            self.v[:, :num_tokens] if self.v is not None else None,
            self.layer,
        )

    # --------------------------------------------------------------- capture

    def capture(self) -> None:
        stream = torch.cuda.Stream() if self.use_cuda_graph else None
        # Largest first, as upstream, so smaller graphs reuse the memory pool.
        for bs in reversed(self.capture_bs):
            forward_batch = self._static_forward_batch(bs, phase="capture", graph_bs=bs)
            self.draft_backend.init_forward_metadata_capture_cuda_graph(forward_batch)
            if self.on_metadata is not None:
                self.on_metadata(self.draft_backend, forward_batch, "capture")
            self.captured_metadata[bs] = [b.forward_metadata for b in self.draft_backend.attn_backends]
            self.static_forward_batches[bs] = forward_batch

            if self.use_cuda_graph:
                # Warm up outside the graph: Triton compiles and FlashInfer loads on first use.
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self._run_steps(forward_batch, bs)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.graph_memory_pool, stream=stream):
                    outs = self._run_steps(forward_batch, bs)
                self.graph_memory_pool = graph.pool()
                self.graphs[bs] = graph
                self.output_buffers[bs] = outs
        if self.use_cuda_graph:
            torch.cuda.synchronize()

    # ---------------------------------------------------------------- replay

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_decode() and 0 < forward_batch.batch_size <= self.max_bs

    def padded_bs(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def replay(
        self,
        forward_batch: ForwardBatch,
        *,
        q: torch.Tensor,
        k: torch.Tensor,
        v: Optional[torch.Tensor] = None,
    ) -> list[torch.Tensor]:
        """Run the draft steps of ``forward_batch`` through the graph captured for the smallest
        ``bs >= raw_bs``; returns one output per step, raw rows only."""
        if not self.can_run(forward_batch):
            raise ValueError(
                f"cannot replay {forward_batch.forward_mode.name} bs={forward_batch.batch_size} "
                f"on draft graphs of bs={self.capture_bs}"
            )
        raw_bs = forward_batch.batch_size
        raw_num_token = raw_bs * self.num_tokens_per_bs
        bs = self.padded_bs(raw_bs)

        # Pad
        if bs != raw_bs:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
            self.positions.zero_()
            self.req_pool_indices.zero_()

        # Common inputs
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[: raw_num_token * self.speculative_num_steps].copy_(forward_batch.out_cache_loc)
        self.positions[:raw_num_token].copy_(forward_batch.positions)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.q[:, :raw_num_token].copy_(q.reshape(self.q.shape[0], raw_num_token, *self.q.shape[2:]))
        self.k[:, :raw_num_token].copy_(k.reshape(self.k.shape[0], raw_num_token, *self.k.shape[2:]))
        if self.v is not None:
            self.v[:, :raw_num_token].copy_(v.reshape(self.v.shape[0], raw_num_token, *self.v.shape[2:]))

        # The static batch of this size, with the host mirrors of the padded batch.
        static = self.static_forward_batches[bs]
        seq_lens_sum = forward_batch.seq_lens_sum
        if seq_lens_sum is not None:
            seq_lens_sum = seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is not None:
            self.seq_lens_cpu.fill_(self.seq_len_fill_value)
            self.seq_lens_cpu[:raw_bs].copy_(seq_lens_cpu)
            seq_lens_cpu = self.seq_lens_cpu[:bs].clone()
        static.seq_lens_sum = seq_lens_sum
        static.seq_lens_cpu = seq_lens_cpu
        static.tags = dict(phase="replay", graph_bs=bs, raw_bs=raw_bs, raw_num_token=raw_num_token)

        # Each step's graph reads the metadata captured for bs; replay refreshes it in place.
        for backend, metadata in zip(self.draft_backend.attn_backends, self.captured_metadata[bs]):
            backend.forward_metadata = metadata
        self.draft_backend.init_forward_metadata_replay_cuda_graph(static, bs)
        if self.on_metadata is not None:
            self.on_metadata(self.draft_backend, static, "replay")

        if self.use_cuda_graph:
            self.graphs[bs].replay()
            outs = self.output_buffers[bs]
        else:
            outs = self._run_steps(static, bs)
        return [o[:raw_num_token].clone() for o in outs]


def make_draft_runner_for_case(case, *, draft_backend, capture_bs: Sequence[int], **kwargs) -> EAGLEDraftCudaGraphRunner:
    """An EAGLEDraftCudaGraphRunner wired to a draft-decode kit case's pools and layer."""
    return EAGLEDraftCudaGraphRunner(
        draft_backend=draft_backend,
        capture_bs=capture_bs,
        layer=case.layer,
        req_to_token_pool=case.model_runner.req_to_token_pool,
        token_to_kv_pool=case.model_runner.token_to_kv_pool,
        **kwargs,
    )
