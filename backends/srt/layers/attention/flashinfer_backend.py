"""The FlashInfer attention backend (MHA/GQA over a paged KV cache), decode path: plain decode
(eager and CUDA graphs) and the multi-step EAGLE draft (``FlashInferMultiStepDraftBackend``: one
child backend per draft step, page tables from ``generate_draft_decode_kv_indices``).

Mirrors the engine's ``flashinfer_backend`` at v0.5.12 for one wrapper (no sliding window, no
cross attention), page size 1 in the kernel's view (slots are pages of one token). The kernel
comes from ``paged_wrappers``: FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` on CUDA, a
torch stand-in elsewhere. PR 27338's fix (the draft's row sizing with the topk factor, and the
row-width assertion) sits on its own lines so that ``toggles/27338.yaml`` can revert it.

Static buffers (everything a captured graph reads) are allocated through ``alloc_static`` and
registered in ``static_buffers``, with guard zones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
import triton

from sglfix.backends.kernels.ops.attention.kv_indices import create_flashinfer_kv_indices_triton
from sglfix.backends.kernels.ops.attention.paged_wrappers import make_decode_wrapper, make_workspace_buffer, on_device
from sglfix.backends.kernels.ops.speculative import generate_draft_decode_kv_indices
from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import StaticBuffer, alloc_static
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput

next_power_of_2 = triton.next_power_of_2


@dataclass
class DecodeMetadata:
    decode_wrappers: List[object]


@dataclass
class PageTable:
    """The kv_indptr / kv_indices handed to the last plan (read by the judge's invariant check)."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor


# Reuse this workspace buffer across all flashinfer wrappers
global_workspace_buffer = None


def _workspace(device: torch.device) -> torch.Tensor:
    global global_workspace_buffer
    if global_workspace_buffer is None or not on_device(global_workspace_buffer, device):
        global_workspace_buffer = make_workspace_buffer(device)
    return global_workspace_buffer


class FlashInferAttnBackend:
    """Flashinfer attention kernels (decode)."""

    def __init__(
        self,
        model_runner: ModelRunner,
        skip_prefill: bool = False,
        kv_indptr_buf: Optional[torch.Tensor] = None,
        kv_last_page_len_buf: Optional[torch.Tensor] = None,
    ):
        self.decode_backend = "fa2"
        # Upstream picks tensor cores from the GQA group size (>= 4); the reproduction keeps the
        # CUDA-core decode kernel for the group sizes it runs (<= 4).
        self.decode_use_tensor_cores = False
        self.max_context_len = model_runner.context_len or model_runner.req_to_token_pool.max_context_len
        self.device = torch.device(model_runner.device)
        self.skip_prefill = skip_prefill
        self.num_wrappers = 1

        self.workspace_buffer = _workspace(self.device)

        # Every buffer a captured graph may read, with guard zones.
        self.static_buffers: list[StaticBuffer] = []
        max_bs = model_runner.req_to_token_pool.size
        if kv_indptr_buf is None:
            self.kv_indptr = [
                alloc_static(
                    (max_bs + 1,), dtype=torch.int32, device=self.device,
                    name="kv_indptr", registry=self.static_buffers,
                )
            ]
        else:
            self.kv_indptr = [kv_indptr_buf]

        if kv_last_page_len_buf is None:
            self.kv_last_page_len = alloc_static(
                (max_bs,), dtype=torch.int32, device=self.device,
                name="kv_last_page_len", registry=self.static_buffers, fill=1,
            )
        else:
            self.kv_last_page_len = kv_last_page_len_buf

        self.decode_wrappers = [
            make_decode_wrapper(
                self.workspace_buffer,
                "NHD",
                backend=self.decode_backend,
                use_tensor_cores=self.decode_use_tensor_cores,
            )
        ]

        self.indices_updater_decode = FlashInferIndicesUpdaterDecode(model_runner, self)

        # Other metadata
        self.forward_metadata: Optional[DecodeMetadata] = None
        self.page_table: Optional[PageTable] = None
        self.decode_cuda_graph_metadata = {}

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        if forward_batch.forward_mode.is_decode_or_idle():
            self.indices_updater_decode.update(
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
                forward_batch.seq_lens_cpu,
                forward_batch.seq_lens_sum,
                decode_wrappers=self.decode_wrappers,
                encoder_lens=forward_batch.encoder_lens,
                spec_info=forward_batch.spec_info,
            )
            self.forward_metadata = DecodeMetadata(self.decode_wrappers)
        else:
            raise NotImplementedError(f"{forward_batch.forward_mode.name}: only the decode path is reproduced")

    def init_cuda_graph_state(
        self,
        max_bs: int,
        max_num_tokens: int,
        kv_indices_buf: Optional[torch.Tensor] = None,
    ):
        if kv_indices_buf is None:
            cuda_graph_kv_indices = alloc_static(
                (max_num_tokens * self.max_context_len,), dtype=torch.int32, device=self.device,
                name="cuda_graph_kv_indices", registry=self.static_buffers,
            )
        else:
            cuda_graph_kv_indices = kv_indices_buf

        self.cuda_graph_kv_indices = [cuda_graph_kv_indices]

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
            decode_wrappers = []
            for i in range(self.num_wrappers):
                decode_wrappers.append(
                    make_decode_wrapper(
                        self.workspace_buffer,
                        "NHD",
                        backend=self.decode_backend,
                        use_cuda_graph=True,
                        use_tensor_cores=self.decode_use_tensor_cores,
                        paged_kv_indptr_buffer=self.kv_indptr[i][: num_tokens + 1],
                        paged_kv_indices_buffer=self.cuda_graph_kv_indices[i],
                        paged_kv_last_page_len_buffer=self.kv_last_page_len[:num_tokens],
                    )
                )
            seq_lens_sum = seq_lens.sum().item()
            self.indices_updater_decode.update(
                req_pool_indices,
                seq_lens,
                seq_lens.cpu(),  # may add a little overhead in capture stage
                seq_lens_sum,
                decode_wrappers=decode_wrappers,
                encoder_lens=encoder_lens,
                spec_info=spec_info,
            )
            self.decode_cuda_graph_metadata[bs] = decode_wrappers
            self.forward_metadata = DecodeMetadata(decode_wrappers)
            # Upstream swaps in fast_decode_plan here; the reproduction re-plans with the regular
            # begin_forward, which copies the (kernel-written) kv_indptr to the host itself.
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
            self.indices_updater_decode.update(
                req_pool_indices[:bs],
                seq_lens[:bs],
                seq_lens_cpu[:bs] if seq_lens_cpu is not None else None,
                seq_lens_sum,
                decode_wrappers=self.decode_cuda_graph_metadata[bs],
                encoder_lens=encoder_lens[:bs] if encoder_lens is not None else None,
                spec_info=spec_info,
            )
        else:
            raise ValueError("Invalid forward mode")

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
        save_kv_cache=True,
    ):
        decode_wrapper = self.forward_metadata.decode_wrappers[0]
        cache_loc = forward_batch.out_cache_loc

        if k is not None:
            assert v is not None
            if save_kv_cache:
                forward_batch.token_to_kv_pool.set_kv_buffer(
                    layer,
                    cache_loc,
                    k.reshape(-1, layer.tp_k_head_num, layer.head_dim),
                    v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim),
                )

        # Call the wrapped function
        o = decode_wrapper.forward(
            q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim),
            forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id),
            sm_scale=layer.scaling,
            logits_soft_cap=layer.logit_cap,
            k_scale=None,
            v_scale=None,
        )

        return o.view(-1, layer.tp_q_head_num, layer.head_dim)


class FlashInferIndicesUpdaterDecode:
    def __init__(self, model_runner: ModelRunner, attn_backend: FlashInferAttnBackend):
        # Parse Constants
        self.num_qo_heads = model_runner.num_heads
        self.num_kv_heads = model_runner.num_kv_heads
        self.head_dim = model_runner.head_dim
        self.data_type = model_runner.dtype
        self.q_data_type = model_runner.dtype
        self.attn_backend = attn_backend

        # Buffers and wrappers
        self.kv_indptr = attn_backend.kv_indptr
        self.kv_last_page_len = attn_backend.kv_last_page_len
        self.req_to_token = model_runner.req_to_token_pool.req_to_token

    def update(
        self,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: Optional[torch.Tensor],
        seq_lens_sum: int,
        decode_wrappers: List[object],
        encoder_lens: Optional[torch.Tensor],
        spec_info: Optional[EagleDraftInput],
    ):
        # One wrapper: upstream's update_single_wrapper.
        decode_wrappers = decode_wrappers or self.attn_backend.decode_wrappers
        self.call_begin_forward(
            decode_wrappers[0],
            req_pool_indices,
            seq_lens,
            seq_lens_sum,
            self.kv_indptr[0],
            None,
            spec_info,
            seq_lens_cpu,
        )

    def call_begin_forward(
        self,
        wrapper,
        req_pool_indices: torch.Tensor,
        paged_kernel_lens: torch.Tensor,
        paged_kernel_lens_sum: int,
        kv_indptr: torch.Tensor,
        kv_start_idx: Optional[torch.Tensor],
        spec_info: Optional[EagleDraftInput],
        seq_lens_cpu: Optional[torch.Tensor],
    ):
        if spec_info is None:
            bs = len(req_pool_indices)
            kv_indptr[1 : bs + 1] = torch.cumsum(paged_kernel_lens, dim=0)
            kv_indptr = kv_indptr[: bs + 1]

            if wrapper.is_cuda_graph_enabled:
                # Directly write to the cuda graph input buffer
                kv_indices = wrapper._paged_kv_indices_buf
            else:
                kv_indices = torch.empty(paged_kernel_lens_sum, dtype=torch.int32, device=req_pool_indices.device)

            create_flashinfer_kv_indices_triton[(bs,)](
                self.req_to_token,
                req_pool_indices,
                paged_kernel_lens,
                kv_indptr,
                kv_start_idx,
                kv_indices,
                self.req_to_token.shape[1],
            )
        else:
            kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices
            bs = kv_indptr.shape[0] - 1
        self.attn_backend.page_table = PageTable(kv_indptr, kv_indices)

        # The plan reads kv_indptr back to the host (kernel-written for a draft step).
        wrapper.begin_forward(
            kv_indptr,
            kv_indices,
            self.kv_last_page_len[:bs],
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            data_type=self.data_type,
            q_data_type=self.q_data_type,
            non_blocking=True,
        )


class FlashInferMultiStepDraftBackend:
    """
    Wrap multiple flashinfer attention backends as one for multiple consecutive
    draft decoding steps.
    """

    def __init__(
        self,
        model_runner: ModelRunner,
        topk: int,
        speculative_num_steps: int,
    ):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.generate_draft_decode_kv_indices = generate_draft_decode_kv_indices
        self.page_size = model_runner.page_size
        self.device = torch.device(model_runner.device)

        self.static_buffers: list[StaticBuffer] = []
        max_bs = model_runner.req_to_token_pool.size * self.topk
        self.kv_indptr = alloc_static(
            (self.speculative_num_steps, max_bs + 1), dtype=torch.int32, device=self.device,
            name="draft.kv_indptr", registry=self.static_buffers,
        )
        self.kv_last_page_len = alloc_static(
            (max_bs,), dtype=torch.int32, device=self.device,
            name="draft.kv_last_page_len", registry=self.static_buffers, fill=1,
        )
        self.attn_backends: List[FlashInferAttnBackend] = []
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends.append(
                FlashInferAttnBackend(
                    model_runner,
                    skip_prefill=True,
                    kv_indptr_buf=self.kv_indptr[i],
                    kv_last_page_len_buf=self.kv_last_page_len,
                )
            )
        # One registry for the whole draft: the children's later graph buffers land in it too.
        for backend in self.attn_backends:
            self.static_buffers.extend(backend.static_buffers)
            backend.static_buffers = self.static_buffers

        self.max_context_len = self.attn_backends[0].max_context_len

        # Cached variables for generate_draft_decode_kv_indices
        self.pool_len = model_runner.req_to_token_pool.req_to_token.shape[1]

    def common_template(
        self,
        forward_batch: ForwardBatch,
        kv_indices_buffer: torch.Tensor,
        call_fn: Callable,
    ):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        seq_lens_sum = forward_batch.seq_lens_sum

        # PR 27338: the kernel bounds its stores by the lengths only, never by the row width.
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

        # Upstream also copies kv_indptr to the host once here, for its fast_decode_plan; each
        # child's regular plan reads its row back instead (same values).
        for i in range(self.speculative_num_steps - 1):
            forward_batch.spec_info.kv_indptr = self.kv_indptr[i, : bs + 1]
            forward_batch.spec_info.kv_indices = kv_indices_buffer[i][: seq_lens_sum * self.topk + bs * (i + 1)]
            call_fn(i, forward_batch)

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        kv_indices = torch.empty(
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
            # PR 27338: a row holds topk branch sequences per request, as the eager init sizes it.
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
