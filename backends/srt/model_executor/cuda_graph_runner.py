"""Eager forward and CUDA-graph capture/replay of the attention layer, as the
engine's model runner and (EAGLE) CUDA-graph runners drive a backend.

CUDA graphs are captured at fixed batch sizes over static input buffers; a
replay with ``raw_bs`` requests pads up to the smallest captured ``bs``: padded
rows get ``seq_lens = backend.get_cuda_graph_seq_len_fill_value()``, request
pool index 0 (the reserved all-zeros row) and write slot 0 (the reserved page),
and, for draft extend, ``extend_seq_lens = num_tokens_per_bs`` / accept length 0.

Without CUDA the runner executes the same code on the same static buffers:
capture runs the capture-time metadata init, replay runs the replay-time
metadata init and then the attention forward eagerly with the metadata object
captured for that ``bs`` (whose tensors are the static buffers the replay just
refreshed), which is what a graph replay reads.

``on_metadata(backend, forward_batch, phase)`` is called after every metadata
init (phase ``"eager"``, ``"capture"`` or ``"replay"``) so a caller can check
invariants on ``backend.forward_metadata`` while it is live.
"""

from __future__ import annotations

import bisect
from typing import Callable, Optional, Sequence

import torch

from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import alloc_static
from sglfix.backends.srt.layers.radix_attention import AttentionLayer
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

MetadataHook = Callable[[object, ForwardBatch, str], None]


def run_eager(
    *,
    backend,
    forward_batch: ForwardBatch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: AttentionLayer,
    on_metadata: Optional[MetadataHook] = None,
) -> torch.Tensor:
    """The non-graph path: metadata init, hook, then the attention forward."""
    backend.init_forward_metadata(forward_batch)
    if on_metadata is not None:
        on_metadata(backend, forward_batch, "eager")
    return backend.forward(q, k, v, layer, forward_batch)


class CudaGraphRunner:
    """Captures the attention forward of one mode at several batch sizes and
    replays it with padding.

    ``use_cuda_graph`` defaults to True on CUDA devices; when False (always on
    CPU) capture and replay run eagerly on the static buffers.
    """

    def __init__(
        self,
        *,
        backend,
        forward_mode: ForwardMode,
        capture_bs: Sequence[int],
        layer: AttentionLayer,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: MHATokenToKVPool,
        num_tokens_per_bs: int,
        num_draft_tokens: int = 2,
        num_steps: int = 1,
        topk: int = 1,
        on_metadata: Optional[MetadataHook] = None,
        use_cuda_graph: Optional[bool] = None,
        capture: bool = True,
    ):
        if not forward_mode.is_cuda_graph() or forward_mode.is_idle():
            raise ValueError(f"{forward_mode.name} is not captured in CUDA graphs")
        self.backend = backend
        self.forward_mode = forward_mode
        self.capture_bs = sorted(set(int(b) for b in capture_bs))
        self.layer = layer
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.num_tokens_per_bs = num_tokens_per_bs
        self.num_draft_tokens = num_draft_tokens
        self.num_steps = num_steps
        self.topk = topk
        self.on_metadata = on_metadata
        self.device = token_to_kv_pool.device
        if use_cuda_graph is None:
            use_cuda_graph = self.device.type == "cuda"
        self.use_cuda_graph = use_cuda_graph
        self.max_bs = self.capture_bs[-1]
        if self.max_bs + 1 > req_to_token_pool.size:
            raise ValueError("capture batch size exceeds the request pool")
        self.max_num_tokens = self.max_bs * num_tokens_per_bs
        self.seq_len_fill_value = backend.get_cuda_graph_seq_len_fill_value()

        backend.init_cuda_graph_state(self.max_bs, self.max_num_tokens)

        # Static inputs, registered with the backend's buffers (one guard check).
        reg = backend.static_buffers
        dev = self.device
        self.req_pool_indices = alloc_static(
            (self.max_bs,), dtype=torch.int64, device=dev, name="runner.req_pool_indices", registry=reg
        )
        self.seq_lens = alloc_static(
            (self.max_bs,), dtype=torch.int32, device=dev, name="runner.seq_lens",
            registry=reg, fill=self.seq_len_fill_value,
        )
        self.extend_seq_lens = alloc_static(
            (self.max_bs,), dtype=torch.int32, device=dev, name="runner.extend_seq_lens",
            registry=reg, fill=num_tokens_per_bs,
        )
        self.accept_length = alloc_static(
            (self.max_bs,), dtype=torch.int32, device=dev, name="runner.accept_length",
            registry=reg, fill=max(num_tokens_per_bs - 1, 0),
        )
        self.out_cache_loc = alloc_static(
            (self.max_num_tokens,), dtype=torch.int64, device=dev, name="runner.out_cache_loc", registry=reg
        )
        self.positions = alloc_static(
            (self.max_num_tokens,), dtype=torch.int64, device=dev, name="runner.positions", registry=reg
        )
        dtype = token_to_kv_pool.dtype
        self.q = alloc_static(
            (self.max_num_tokens, layer.tp_q_head_num, layer.head_dim), dtype=dtype, device=dev,
            name="runner.q", registry=reg,
        )
        self.k = alloc_static(
            (self.max_num_tokens, layer.tp_k_head_num, layer.head_dim), dtype=dtype, device=dev,
            name="runner.k", registry=reg,
        )
        self.v = alloc_static(
            (self.max_num_tokens, layer.tp_v_head_num, layer.v_head_dim), dtype=dtype, device=dev,
            name="runner.v", registry=reg,
        )

        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.output_buffers: dict[int, torch.Tensor] = {}
        self.captured_metadata: dict[int, object] = {}
        self.static_forward_batches: dict[int, ForwardBatch] = {}
        self.graph_memory_pool = None
        if capture:
            self.capture()

    # --------------------------------------------------------------- helpers

    def _spec_info(self, bs: int, custom_mask: Optional[torch.Tensor] = None):
        mode = self.forward_mode
        if mode.is_target_verify():
            return EagleVerifyInput(
                topk=self.topk,
                num_steps=self.num_steps,
                num_draft_tokens=self.num_draft_tokens,
                custom_mask=custom_mask,
            )
        if mode.is_draft_extend_v2():
            return EagleDraftInput(
                topk=self.topk,
                num_steps=self.num_steps,
                num_draft_tokens=self.num_draft_tokens,
                # Read by backends whose v2 replay uses accept lengths (trtllm MLA before PR 21987).
                accept_length=self.accept_length[:bs],
                extend_seq_lens_tensor=self.extend_seq_lens[:bs],
            )
        if mode.is_draft_extend():
            return EagleDraftInput(
                topk=self.topk,
                num_steps=self.num_steps,
                num_draft_tokens=self.num_draft_tokens,
                accept_length=self.accept_length[:bs],
            )
        return None

    def _static_forward_batch(self, bs: int, spec_info, **tags) -> ForwardBatch:
        num_tokens = bs * self.num_tokens_per_bs
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=bs,
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:num_tokens],
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            positions=self.positions[:num_tokens],
            extend_seq_lens=self.extend_seq_lens[:bs],
            spec_info=spec_info,
            tags=dict(tags),
        )

    def _forward(self, forward_batch: ForwardBatch, bs: int) -> torch.Tensor:
        num_tokens = bs * self.num_tokens_per_bs
        return self.backend.forward(
            self.q[:num_tokens],
            self.k[:num_tokens],
            self.v[:num_tokens],
            self.layer,
            forward_batch,
        )

    # --------------------------------------------------------------- capture

    def capture(self) -> None:
        stream = torch.cuda.Stream() if self.use_cuda_graph else None
        # Largest first, as upstream, so smaller graphs reuse the memory pool.
        for bs in reversed(self.capture_bs):
            num_tokens = bs * self.num_tokens_per_bs
            spec_info = self._spec_info(bs, custom_mask=None)
            if self.forward_mode.is_target_verify():
                spec_info.custom_mask = self.backend.cuda_graph_custom_mask
            forward_batch = self._static_forward_batch(bs, spec_info, phase="capture", graph_bs=bs)
            self.backend.init_forward_metadata_capture_cuda_graph(
                bs,
                num_tokens,
                self.req_pool_indices,
                self.seq_lens,
                None,
                self.forward_mode,
                spec_info,
            )
            if self.on_metadata is not None:
                self.on_metadata(self.backend, forward_batch, "capture")
            self.captured_metadata[bs] = self.backend.forward_metadata
            self.static_forward_batches[bs] = forward_batch

            if self.use_cuda_graph:
                # Warm up outside the graph: Triton compiles on first launch.
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self._forward(forward_batch, bs)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.graph_memory_pool, stream=stream):
                    out = self._forward(forward_batch, bs)
                self.graph_memory_pool = graph.pool()
                self.graphs[bs] = graph
                self.output_buffers[bs] = out
        if self.use_cuda_graph:
            torch.cuda.synchronize()

    # ---------------------------------------------------------------- replay

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return (
            forward_batch.forward_mode == self.forward_mode
            and 0 < forward_batch.batch_size <= self.max_bs
        )

    def padded_bs(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def replay(
        self,
        forward_batch: ForwardBatch,
        *,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> torch.Tensor:
        """Run ``forward_batch`` through the graph captured for the smallest
        ``bs >= raw_bs``; returns the output rows of the raw tokens only."""
        if not self.can_run(forward_batch):
            raise ValueError(
                f"cannot replay {forward_batch.forward_mode.name} bs={forward_batch.batch_size} "
                f"on graphs of {self.forward_mode.name} bs={self.capture_bs}"
            )
        raw_bs = forward_batch.batch_size
        raw_num_token = q.shape[0]
        bs = self.padded_bs(raw_bs)
        num_tokens = bs * self.num_tokens_per_bs
        if raw_num_token > num_tokens:
            raise ValueError(f"{raw_num_token} tokens do not fit graph bs={bs} ({num_tokens} tokens)")

        if bs != raw_bs or raw_num_token != num_tokens:
            self.seq_lens.fill_(self.seq_len_fill_value)
            self.out_cache_loc.zero_()
            self.positions.zero_()
            self.req_pool_indices.zero_()
            self.extend_seq_lens.fill_(self.num_tokens_per_bs)
            self.accept_length.zero_()

        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:raw_num_token].copy_(forward_batch.out_cache_loc)
        if forward_batch.positions is not None:
            self.positions[:raw_num_token].copy_(forward_batch.positions)
        if self.forward_mode.is_draft_extend_v2():
            if forward_batch.extend_seq_lens is not None:
                self.extend_seq_lens[:raw_bs].copy_(forward_batch.extend_seq_lens)
            else:
                self.extend_seq_lens[:raw_bs].fill_(self.num_tokens_per_bs)
        if self.forward_mode.is_draft_extend() and not self.forward_mode.is_draft_extend_v2():
            self.accept_length[:raw_bs].copy_(forward_batch.spec_info.accept_length)
        elif (
            self.forward_mode.is_draft_extend_v2()
            and getattr(forward_batch.spec_info, "accept_length", None) is not None
        ):
            self.accept_length[:raw_bs].copy_(forward_batch.spec_info.accept_length)
        self.q[:raw_num_token].copy_(q.reshape(raw_num_token, *self.q.shape[1:]))
        self.k[:raw_num_token].copy_(k.reshape(raw_num_token, *self.k.shape[1:]))
        self.v[:raw_num_token].copy_(v.reshape(raw_num_token, *self.v.shape[1:]))

        if self.forward_mode.is_target_verify():
            spec_info = forward_batch.spec_info
        else:
            spec_info = self._spec_info(bs)
            accept_length_cpu = getattr(forward_batch.spec_info, "accept_length_cpu", None)
            if self.forward_mode.is_draft_extend(include_v2=True) and accept_length_cpu is not None:
                # The host mirror of accept_length, padded rows accepting nothing (upstream
                # hands the raw list over: max and sum + bs come out the same).
                spec_info.accept_length_cpu = list(accept_length_cpu) + [0] * (bs - raw_bs)

        seq_lens_sum = forward_batch.seq_lens_sum
        if seq_lens_sum is not None:
            seq_lens_sum = seq_lens_sum + (bs - raw_bs) * self.seq_len_fill_value
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is not None and bs != raw_bs:
            seq_lens_cpu = torch.cat(
                [seq_lens_cpu, seq_lens_cpu.new_full((bs - raw_bs,), self.seq_len_fill_value)]
            )

        # The graph for bs reads the metadata captured for bs; replay refreshes
        # its static tensors in place.
        self.backend.forward_metadata = self.captured_metadata[bs]
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs,
            self.req_pool_indices,
            self.seq_lens,
            seq_lens_sum,
            None,
            self.forward_mode,
            spec_info,
            seq_lens_cpu,
        )
        if self.on_metadata is not None:
            view = self._static_forward_batch(
                bs, spec_info, phase="replay", graph_bs=bs, raw_bs=raw_bs, raw_num_token=raw_num_token
            )
            view.seq_lens_sum = seq_lens_sum
            view.seq_lens_cpu = seq_lens_cpu
            self.on_metadata(self.backend, view, "replay")

        if self.use_cuda_graph:
            self.graphs[bs].replay()
            out = self.output_buffers[bs]
        else:
            out = self._forward(self.static_forward_batches[bs], bs)
        return out[:raw_num_token].clone()


def make_runner_for_case(case, *, backend, capture_bs: Sequence[int], **kwargs) -> CudaGraphRunner:
    """A CudaGraphRunner wired to a kit case's pools, layer and spec settings."""
    return CudaGraphRunner(
        backend=backend,
        forward_mode=case.mode,
        capture_bs=capture_bs,
        layer=case.layer,
        req_to_token_pool=case.model_runner.req_to_token_pool,
        token_to_kv_pool=case.model_runner.token_to_kv_pool,
        num_tokens_per_bs=case.num_tokens_per_bs,
        num_draft_tokens=case.num_draft_tokens,
        num_steps=case.num_steps,
        topk=case.topk,
        **kwargs,
    )
