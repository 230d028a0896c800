"""The TRT-LLM MLA attention backend (upstream ``TRTLLMMLABackend``), for the EAGLE
draft-extend modes (DRAFT_EXTEND and DRAFT_EXTEND_V2): metadata eagerly and for CUDA-graph
capture/replay, then the trtllm-gen MLA kernel over a dense block table.

Upstream subclasses ``FlashInferMLAAttnBackend`` and delegates prefill/extend to it; this
reproduction is standalone and covers only what the draft-extend path reads. Names and the
shape of each branch follow upstream so that the revert patches in ``toggles/`` read like the
upstream diffs; each fix sits on its own source lines (comments name the PR).

The kernel reads only the block table, ``seq_lens_k``, ``max_seq_len`` and the query viewed as
``[bs, tokens_per_seq, heads, 576]``: query row ``j`` of request ``b`` sees the KV positions
``< seq_lens_k[b] - tokens_per_seq + j + 1``. Under CUDA graphs every request runs the
``num_draft_tokens`` rows the graph was captured with, so ``seq_lens_k`` must be
``seq_lens - num_draft_tokens + num_draft_tokens`` whatever was accepted (PR 21987).

MLA is absorbed: q is ``[T, heads, kv_lora_rank + qk_rope_head_dim]``, the new latent k is
``[T, 1, 576]`` (written to the pool), v is not read; the output is ``[T, heads, kv_lora_rank]``.
Static buffers (everything a captured graph reads) come from ``alloc_static`` and are
registered in ``self.static_buffers`` with guard zones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton

from sglfix.backends.kernels.ops.attention.flashmla_kv_indices import (
    create_flashmla_kv_indices_triton,
    get_num_page_per_block_flashmla,
)
from sglfix.backends.kernels.ops.attention.trtllm_mla_decode import TrtllmMLADecodeStandIn
from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import StaticBuffer, alloc_static
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput

# From flashinfer.decode._check_trtllm_gen_mla_shape: block_num % (128 / block_size) == 0.
TRTLLM_BLOCK_CONSTRAINT = 128


@dataclass
class TRTLLMMLADecodeMetadata:
    """Metadata for TRTLLM MLA decode operations."""

    block_kv_indices: Optional[torch.Tensor] = None
    max_seq_len_k: Optional[int] = None
    max_seq_len_q: Optional[int] = None
    sum_seq_lens_q: Optional[int] = None
    cu_seqlens_q: Optional[torch.Tensor] = None
    seq_lens_q: Optional[torch.Tensor] = None
    seq_lens_k: Optional[torch.Tensor] = None


class TRTLLMMLABackend:
    """TRTLLM MLA attention kernel from flashinfer (draft-extend modes)."""

    def __init__(self, *, model_runner: ModelRunner, skip_prefill: bool = False):
        if not model_runner.use_mla_backend:
            raise ValueError("TRTLLMMLABackend needs an MLA model (kv_lora_rank set)")
        self.device = torch.device(model_runner.device)

        # Model parameters
        self.num_q_heads = model_runner.num_heads
        self.num_local_heads = model_runner.num_heads

        # MLA-specific dimensions
        self.kv_lora_rank = model_runner.kv_lora_rank
        self.qk_nope_head_dim = model_runner.qk_nope_head_dim
        self.qk_rope_head_dim = model_runner.qk_rope_head_dim
        self.v_head_dim = model_runner.kv_lora_rank
        self.kv_cache_dim = self.kv_lora_rank + self.qk_rope_head_dim

        # Runtime parameters
        self.scaling = model_runner.scaling
        self.data_type = model_runner.token_to_kv_pool.dtype
        self.q_data_type = model_runner.dtype
        self.page_size = model_runner.page_size
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        # Upstream: model_config.context_len (sizes the graph block table).
        self.max_context_len = (
            model_runner.context_len
            if model_runner.context_len is not None
            else self.req_to_token.shape[1]
        )
        self.num_draft_tokens = model_runner.speculative_num_draft_tokens
        self.skip_prefill = skip_prefill

        # The trtllm-gen kernel runs on Blackwell only: a stand-in over the same inputs.
        self.trtllm_mla_decode = TrtllmMLADecodeStandIn(
            device=self.device,
            num_heads=self.num_q_heads,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            page_size=self.page_size,
            dtype=self.data_type,
        )
        self.workspace_buffer = self.trtllm_mla_decode.workspace_buffer

        # CUDA graph state
        self.static_buffers: list[StaticBuffer] = []
        self.decode_cuda_graph_metadata: dict[int, TRTLLMMLADecodeMetadata] = {}
        self.decode_cuda_graph_kv_indices: Optional[torch.Tensor] = None
        self.padded_q_buffer: Optional[torch.Tensor] = None
        self.unpad_output_buffer: Optional[torch.Tensor] = None
        self.cuda_graph_num_tokens_per_bs: Optional[int] = None
        self.forward_decode_metadata: Optional[TRTLLMMLADecodeMetadata] = None

    # The graph runner hands each captured batch size's metadata back through
    # ``forward_metadata`` before replaying it; this backend calls it forward_decode_metadata.
    @property
    def forward_metadata(self) -> Optional[TRTLLMMLADecodeMetadata]:
        return self.forward_decode_metadata

    @forward_metadata.setter
    def forward_metadata(self, value: Optional[TRTLLMMLADecodeMetadata]) -> None:
        self.forward_decode_metadata = value

    # ------------------------------------------------------------------ helpers

    def _static(self, shape, dtype: torch.dtype, name: str, fill=0) -> torch.Tensor:
        return alloc_static(shape, dtype=dtype, device=self.device, name=name,
                            registry=self.static_buffers, fill=fill)

    def _calc_padded_blocks(self, max_seq_len: int) -> int:
        """Blocks for ``max_seq_len`` tokens, padded to satisfy both the TRT-LLM constraint
        (block_num % (128 / page_size) == 0) and the Triton one (pages per kernel block)."""
        blocks = triton.cdiv(max_seq_len, self.page_size)
        trtllm_constraint = TRTLLM_BLOCK_CONSTRAINT // self.page_size
        triton_constraint = get_num_page_per_block_flashmla(self.page_size)
        constraint_lcm = math.lcm(trtllm_constraint, triton_constraint)
        if blocks % constraint_lcm != 0:
            blocks = triton.cdiv(blocks, constraint_lcm) * constraint_lcm
        return blocks

    def _create_block_kv_indices(
        self,
        batch_size: int,
        max_blocks: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        device: torch.device,
    ) -> torch.Tensor:
        block_kv_indices = torch.full(
            (batch_size, max_blocks), -1, dtype=torch.int32, device=device
        )
        create_flashmla_kv_indices_triton[(batch_size,)](
            self.req_to_token,
            req_pool_indices,
            seq_lens,
            None,
            block_kv_indices,
            self.req_to_token.stride(0),
            max_blocks,
            PAGED_SIZE=self.page_size,
        )
        return block_kv_indices

    def _prepare_kernel(self, metadata: TRTLLMMLADecodeMetadata, q_len: int, graph_bs=None) -> None:
        # The stand-in's host plan (FlashInfer plans on the host; the trtllm-gen kernel needs
        # none): outside any captured graph, right after the metadata it reads is final.
        self.trtllm_mla_decode.prepare(
            block_tables=metadata.block_kv_indices,
            seq_lens=metadata.seq_lens_k,
            q_len=q_len,
            sm_scale=self.scaling,
            graph_bs=graph_bs,
        )

    # ------------------------------------------------------------ eager metadata

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        """Initialize the metadata for a forward pass."""
        if not forward_batch.forward_mode.is_draft_extend(include_v2=True):
            # Upstream also serves DECODE and TARGET_VERIFY here and delegates EXTEND to
            # FlashInfer MLA; only the draft-extend modes are reproduced.
            raise NotImplementedError(
                f"TRTLLMMLABackend reproduces DRAFT_EXTEND(_V2) only, not {forward_batch.forward_mode.name}"
            )
        bs = forward_batch.batch_size
        self.forward_decode_metadata = TRTLLMMLADecodeMetadata()
        # Get maximum sequence length.
        if getattr(forward_batch, "seq_lens_cpu", None) is not None:
            max_seq = forward_batch.seq_lens_cpu.max().item()
        else:
            max_seq = forward_batch.seq_lens.max().item()

        seq_lens = forward_batch.seq_lens

        sum_seq_lens_q = sum(forward_batch.extend_seq_lens_cpu)
        max_seq_len_q = max(forward_batch.extend_seq_lens_cpu)
        cu_seqlens_q = torch.nn.functional.pad(
            torch.cumsum(forward_batch.extend_seq_lens, dim=0, dtype=torch.int32),
            (1, 0),
        )
        # NOTE(draft_extend seq_len handling): forward_batch.seq_lens counts each request's
        # new tokens; the kernel aligns the queries (padded to max_seq_len_q rows) to the end
        # of seq_lens_k, so seq_lens_k = seq_lens - extend_seq_lens + max_seq_len_q.
        seq_lens = seq_lens - forward_batch.extend_seq_lens + max_seq_len_q

        self.forward_decode_metadata.max_seq_len_q = max_seq_len_q
        self.forward_decode_metadata.sum_seq_lens_q = sum_seq_lens_q
        self.forward_decode_metadata.cu_seqlens_q = cu_seqlens_q
        self.forward_decode_metadata.seq_lens_q = forward_batch.extend_seq_lens
        self.forward_decode_metadata.seq_lens_k = seq_lens.to(torch.int32)

        max_seqlen_pad = self._calc_padded_blocks(max_seq)
        block_kv_indices = self._create_block_kv_indices(
            bs,
            max_seqlen_pad,
            forward_batch.req_pool_indices,
            seq_lens,
            seq_lens.device,
        )

        self.forward_decode_metadata.block_kv_indices = block_kv_indices
        self.forward_decode_metadata.max_seq_len_k = int(max_seq)
        self.forward_decode_metadata.batch_size = bs

        forward_batch.decode_trtllm_mla_metadata = self.forward_decode_metadata
        # forward_extend views q as (bs, T // bs) when that divides, else pads to max_seq_len_q.
        q_len = sum_seq_lens_q // bs if sum_seq_lens_q % bs == 0 else max_seq_len_q
        self._prepare_kernel(self.forward_decode_metadata, q_len)

    # ---------------------------------------------------------- CUDA-graph state

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        """Initialize CUDA graph state for TRTLLM MLA."""
        max_blocks_per_seq = self._calc_padded_blocks(self.max_context_len)
        self.decode_cuda_graph_kv_indices = self._static(
            (max_bs, max_blocks_per_seq), torch.int32, "decode_cuda_graph_kv_indices", fill=-1
        )
        num_tokens_per_bs = max_num_tokens // max_bs
        self.cuda_graph_num_tokens_per_bs = num_tokens_per_bs
        # Buffer for padded query: (max_bs, max_draft_tokens, num_q_heads, kv_cache_dim)
        self.padded_q_buffer = self._static(
            (max_bs, num_tokens_per_bs, self.num_q_heads, self.kv_cache_dim),
            self.data_type, "padded_q_buffer",
        )
        # Buffer for unpadded output: (max_num_tokens, num_q_heads, v_head_dim)
        self.unpad_output_buffer = self._static(
            (max_num_tokens, self.num_q_heads, self.kv_lora_rank), self.data_type, "unpad_output_buffer"
        )
        self.trtllm_mla_decode.init_cuda_graph_state(
            max_bs=max_bs, max_q_len=num_tokens_per_bs, max_blocks=max_blocks_per_seq,
            registry=self.static_buffers,
        )

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
        """Initialize metadata for CUDA graph capture."""
        assert encoder_lens is None, "encoder-decoder models are not reproduced"
        # The runner hands over its whole static buffers.
        seq_lens = seq_lens[:bs]
        req_pool_indices = req_pool_indices[:bs]
        metadata = TRTLLMMLADecodeMetadata()

        if forward_mode.is_draft_extend(include_v2=True):
            num_tokens_per_bs = num_tokens // bs
            metadata.max_seq_len_q = num_tokens_per_bs
            metadata.sum_seq_lens_q = num_tokens_per_bs * bs
            metadata.cu_seqlens_q = self._static((bs + 1,), torch.int32, f"cu_seqlens_q[bs={bs}]")
            metadata.cu_seqlens_q.copy_(
                torch.arange(
                    0,
                    bs * num_tokens_per_bs + 1,
                    num_tokens_per_bs,
                    dtype=torch.int32,
                    device=seq_lens.device,
                )
            )
            metadata.seq_lens_q = self._static(
                (bs,), torch.int32, f"seq_lens_q[bs={bs}]", fill=num_tokens_per_bs
            )
            # see NOTE(draft_extend seq_len handling)
            seq_lens = seq_lens - metadata.seq_lens_q + metadata.max_seq_len_q
            metadata.seq_lens_k = self._static((bs,), torch.int32, f"seq_lens_k[bs={bs}]")
            metadata.seq_lens_k.copy_(seq_lens.to(dtype=torch.int32))
        else:
            raise NotImplementedError(
                f"TRTLLMMLABackend reproduces DRAFT_EXTEND(_V2) graphs only, not {forward_mode.name}"
            )

        # Capture with full width so future longer sequences are safe during replay
        max_blocks_per_seq = self._calc_padded_blocks(self.max_context_len)
        block_kv_indices = self.decode_cuda_graph_kv_indices[:bs, :max_blocks_per_seq]

        create_flashmla_kv_indices_triton[(bs,)](
            self.req_to_token,
            req_pool_indices,
            seq_lens,
            None,
            block_kv_indices,
            self.req_to_token.stride(0),
            max_blocks_per_seq,
            PAGED_SIZE=self.page_size,
        )

        metadata.block_kv_indices = block_kv_indices
        metadata.max_seq_len_k = self.max_context_len

        self.decode_cuda_graph_metadata[bs] = metadata
        self.forward_decode_metadata = metadata
        self._prepare_kernel(metadata, num_tokens_per_bs, graph_bs=bs)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: Optional[int],
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[EagleDraftInput],
        seq_lens_cpu: Optional[torch.Tensor],
    ):
        """Replay CUDA graph with new inputs: refresh the captured metadata in place."""
        metadata = self.decode_cuda_graph_metadata[bs]

        if forward_mode.is_draft_extend(include_v2=True):
            num_tokens_per_bs = self.num_draft_tokens
            # PR 21987: the graph runs num_draft_tokens query rows per request whatever was
            # accepted, so max/sum describe that window, not the accept lengths.
            metadata.max_seq_len_q = num_tokens_per_bs
            metadata.sum_seq_lens_q = num_tokens_per_bs * bs
            # PR 21987: a uniform query stride, as captured (not cumsum(accept_length + 1)).
            metadata.cu_seqlens_q[: bs + 1].copy_(
                torch.arange(0, bs * num_tokens_per_bs + 1, step=num_tokens_per_bs,
                             dtype=torch.int32, device=seq_lens.device)
            )
            metadata.seq_lens_q[:bs].fill_(num_tokens_per_bs)
            # see NOTE(draft_extend seq_len handling)
            seq_lens = seq_lens[:bs] - metadata.seq_lens_q[:bs] + metadata.max_seq_len_q
            metadata.seq_lens_k.copy_(seq_lens.to(torch.int32))
        else:
            raise NotImplementedError(
                f"TRTLLMMLABackend reproduces DRAFT_EXTEND(_V2) graphs only, not {forward_mode.name}"
            )

        # Update block indices for new sequences.
        create_flashmla_kv_indices_triton[(bs,)](
            self.req_to_token,
            req_pool_indices[:bs],
            seq_lens,
            None,
            metadata.block_kv_indices,
            self.req_to_token.stride(0),
            metadata.block_kv_indices.shape[1],
            PAGED_SIZE=self.page_size,
        )
        self._prepare_kernel(metadata, self.cuda_graph_num_tokens_per_bs, graph_bs=bs)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """Get the fill value for sequence lengths in CUDA graph."""
        return 1

    # ------------------------------------------------ draft-extend query padding

    def pad_draft_extend_query(
        self,
        q: torch.Tensor,
        padded_q: torch.Tensor,
        seq_lens_q: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
    ) -> torch.Tensor:
        """Packed q [T, H, D] -> padded_q [bs, max_seq_len_q, H, D]; rows past a request's
        length keep what padded_q held (upstream's Triton kernel skips them too)."""
        batch_size = cu_seqlens_q.shape[0] - 1
        max_seq_len_q = padded_q.shape[1]
        pos = torch.arange(max_seq_len_q, device=q.device)
        valid = pos[None, :] < seq_lens_q[:batch_size, None]
        src = (cu_seqlens_q[:batch_size, None].to(torch.int64) + pos[None, :]).clamp(max=q.shape[0] - 1)
        gathered = q[src.reshape(-1)].view(padded_q.shape)
        padded_q.copy_(torch.where(valid[:, :, None, None], gathered, padded_q))
        return padded_q

    def unpad_draft_extend_output(
        self,
        raw_out: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens_q: torch.Tensor,
        sum_seq_lens_q: int,
    ) -> torch.Tensor:
        """raw_out [bs, token_per_batch, H, Dv] -> packed [sum_seq_lens_q, H, Dv]."""
        batch_size = seq_lens_q.shape[0]
        total_tokens = sum_seq_lens_q
        if self.unpad_output_buffer is not None:
            # Use pre-allocated buffer for CUDA graph compatibility
            output = self.unpad_output_buffer[:total_tokens, :, :].to(dtype=raw_out.dtype)
        else:
            output = torch.empty(
                (total_tokens, raw_out.shape[2], raw_out.shape[3]),
                dtype=raw_out.dtype,
                device=raw_out.device,
            )
        token = torch.arange(total_tokens, device=raw_out.device)
        cu = cu_seqlens_q[: batch_size + 1].to(torch.int64)
        owner = torch.searchsorted(cu[1:].contiguous(), token, right=True)
        output.copy_(raw_out[owner, token - cu[owner]])
        return output[:total_tokens, :, :]

    # ------------------------------------------------------------------ forward

    def forward(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        if forward_batch.forward_mode.is_draft_extend(include_v2=True):
            return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        raise NotImplementedError(
            f"TRTLLMMLABackend reproduces DRAFT_EXTEND(_V2) only, not {forward_batch.forward_mode.name}"
        )

    def forward_extend(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        """q [T, H, 576] (absorbed), k the new latent [T, 1, 576]; v is not read."""
        if save_kv_cache:
            k = k.reshape(-1, 1, self.kv_cache_dim)
            forward_batch.token_to_kv_pool.set_mla_kv_buffer(
                layer, forward_batch.out_cache_loc, k[..., : self.kv_lora_rank], k[..., self.kv_lora_rank :]
            )

        q = q.view(-1, layer.tp_q_head_num, layer.head_dim)

        metadata = (
            getattr(forward_batch, "decode_trtllm_mla_metadata", None)
            or self.forward_decode_metadata
        )
        bs = forward_batch.batch_size

        k_cache = forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id)
        kv_cache = k_cache.view(-1, self.page_size, self.kv_cache_dim).unsqueeze(1)

        # BMM1 scale = q_scale * k_scale * softmax_scale; 1.0 and 1.0 for a bf16/fp16 cache.
        q_scale = 1.0
        k_scale = 1.0
        q = q.to(self.data_type)
        bmm1_scale = q_scale * k_scale * layer.scaling

        # draft_extend: handle varying accept_lengths. If total_tokens % bs == 0,
        # we can directly reshape q; otherwise, pad to max_seq_len_q.
        total_tokens = q.shape[0]
        tokens_per_seq = total_tokens // bs if bs > 0 else 0
        can_direct_view = bs > 0 and (total_tokens % bs == 0)

        if can_direct_view:
            max_seq_len = metadata.max_seq_len_k + tokens_per_seq
            q = q.view(bs, tokens_per_seq, layer.tp_q_head_num, layer.head_dim)
            needs_unpad = False
        else:
            # Varying lengths: pad q to (bs, max_seq_len_q, ...)
            actual_seq_lens_q = forward_batch.extend_seq_lens
            actual_max_seq_len_q = max(forward_batch.extend_seq_lens_cpu)
            max_seq_len = metadata.max_seq_len_k + actual_max_seq_len_q
            actual_cu_seqlens_q = torch.nn.functional.pad(
                torch.cumsum(actual_seq_lens_q, dim=0, dtype=torch.int32), (1, 0)
            )
            if self.padded_q_buffer is not None:
                padded_q = self.padded_q_buffer[:bs, :actual_max_seq_len_q, :, :].to(dtype=q.dtype)
                padded_q.zero_()
            else:
                padded_q = torch.zeros(
                    (bs, actual_max_seq_len_q, layer.tp_q_head_num, layer.head_dim),
                    dtype=q.dtype,
                    device=q.device,
                )
            q = self.pad_draft_extend_query(q, padded_q, actual_seq_lens_q, actual_cu_seqlens_q)
            needs_unpad = True
            unpad_seq_lens_q = actual_seq_lens_q
            unpad_cu_seqlens_q = actual_cu_seqlens_q
            unpad_sum_seq_lens_q = total_tokens

        assert kv_cache.dtype == self.data_type

        raw_out = self.trtllm_mla_decode(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace_buffer,
            qk_nope_head_dim=self.qk_nope_head_dim,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            block_tables=metadata.block_kv_indices,
            seq_lens=metadata.seq_lens_k,
            max_seq_len=max_seq_len,
            bmm1_scale=bmm1_scale,
        )

        if needs_unpad:
            output = self.unpad_draft_extend_output(
                raw_out, unpad_cu_seqlens_q, unpad_seq_lens_q, unpad_sum_seq_lens_q
            )
        else:
            output = raw_out
        return output.reshape(-1, layer.tp_q_head_num, layer.v_head_dim)
