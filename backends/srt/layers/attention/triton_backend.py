"""The Triton attention backend: builds per-forward attention metadata (CSR page
tables, query offsets, verify masks, split-KV scratch) for every forward mode,
eagerly and for CUDA-graph capture/replay, then runs the Triton kernels.

Mirrors the engine's ``TritonAttnBackend``. Method names, variable names and the
shape of each branch follow upstream so that the revert patches in ``toggles/``
read like the upstream diffs; each fix sits on its own source lines (comments
name the PR).

Conventions the metadata must respect:
- ``kv_indptr``/``kv_indices`` cover the part of each sequence read from the KV
  pool; in extend-like modes that is the prefix only, since the new tokens' K/V
  reach the kernel as dense tensors (``qo_indptr`` order);
- static buffers (everything a captured graph reads) are allocated once through
  ``alloc_static`` and registered in ``self.static_buffers`` with guard zones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import StaticBuffer, alloc_static
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.kernels.ops.attention import create_flashinfer_kv_indices_triton, decode_attention_fwd, extend_attention_fwd

# Decode sequences are split into chunks of about this many tokens (up to
# max_kv_splits), so even the short sequences of CPU scenarios use several splits.
_KV_SPLIT_TILE = 16


@dataclass
class ForwardMetadata:
    attn_logits: Optional[torch.Tensor]
    attn_lse: Optional[torch.Tensor]
    max_extend_len: Optional[int]
    num_kv_splits: Optional[torch.Tensor]
    kv_indptr: Optional[torch.Tensor]
    kv_indices: Optional[torch.Tensor]
    qo_indptr: Optional[torch.Tensor]
    custom_mask: Optional[torch.Tensor]
    mask_indptr: Optional[torch.Tensor]


class TritonAttnBackend:
    # CUDA-graph replay rebuilds metadata from preallocated kv_indptr/kv_indices
    # buffers; it never reads seq_lens_cpu / seq_lens_sum.
    needs_cpu_seq_lens: bool = False

    def __init__(self, *, model_runner: ModelRunner, skip_prefill: bool = False):
        self.device = torch.device(model_runner.device)
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.num_head = model_runner.num_heads
        self.num_kv_head = model_runner.num_kv_heads
        self.head_dim = model_runner.head_dim
        self.v_head_dim = model_runner.head_dim
        self.max_context_len = self.req_to_token.shape[1]
        self.topk = model_runner.speculative_eagle_topk
        self.speculative_num_steps = model_runner.speculative_num_steps
        self.num_draft_tokens = model_runner.speculative_num_draft_tokens
        self.max_kv_splits = model_runner.max_kv_splits
        self.skip_prefill = skip_prefill

        # Every buffer a captured graph may read or write, with guard zones.
        self.static_buffers: list[StaticBuffer] = []
        max_bs = model_runner.req_to_token_pool.size
        self.kv_indptr = alloc_static(
            (max_bs + 1,), dtype=torch.int32, device=self.device,
            name="kv_indptr", registry=self.static_buffers,
        )
        self.qo_indptr = alloc_static(
            (max_bs + 1,), dtype=torch.int32, device=self.device,
            name="qo_indptr", registry=self.static_buffers,
        )
        self.mask_indptr = alloc_static(
            (max_bs + 1,), dtype=torch.int64, device=self.device,
            name="mask_indptr", registry=self.static_buffers,
        )
        self.forward_metadata: Optional[ForwardMetadata] = None

    # ------------------------------------------------------------------ helpers

    def get_num_kv_splits(self, num_kv_splits: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Fill ``num_kv_splits`` on the device (no host read, so graph-safe)."""
        splits = torch.clamp(
            (seq_lens.to(torch.int32) + _KV_SPLIT_TILE - 1) // _KV_SPLIT_TILE,
            min=1,
            max=self.max_kv_splits,
        )
        num_kv_splits.copy_(splits.to(torch.int32))

    def _fill_kv_indices(
        self,
        bs: int,
        kv_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
    ) -> None:
        kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens[:bs], dim=0)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token,
            req_pool_indices,
            kv_lens,
            kv_indptr,
            None,
            kv_indices,
            self.req_to_token.stride(0),
        )

    # ------------------------------------------------------------ eager metadata

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        """Init auxiliary variables for triton attention backend."""
        bs = forward_batch.batch_size
        spec_info = forward_batch.spec_info

        if forward_batch.forward_mode.is_idle():
            self.forward_metadata = ForwardMetadata(
                None, None, None, None, None, None, None, None, None
            )
            return

        if forward_batch.forward_mode.is_decode_or_idle():
            if spec_info is None or spec_info.kv_indptr is None:
                kv_indptr = self.kv_indptr
                # gpu_only: seq_lens_sum may be None; the ragged write tolerates over-allocation.
                decode_kv_len = forward_batch.seq_lens_sum
                if decode_kv_len is None:
                    decode_kv_len = bs * self.max_context_len
                kv_indices = torch.empty(decode_kv_len, dtype=torch.int64, device=self.device)
                self._fill_kv_indices(
                    bs, forward_batch.seq_lens, forward_batch.req_pool_indices, kv_indptr, kv_indices
                )
                kv_indptr = kv_indptr[: bs + 1]
            else:
                kv_indptr, kv_indices = spec_info.kv_indptr, spec_info.kv_indices
                bs = kv_indptr.shape[0] - 1

            attn_logits = torch.empty(
                (bs, self.num_head, self.max_kv_splits, self.v_head_dim),
                dtype=torch.float32,
                device=self.device,
            )
            attn_lse = torch.empty(
                (bs, self.num_head, self.max_kv_splits), dtype=torch.float32, device=self.device
            )
            num_kv_splits = torch.empty((bs,), dtype=torch.int32, device=self.device)
            self.get_num_kv_splits(num_kv_splits, forward_batch.seq_lens[:bs])

            qo_indptr = None
            custom_mask = None
            mask_indptr = None
            max_extend_len = None
        elif forward_batch.forward_mode.is_target_verify():
            bs = len(forward_batch.req_pool_indices)
            num_tokens_per_req = self.num_draft_tokens
            if spec_info is not None and spec_info.num_tokens_per_req > 0:
                num_tokens_per_req = spec_info.num_tokens_per_req
            qo_indptr = torch.arange(
                0,
                (1 + bs) * num_tokens_per_req,
                step=num_tokens_per_req,
                dtype=torch.int32,
                device=self.device,
            )
            kv_indptr = self.kv_indptr
            seq_lens_sum = forward_batch.seq_lens_sum
            # PR 26738: gpu_only leaves seq_lens_sum None; size by the upper bound (ragged write).
            if seq_lens_sum is None:
                seq_lens_sum = bs * self.max_context_len
            kv_indices = torch.empty(seq_lens_sum, dtype=torch.int64, device=self.device)
            self._fill_kv_indices(
                bs, forward_batch.seq_lens, forward_batch.req_pool_indices, kv_indptr, kv_indices
            )
            kv_indptr = kv_indptr[: bs + 1]

            custom_mask = spec_info.custom_mask
            seq_mask_len = num_tokens_per_req * (forward_batch.seq_lens + num_tokens_per_req)
            mask_indptr = self.mask_indptr
            mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len[:bs], dim=0)
            mask_indptr = mask_indptr[: bs + 1]
            max_extend_len = num_tokens_per_req
            num_kv_splits = None
            attn_logits = None
            attn_lse = None
        else:
            # EXTEND, DRAFT_EXTEND and DRAFT_EXTEND_V2: the page table covers the
            # prefix (extend_prefix_lens); the new tokens come as dense K/V.
            kv_indptr = self.kv_indptr
            # PR 26738: gpu_only leaves extend_prefix_lens_cpu unset; size by the
            # upper bound instead (over-allocation is safe: the write is ragged).
            if forward_batch.extend_prefix_lens_cpu is not None:
                kv_indices_len = sum(forward_batch.extend_prefix_lens_cpu)
            else:
                kv_indices_len = bs * self.max_context_len
            kv_indices = torch.empty(kv_indices_len, dtype=torch.int64, device=self.device)
            self._fill_kv_indices(
                bs,
                forward_batch.extend_prefix_lens,
                forward_batch.req_pool_indices,
                kv_indptr,
                kv_indices,
            )
            kv_indptr = kv_indptr[: bs + 1]

            qo_indptr = self.qo_indptr
            qo_indptr[1 : bs + 1] = torch.cumsum(forward_batch.extend_seq_lens[:bs], dim=0)
            qo_indptr = qo_indptr[: bs + 1]
            custom_mask = None
            mask_indptr = None
            attn_logits = None
            attn_lse = None
            # PR 26738: without the CPU list, read the max from the device tensor:
            # correct, but a device->host sync on CUDA (the spec-v2 glue supplies
            # the list as a host constant to avoid it).
            if forward_batch.extend_seq_lens_cpu is not None:
                max_extend_len = max(forward_batch.extend_seq_lens_cpu)
            else:
                max_extend_len = int(forward_batch.extend_seq_lens.max().item())
            num_kv_splits = None

        self.forward_metadata = ForwardMetadata(
            attn_logits,
            attn_lse,
            max_extend_len,
            num_kv_splits,
            kv_indptr,
            kv_indices,
            qo_indptr,
            custom_mask,
            mask_indptr,
        )

    # ---------------------------------------------------------- CUDA-graph state

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        reg = self.static_buffers
        self.cuda_graph_attn_logits = alloc_static(
            (max_num_tokens, self.num_head, self.max_kv_splits, self.v_head_dim),
            dtype=torch.float32, device=self.device,
            name="cuda_graph_attn_logits", registry=reg,
        )
        self.cuda_graph_attn_lse = alloc_static(
            (max_num_tokens, self.num_head, self.max_kv_splits),
            dtype=torch.float32, device=self.device,
            name="cuda_graph_attn_lse", registry=reg,
        )
        self.cuda_graph_num_kv_splits = alloc_static(
            (max_num_tokens,), dtype=torch.int32, device=self.device,
            name="cuda_graph_num_kv_splits", registry=reg, fill=self.max_kv_splits,
        )
        self.cuda_graph_kv_indices = alloc_static(
            (max_num_tokens * self.max_context_len,), dtype=torch.int64, device=self.device,
            name="cuda_graph_kv_indices", registry=reg,
        )
        # Verify mask: num_draft * (seq_len + num_draft) per request, at most.
        self.cuda_graph_custom_mask = alloc_static(
            (max_bs * self.num_draft_tokens * (self.max_context_len + self.num_draft_tokens),),
            dtype=torch.bool, device=self.device,
            name="cuda_graph_custom_mask", registry=reg,
        )

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[EagleDraftInput | EagleVerifyInput],
    ):
        assert encoder_lens is None, "encoder-decoder models are not reproduced"
        seq_lens = seq_lens[:bs]
        req_pool_indices = req_pool_indices[:bs]
        if forward_mode.is_decode_or_idle():
            kv_indptr = self.kv_indptr
            self._fill_kv_indices(bs, seq_lens, req_pool_indices, kv_indptr, self.cuda_graph_kv_indices)
            self.get_num_kv_splits(self.cuda_graph_num_kv_splits[:bs], seq_lens)
            attn_logits = self.cuda_graph_attn_logits
            attn_lse = self.cuda_graph_attn_lse
            max_extend_len = None
            num_kv_splits = self.cuda_graph_num_kv_splits
            qo_indptr = None
            custom_mask = None
            mask_indptr = None
        elif forward_mode.is_target_verify():
            qo_indptr = self.qo_indptr[: bs + 1]
            qo_indptr[: bs + 1] = torch.arange(
                0,
                (1 + bs) * self.num_draft_tokens,
                step=self.num_draft_tokens,
                dtype=torch.int32,
                device=self.device,
            )
            kv_indptr = self.kv_indptr
            self._fill_kv_indices(bs, seq_lens, req_pool_indices, kv_indptr, self.cuda_graph_kv_indices)
            custom_mask = self.cuda_graph_custom_mask
            seq_mask_len = self.num_draft_tokens * (seq_lens + self.num_draft_tokens)
            mask_indptr = self.mask_indptr[: bs + 1]
            mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len, dim=0)
            max_extend_len = self.num_draft_tokens
            num_kv_splits = None
            attn_logits = None
            attn_lse = None
        elif forward_mode.is_draft_extend(include_v2=True):
            # V2 lays out num_draft_tokens per request; v1 num_steps + 1.
            num_tokens_per_bs = (
                self.num_draft_tokens
                if forward_mode.is_draft_extend_v2()
                else self.speculative_num_steps + 1
            )
            qo_indptr = self.qo_indptr[: bs + 1]
            qo_indptr[: bs + 1] = torch.arange(
                0,
                bs * num_tokens_per_bs + 1,
                step=num_tokens_per_bs,
                dtype=torch.int32,
                device=self.device,
            )
            if forward_mode.is_draft_extend_v2():
                if spec_info is not None and spec_info.extend_seq_lens_tensor is not None:
                    extend_seq_lens = spec_info.extend_seq_lens_tensor[:bs].to(torch.int32)
                else:
                    # Capture warmup may lack the tensor: fall back to zeros.
                    extend_seq_lens = torch.zeros(bs, dtype=torch.int32, device=self.device)
                # PR 26651: seq_lens is prefix + extend; the page table covers the prefix only.
                kv_lens = seq_lens - extend_seq_lens
                # PR 26651: padded rows (seq_lens = fill 1, extend = num_draft_tokens) go negative.
                kv_lens = torch.clamp(kv_lens, min=0)
            else:
                # v1: seq_lens counts the accept_length + 1 new tokens as well.
                accept_lens = spec_info.accept_length[:bs].to(torch.int32)
                kv_lens = torch.clamp(seq_lens - (accept_lens + 1), min=0).to(torch.int32)
            kv_indptr = self.kv_indptr
            self._fill_kv_indices(bs, kv_lens, req_pool_indices, kv_indptr, self.cuda_graph_kv_indices)
            custom_mask = None
            mask_indptr = None
            max_extend_len = num_tokens_per_bs
            num_kv_splits = None
            attn_logits = None
            attn_lse = None
        else:
            raise ValueError(f"Invalid forward mode: {forward_mode=} for CUDA Graph capture.")

        self.forward_metadata = ForwardMetadata(
            attn_logits,
            attn_lse,
            max_extend_len,
            num_kv_splits,
            kv_indptr[: bs + 1],
            self.cuda_graph_kv_indices,
            qo_indptr,
            custom_mask,
            mask_indptr,
        )

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: Optional[int],
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info: Optional[EagleDraftInput | EagleVerifyInput],
        seq_lens_cpu: Optional[torch.Tensor],
    ):
        # Update, in place, the static buffers the captured metadata points to;
        # seq_lens_sum / seq_lens_cpu are never read (needs_cpu_seq_lens = False).
        seq_lens = seq_lens[:bs]
        req_pool_indices = req_pool_indices[:bs]
        if forward_mode.is_decode_or_idle():
            kv_indptr = self.kv_indptr
            self._fill_kv_indices(bs, seq_lens, req_pool_indices, kv_indptr, self.cuda_graph_kv_indices)
            self.get_num_kv_splits(self.cuda_graph_num_kv_splits[:bs], seq_lens)
        elif forward_mode.is_target_verify():
            bs = len(req_pool_indices)
            kv_indptr = self.kv_indptr
            self._fill_kv_indices(bs, seq_lens, req_pool_indices, kv_indptr, self.cuda_graph_kv_indices)
            custom_mask = self.cuda_graph_custom_mask
            custom_mask[: spec_info.custom_mask.shape[0]] = spec_info.custom_mask
            seq_mask_len = self.num_draft_tokens * (seq_lens + self.num_draft_tokens)
            mask_indptr = self.mask_indptr[: bs + 1]
            mask_indptr[1 : bs + 1] = torch.cumsum(seq_mask_len, dim=0)
        elif forward_mode.is_draft_extend(include_v2=True):
            if forward_mode.is_draft_extend_v2():
                # Uniform layout, as captured: num_draft_tokens per request.
                extend_seq_lens = spec_info.extend_seq_lens_tensor[:bs].to(torch.int32)
                # PR 26651: seq_lens is prefix + extend; the page table covers the prefix only.
                kv_lens = seq_lens - extend_seq_lens
                # PR 26651: padded rows (seq_lens = fill 1, extend = num_draft_tokens) go negative.
                kv_lens = torch.clamp(kv_lens, min=0)
            else:
                # v1 packs accept_length + 1 tokens per request.
                accept_lens = spec_info.accept_length[:bs].to(torch.int32)
                qo_indptr = self.qo_indptr[: bs + 1]
                qo_indptr[1 : bs + 1] = torch.cumsum(accept_lens + 1, dim=0)
                kv_lens = torch.clamp(seq_lens - (accept_lens + 1), min=0).to(torch.int32)
            kv_indptr = self.kv_indptr
            self._fill_kv_indices(bs, kv_lens, req_pool_indices, kv_indptr, self.cuda_graph_kv_indices)
        else:
            raise ValueError(f"Invalid forward mode: {forward_mode=} for CUDA Graph replay.")

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    # ------------------------------------------------------------------ forward

    def forward(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        if forward_batch.forward_mode.is_idle():
            return q.new_empty((0, layer.tp_q_head_num, layer.v_head_dim))
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)
        k = k.reshape(-1, layer.tp_k_head_num, layer.head_dim)
        v = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
        o = torch.empty_like(q)
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)

        md = self.forward_metadata
        # Verify trees bring their own mask; otherwise causal within the new tokens.
        causal = layer.is_causal
        extend_attention_fwd(
            q,
            k.contiguous(),
            v.contiguous(),
            o,
            forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id),
            forward_batch.token_to_kv_pool.get_value_buffer(layer.layer_id),
            md.qo_indptr,
            md.kv_indptr,
            md.kv_indices,
            md.custom_mask,
            causal,
            md.mask_indptr,
            md.max_extend_len,
            layer.scaling,
        )
        return o

    def forward_decode(self, q, k, v, layer, forward_batch: ForwardBatch, save_kv_cache: bool = True):
        q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)
        o = torch.empty_like(q)
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(
                layer,
                forward_batch.out_cache_loc,
                k.reshape(-1, layer.tp_k_head_num, layer.head_dim),
                v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim),
            )
        md = self.forward_metadata
        decode_attention_fwd(
            q,
            forward_batch.token_to_kv_pool.get_key_buffer(layer.layer_id),
            forward_batch.token_to_kv_pool.get_value_buffer(layer.layer_id),
            o,
            md.kv_indptr,
            md.kv_indices,
            md.attn_logits,
            md.attn_lse,
            md.num_kv_splits,
            self.max_kv_splits,
            layer.scaling,
        )
        return o
