"""The FlashInfer MLA attention backend, decode path: plain decode (eager and CUDA graphs) and
the multi-step EAGLE draft (``FlashInferMLAMultiStepDraftBackend``: one child backend per draft
step, page tables from ``generate_draft_decode_kv_indices``).

Mirrors the engine's ``flashinfer_mla_backend`` at v0.5.12 (names, branches, the graph-replay
host re-plan ``fast_mla_decode_plan``); the kernels come from ``paged_wrappers`` (FlashInfer's
``BatchMLAPagedAttentionWrapper`` on CUDA, a torch stand-in elsewhere). Queries are absorbed:
q is [T, H, kv_lora_rank + qk_rope_head_dim], the output [T, H, kv_lora_rank].

Reproduction changes to upstream, each marked where it sits: the draft backend accepts
topk > 1 (upstream refused it), and its children plan one sequence per draft branch.
PR 27460's fix (row sizing with the topk factor, and the row-width assertion) sits on its own
lines so that ``toggles/27460.yaml`` can revert it.

Static buffers (everything a captured graph reads) are allocated through ``alloc_static`` and
registered in ``static_buffers``, with guard zones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch
import triton

from sglfix.backends.kernels.ops.attention.kv_indices import create_flashinfer_kv_indices_triton
from sglfix.backends.kernels.ops.attention.paged_wrappers import make_mla_paged_wrapper, make_workspace_buffer, on_device
from sglfix.backends.kernels.ops.speculative import generate_draft_decode_kv_indices
from sglfix.backends.srt.layers.attention.flashinfer_backend import PageTable
from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import StaticBuffer, alloc_static
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput

next_power_of_2 = triton.next_power_of_2


@dataclass
class DecodeMetadata:
    decode_wrapper: object


# Reuse this workspace buffer across all flashinfer wrappers
global_workspace_buffer = None


def _workspace(device: torch.device) -> torch.Tensor:
    global global_workspace_buffer
    if global_workspace_buffer is None or not on_device(global_workspace_buffer, device):
        global_workspace_buffer = make_workspace_buffer(device)
    return global_workspace_buffer


class FlashInferMLAAttnBackend:
    """Flashinfer attention kernels (MLA, decode)."""

    def __init__(
        self,
        model_runner: ModelRunner,
        skip_prefill: bool = False,
        kv_indptr_buf: Optional[torch.Tensor] = None,
        q_indptr_decode_buf: Optional[torch.Tensor] = None,
        speculative_step_id: int = 0,
    ):
        # Parse constants
        self.max_context_len = model_runner.context_len or model_runner.req_to_token_pool.max_context_len
        self.device = torch.device(model_runner.device)
        self.skip_prefill = skip_prefill
        self.page_size = model_runner.page_size
        # Which draft step this backend serves (its kv lengths include step + 1 draft tokens).
        self.speculative_step_id = speculative_step_id

        self.workspace_buffer = _workspace(self.device)

        # Every buffer a captured graph may read, with guard zones.
        self.static_buffers: list[StaticBuffer] = []
        max_bs = model_runner.req_to_token_pool.size
        if kv_indptr_buf is None:
            self.kv_indptr = alloc_static(
                (max_bs + 1,), dtype=torch.int32, device=self.device,
                name="kv_indptr", registry=self.static_buffers,
            )
        else:
            self.kv_indptr = kv_indptr_buf

        if q_indptr_decode_buf is None:
            self.q_indptr_decode = alloc_static(
                (max_bs + 1,), dtype=torch.int32, device=self.device,
                name="q_indptr_decode", registry=self.static_buffers,
            )
            self.q_indptr_decode.copy_(torch.arange(0, max_bs + 1, dtype=torch.int32))
        else:
            self.q_indptr_decode = q_indptr_decode_buf

        self.decode_wrapper = make_mla_paged_wrapper(self.workspace_buffer, backend="auto")

        self.indices_updater_decode = FlashInferMLAIndicesUpdaterDecode(model_runner, self)

        # Other metadata
        self.forward_metadata: Optional[DecodeMetadata] = None
        self.page_table: Optional[PageTable] = None
        self.decode_cuda_graph_metadata = {}

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        if forward_batch.forward_mode.is_decode_or_idle():
            self.indices_updater_decode.update(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.seq_lens_sum,
                decode_wrapper=self.decode_wrapper,
                init_metadata_replay=False,
                # Reproduction: upstream left spec_info out here, so an eager draft step read the
                # prefix only; the draft's page table is what its children must plan.
                spec_info=forward_batch.spec_info,
            )
            self.forward_metadata = DecodeMetadata(self.decode_wrapper)
        else:
            raise NotImplementedError(f"{forward_batch.forward_mode.name}: only the decode path is reproduced")

    def init_cuda_graph_state(
        self,
        max_bs: int,
        max_num_tokens: int,
        kv_indices_buf: Optional[torch.Tensor] = None,
    ):
        reg = self.static_buffers
        if kv_indices_buf is None:
            cuda_graph_kv_indices = alloc_static(
                (max_bs * self.max_context_len,), dtype=torch.int32, device=self.device,
                name="cuda_graph_kv_indices", registry=reg,
            )
        else:
            cuda_graph_kv_indices = kv_indices_buf

        self.cuda_graph_kv_indices = cuda_graph_kv_indices
        self.cuda_graph_qo_indptr = alloc_static(
            tuple(self.q_indptr_decode.shape), dtype=torch.int32, device=self.device,
            name="cuda_graph_qo_indptr", registry=reg,
        )
        self.cuda_graph_qo_indptr.copy_(self.q_indptr_decode)
        self.cuda_graph_kv_indptr = alloc_static(
            tuple(self.kv_indptr.shape), dtype=torch.int32, device=self.device,
            name="cuda_graph_kv_indptr", registry=reg,
        )
        self.cuda_graph_kv_indptr.copy_(self.kv_indptr)
        # Reproduction: one kv length per planned sequence. A draft plans max_bs * topk branch
        # sequences (max_num_tokens); upstream's (max_bs,) only held topk = 1.
        self.cuda_graph_kv_lens = alloc_static(
            (max(max_bs, max_num_tokens),), dtype=torch.int32, device=self.device,
            name="cuda_graph_kv_lens", registry=reg, fill=1,
        )

        # For fast decode plan in graph replaying
        self.cuda_graph_qo_indptr_cpu = self.cuda_graph_qo_indptr.to("cpu")
        self.cuda_graph_kv_indptr_cpu = self.cuda_graph_kv_indptr.to("cpu")
        self.fast_decode_kwargs = {
            "qo_indptr_cpu": self.cuda_graph_qo_indptr_cpu,
            "kv_indptr_cpu": self.cuda_graph_kv_indptr_cpu,
            "kv_indices": self.cuda_graph_kv_indices,
        }

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[EagleDraftInput],
    ):
        assert encoder_lens is None, "encoder-decoder models are not reproduced"
        req_pool_indices = req_pool_indices[:bs]
        seq_lens = seq_lens[:bs]
        if forward_mode.is_decode_or_idle():
            decode_wrapper = make_mla_paged_wrapper(
                self.workspace_buffer,
                use_cuda_graph=True,
                qo_indptr=self.cuda_graph_qo_indptr[: num_tokens + 1],
                kv_indptr=self.cuda_graph_kv_indptr[: num_tokens + 1],
                kv_indices=self.cuda_graph_kv_indices,
                kv_len_arr=self.cuda_graph_kv_lens[:num_tokens],
                backend="auto",
            )

            seq_lens_sum = seq_lens.sum().item()
            self.indices_updater_decode.update(
                req_pool_indices,
                seq_lens,
                seq_lens_sum,
                decode_wrapper=decode_wrapper,
                init_metadata_replay=False,
                spec_info=spec_info,
            )
            self.decode_cuda_graph_metadata[bs] = decode_wrapper
            self.forward_metadata = DecodeMetadata(decode_wrapper)
            decode_wrapper.plan = partial(fast_mla_decode_plan, decode_wrapper)
        else:
            raise ValueError(f"Invalid mode: {forward_mode=}")

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[EagleDraftInput],
        seq_lens_cpu: Optional[torch.Tensor],
    ):
        if forward_mode.is_decode_or_idle():
            assert seq_lens_cpu is not None
            kv_len_arr_cpu = seq_lens_cpu[:bs]
            if spec_info is not None:
                # Reproduction: a draft step plans one sequence per branch, its prefix plus
                # step + 1 draft tokens. From host values only, as upstream's plan: the plan
                # stays right even where the device kv_indices row is corrupt.
                kv_len_arr_cpu = kv_len_arr_cpu.repeat_interleave(spec_info.topk) + (self.speculative_step_id + 1)
            kv_len_arr_cpu = kv_len_arr_cpu.to(torch.int32)
            num_seqs = kv_len_arr_cpu.shape[0]
            self.cuda_graph_kv_indptr_cpu[1 : num_seqs + 1] = torch.cumsum(kv_len_arr_cpu, dim=0)
            self.fast_decode_kwargs.update(
                {
                    "qo_indptr_cpu": self.cuda_graph_qo_indptr_cpu[: num_seqs + 1],
                    "kv_indptr_cpu": self.cuda_graph_kv_indptr_cpu[: num_seqs + 1],
                    "kv_len_arr_cpu": kv_len_arr_cpu,
                }
            )

            self.indices_updater_decode.update(
                req_pool_indices[:bs],
                seq_lens[:bs],
                seq_lens_sum,
                decode_wrapper=self.decode_cuda_graph_metadata[bs],
                init_metadata_replay=True,
                spec_info=spec_info,
                **self.fast_decode_kwargs,
            )
        else:
            raise ValueError(f"Invalid forward mode: {forward_mode=}")

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def forward(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        raise NotImplementedError(f"{forward_batch.forward_mode.name}: only the decode path is reproduced")

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        # For multi-head latent attention
        q_rope: Optional[torch.Tensor] = None,
        k_rope: Optional[torch.Tensor] = None,
    ):
        decode_wrapper = self.forward_metadata.decode_wrapper
        cache_loc = forward_batch.out_cache_loc

        if k is not None and save_kv_cache:
            if k_rope is None:
                # The new tokens' latent [T, 1, kv_lora_rank + qk_rope_head_dim] in one tensor.
                k, k_rope = k[..., : layer.v_head_dim], k[..., layer.v_head_dim :]
            forward_batch.token_to_kv_pool.set_mla_kv_buffer(layer, cache_loc, k, k_rope)

        # Reshape inputs
        if q_rope is not None:
            q_nope = q.view(-1, layer.tp_q_head_num, layer.v_head_dim)
            q_rope = q_rope.view(-1, layer.tp_q_head_num, layer.head_dim - layer.v_head_dim)
        else:
            reshaped_q = q.view(-1, layer.tp_q_head_num, layer.head_dim)
            q_nope = reshaped_q[:, :, : layer.v_head_dim]
            q_rope = reshaped_q[:, :, layer.v_head_dim :]

        k_buffer = forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)

        o = q_nope.new_empty(q_nope.shape)
        # Direct call to run without the wrapper
        o = decode_wrapper.run(
            q_nope,
            q_rope,
            k_buffer[:, :, : layer.v_head_dim],
            k_buffer[:, :, layer.v_head_dim :],
            out=o,
        )

        return o.view(-1, layer.tp_q_head_num, layer.v_head_dim)


class FlashInferMLAIndicesUpdaterDecode:
    def __init__(self, model_runner: ModelRunner, attn_backend: FlashInferMLAAttnBackend):
        # Parse Constants
        self.num_local_heads = model_runner.num_heads
        self.kv_lora_rank = model_runner.kv_lora_rank
        self.qk_nope_head_dim = model_runner.qk_nope_head_dim
        self.qk_rope_head_dim = model_runner.qk_rope_head_dim
        self.scaling = model_runner.scaling
        self.data_type = model_runner.dtype
        self.attn_backend = attn_backend

        # Buffers and wrappers
        self.kv_indptr = attn_backend.kv_indptr
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.q_indptr = attn_backend.q_indptr_decode

    def update(
        self,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        decode_wrapper,
        init_metadata_replay: bool = False,
        spec_info: Optional[EagleDraftInput] = None,
        **fast_decode_kwargs,
    ):
        decode_wrapper = decode_wrapper or self.attn_backend.decode_wrapper
        self.call_begin_forward(
            decode_wrapper,
            req_pool_indices,
            seq_lens,
            seq_lens_sum,
            self.q_indptr,
            self.kv_indptr,
            init_metadata_replay,
            spec_info,
            **fast_decode_kwargs,
        )

    def call_begin_forward(
        self,
        wrapper,
        req_pool_indices: torch.Tensor,
        paged_kernel_lens: torch.Tensor,
        paged_kernel_lens_sum: int,
        q_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        init_metadata_replay: bool = False,
        spec_info: Optional[EagleDraftInput] = None,
        **fast_decode_kwargs,
    ):
        bs = len(req_pool_indices)
        kv_lens = paged_kernel_lens.to(torch.int32)
        sm_scale = self.scaling
        if spec_info is None:
            kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)
            kv_indptr = kv_indptr[: bs + 1]
            kv_indices = (
                torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=req_pool_indices.device)
                if not init_metadata_replay
                else fast_decode_kwargs["kv_indices"]
            )
            create_flashinfer_kv_indices_triton[(bs,)](
                self.req_to_token,
                req_pool_indices,
                paged_kernel_lens,
                kv_indptr,
                None,
                kv_indices,
                self.req_to_token.shape[1],
            )
        else:
            kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices
            # Reproduction: one sequence (one query row) per draft branch, holding the prefix and
            # this step's draft tokens, at the kernel's kv_indptr. Upstream planned the bs
            # requests with kv_lens = seq_lens: incoherent for topk > 1, which it refused.
            bs = kv_indptr.shape[0] - 1
            kv_lens = (
                paged_kernel_lens.repeat_interleave(spec_info.topk) + (self.attn_backend.speculative_step_id + 1)
            ).to(torch.int32)
        q_indptr = q_indptr[: bs + 1]
        self.attn_backend.page_table = PageTable(kv_indptr, kv_indices)

        if not init_metadata_replay:
            wrapper.plan(
                q_indptr,
                kv_indptr,
                kv_indices,
                kv_lens,
                self.num_local_heads,
                self.kv_lora_rank,
                self.qk_rope_head_dim,
                1,
                False,
                sm_scale,
                self.data_type,
                self.data_type,
            )
        else:
            wrapper.plan(
                fast_decode_kwargs["qo_indptr_cpu"],
                fast_decode_kwargs["kv_indptr_cpu"],
                kv_indices,
                fast_decode_kwargs["kv_len_arr_cpu"],
                self.num_local_heads,
                self.kv_lora_rank,
                self.qk_rope_head_dim,
                1,
                False,
                sm_scale,
                self.data_type,
                self.data_type,
            )


class FlashInferMLAMultiStepDraftBackend:
    """
    Wrap multiple flashinfer mla attention backends as one for multiple consecutive
    draft decoding steps.
    """

    def __init__(
        self,
        model_runner: ModelRunner,
        topk: int,
        speculative_num_steps: int,
    ):
        # Reproduction: upstream raised for topk > 1 here ("Currently Flashinfer MLA only supports
        # topk=1 for speculative decoding"); the gate is lifted so that the topk > 1 page tables
        # (and PR 27460's row sizing) are exercised.
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.generate_draft_decode_kv_indices = generate_draft_decode_kv_indices
        self.device = torch.device(model_runner.device)

        self.static_buffers: list[StaticBuffer] = []
        max_bs = model_runner.req_to_token_pool.size * self.topk
        self.kv_indptr = alloc_static(
            (self.speculative_num_steps, max_bs + 1), dtype=torch.int32, device=self.device,
            name="draft.kv_indptr", registry=self.static_buffers,
        )
        self.q_indptr_decode = alloc_static(
            (max_bs + 1,), dtype=torch.int32, device=self.device,
            name="draft.q_indptr_decode", registry=self.static_buffers,
        )
        self.q_indptr_decode.copy_(torch.arange(0, max_bs + 1, dtype=torch.int32))

        self.attn_backends: list[FlashInferMLAAttnBackend] = []
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends.append(
                FlashInferMLAAttnBackend(
                    model_runner,
                    skip_prefill=True,
                    kv_indptr_buf=self.kv_indptr[i],
                    q_indptr_decode_buf=self.q_indptr_decode,
                    speculative_step_id=i,
                )
            )
        # One registry for the whole draft: the children's later graph buffers land in it too.
        for backend in self.attn_backends:
            self.static_buffers.extend(backend.static_buffers)
            backend.static_buffers = self.static_buffers

        self.max_context_len = self.attn_backends[0].max_context_len

        # Cached variables for generate_draft_decode_kv_indices
        self.pool_len = model_runner.req_to_token_pool.req_to_token.shape[1]
        self.page_size = model_runner.page_size

    def common_template(
        self,
        forward_batch: ForwardBatch,
        kv_indices_buffer: torch.Tensor,
        call_fn: Callable,
    ):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        seq_lens_sum = forward_batch.seq_lens_sum

        # PR 27460: the kernel bounds its stores by the lengths only, never by the row width.
        assert seq_lens_sum * self.topk + bs * self.speculative_num_steps <= kv_indices_buffer.shape[1], (
            f"EAGLE draft kv_indices row too small: needs "
            f"{seq_lens_sum * self.topk + bs * self.speculative_num_steps} entries "
            f"(seq_lens_sum={seq_lens_sum}, topk={self.topk}, num_steps={self.speculative_num_steps}), "
            f"row width {kv_indices_buffer.shape[1]}"
        )

        self.generate_draft_decode_kv_indices[(self.speculative_num_steps, num_seqs, self.topk)](
            forward_batch.req_pool_indices,
            forward_batch.req_to_token_pool.req_to_token,
            forward_batch.seq_lens,
            kv_indices_buffer,
            self.kv_indptr,
            forward_batch.positions,
            self.pool_len,
            kv_indices_buffer.shape[1],
            self.kv_indptr.shape[1],
            next_power_of_2(num_seqs),
            next_power_of_2(self.speculative_num_steps),
            next_power_of_2(bs),
            self.page_size,
        )

        assert forward_batch.spec_info is not None
        assert isinstance(forward_batch.spec_info, EagleDraftInput)

        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]
            call_fn(i, forward_batch)

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        kv_indices = torch.zeros(
            (
                self.speculative_num_steps,
                forward_batch.batch_size * self.topk * self.max_context_len,
            ),
            dtype=torch.int32,
            device=self.device,
        )

        def call_fn(i, forward_batch):
            forward_batch.spec_info.kv_indptr = forward_batch.spec_info.kv_indptr.clone()
            forward_batch.spec_info.kv_indices = forward_batch.spec_info.kv_indices.clone()
            self.attn_backends[i].init_forward_metadata(forward_batch)

        self.common_template(forward_batch, kv_indices, call_fn)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.cuda_graph_kv_indices = alloc_static(
            # PR 27460: a row holds topk branch sequences per request, as the eager init sizes it.
            (self.speculative_num_steps, max_bs * self.topk * self.max_context_len),
            dtype=torch.int32,
            device=self.device,
            name="draft.cuda_graph_kv_indices",
            registry=self.static_buffers,
        )

        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_cuda_graph_state(
                max_bs, max_num_tokens, kv_indices_buf=self.cuda_graph_kv_indices[i]
            )

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch):
        def call_fn(i, forward_batch):
            self.attn_backends[i].init_forward_metadata_capture_cuda_graph(
                forward_batch.batch_size,
                forward_batch.batch_size * self.topk,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                encoder_lens=None,
                forward_mode=ForwardMode.DECODE,
                spec_info=forward_batch.spec_info,
            )

        self.common_template(forward_batch, self.cuda_graph_kv_indices, call_fn)

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch, bs: int):
        def call_fn(i, forward_batch):
            self.attn_backends[i].init_forward_metadata_replay_cuda_graph(
                bs,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                seq_lens_sum=-1,
                encoder_lens=None,
                forward_mode=ForwardMode.DECODE,
                spec_info=forward_batch.spec_info,
                seq_lens_cpu=forward_batch.seq_lens_cpu,
            )

        self.common_template(forward_batch, self.cuda_graph_kv_indices, call_fn)


def fast_mla_decode_plan(
    self,
    qo_indptr_cpu: torch.Tensor,
    kv_indptr_cpu: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len_arr_cpu: torch.Tensor,
    num_heads: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    q_data_type: torch.dtype,
    kv_data_type: torch.dtype,
) -> None:
    """A faster version of BatchMLAPagedAttentionWrapper::plan,
    for skipping the stream synchronization in original plan function during
    cuda graph replaying.

    It plans from the host arrays only: ``kv_indices`` is not looked at (the captured kernel
    reads the reserved device buffer the capture-time plan was given).
    """
    self._causal = causal
    self._page_size = page_size
    self._sm_scale = sm_scale

    try:
        # Standard version with just the required arguments (no use_profiler)
        self._cached_module.plan(
            self._float_workspace_buffer,
            self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer,
            qo_indptr_cpu,
            kv_indptr_cpu,
            kv_len_arr_cpu,
            num_heads,
            head_dim_ckv,
            causal,
        )
    except Exception as e:
        raise RuntimeError(f"Error in alternate MLA plan: {e}")
