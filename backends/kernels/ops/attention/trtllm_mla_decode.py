"""A stand-in for FlashInfer's trtllm-gen MLA kernel (``flashinfer.decode.
trtllm_batch_decode_with_kv_cache_mla``), which only runs on Blackwell.

It consumes exactly what the trtllm backend hands the real kernel: a dense block table
``[bs, max_blocks]`` of page ids, ``seq_lens`` (the backend's ``seq_lens_k``), the query laid
out as ``[bs, q_len, heads, kv_lora_rank + qk_rope_head_dim]`` and the paged latent cache.
Query row ``j`` of request ``b`` sees the KV positions ``< seq_lens[b] - q_len + j + 1``
(causal, aligned to the end of the sequence), so a wrong ``seq_lens`` or block table gives
wrong numbers here exactly as it does on the real kernel.

- CPU (and CUDA without FlashInfer): a batched torch kernel, ``trtllm_batch_decode_with_kv_cache_mla``.
- CUDA with FlashInfer: ``BatchMLAPagedAttentionWrapper`` over the same block table. FlashInfer
  plans on the host, the trtllm-gen kernel does not: ``TrtllmMLADecodeStandIn.prepare`` is that
  host plan, which the backend calls right after each metadata init (eager, capture, replay),
  outside any captured graph; ``__call__`` is the graph-safe run.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import StaticBuffer, alloc_static

# FlashInfer's usual float workspace for the MLA wrappers.
_FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024


def trtllm_batch_decode_with_kv_cache_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: Optional[torch.Tensor],
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    bmm1_scale: float,
) -> torch.Tensor:
    """query [bs, q_len, H, 576], kv_cache [num_pages, 1, page_size, 576] (or without the 1)
    -> out [bs, q_len, H, kv_lora_rank] in the query's dtype.

    Scores ``q . k[:576] * bmm1_scale`` and values ``k[:kv_lora_rank]`` in float32. Reads no
    tensor back to the host (graph-safe): ``max_seq_len`` bounds the pages gathered, as it
    bounds what the real kernel schedules. A query row that sees nothing (padded rows) gives
    zeros. ``workspace_buffer`` and ``qk_nope_head_dim`` are accepted for the real signature.
    """
    del workspace_buffer, qk_nope_head_dim
    bs, q_len, num_heads, dim = query.shape
    if dim != kv_lora_rank + qk_rope_head_dim:
        raise ValueError(f"query head dim {dim} != kv_lora_rank + qk_rope_head_dim")
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(1)
    page_size = kv_cache.shape[1]
    width = block_tables.shape[1]
    num_blocks = max(1, min(width, -(-int(max_seq_len) // page_size)))
    device = query.device

    seq = seq_lens[:bs].to(torch.int64)
    live = torch.arange(num_blocks, device=device)[None, :] < ((seq + page_size - 1) // page_size)[:, None]
    # Entries past a row's live pages are -1 or stale: never read, so point them at page 0.
    pages = torch.where(live, block_tables[:bs, :num_blocks].to(torch.int64), 0)
    kv = kv_cache[pages].reshape(bs, num_blocks * page_size, dim).float()

    scores = torch.einsum("bqhd,bld->bhql", query.float(), kv) * bmm1_scale
    pos = torch.arange(num_blocks * page_size, device=device)
    limit = seq[:, None] - q_len + torch.arange(q_len, device=device)[None, :] + 1  # [bs, q_len]
    visible = (pos[None, None, :] < limit[:, :, None])[:, None]  # [bs, 1, q_len, L]
    any_visible = visible.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~visible, float("-inf")).masked_fill(~any_visible, 0.0)
    probs = torch.softmax(scores, dim=-1) * any_visible
    out = torch.einsum("bhql,bld->bqhd", probs, kv[..., :kv_lora_rank])
    return out.to(query.dtype)


def _flashinfer_mla():
    """FlashInfer's MLA module on a CUDA machine that has it, else None."""
    if not torch.cuda.is_available():
        return None
    try:
        import flashinfer.mla as flashinfer_mla
    except ImportError:
        return None
    return flashinfer_mla


class TrtllmMLADecodeStandIn:
    """The kernel the trtllm backend calls, with a host ``prepare`` step (FlashInfer's plan).

    Graph mode (``init_cuda_graph_state``, then ``prepare(..., graph_bs=bs)``): one FlashInfer
    wrapper per captured batch size, planned with ``use_cuda_graph=True`` over reserved
    metadata buffers (slices of static buffers sized for max_bs, as the engine's FlashInfer MLA
    backend does), re-planned in place before every replay. The torch kernel needs no plan:
    ``prepare`` then only records the shapes it promised, which ``__call__`` checks.
    """

    def __init__(
        self,
        *,
        device: torch.device,
        num_heads: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        page_size: int,
        dtype: torch.dtype,
    ):
        self.device = torch.device(device)
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.page_size = page_size
        self.dtype = dtype
        self.flashinfer_mla = _flashinfer_mla() if self.device.type == "cuda" else None
        if self.flashinfer_mla is not None:
            self.workspace_buffer = torch.empty(
                _FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device
            )
        else:
            self.workspace_buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._eager_wrapper = None
        self._graph_wrappers: dict[int, object] = {}
        self._graph_buffers: Optional[dict[str, torch.Tensor]] = None
        # (wrapper or None, bs, q_len, sm_scale, out buffer or None) of the last prepare.
        self._planned: Optional[tuple] = None

    @property
    def uses_flashinfer(self) -> bool:
        return self.flashinfer_mla is not None

    def init_cuda_graph_state(
        self, *, max_bs: int, max_q_len: int, max_blocks: int, registry: list[StaticBuffer]
    ) -> None:
        """Reserved FlashInfer metadata and output buffers for graph mode (CUDA only)."""
        if not self.uses_flashinfer:
            return
        dev = self.device

        def static(shape, dtype, name):
            return alloc_static(shape, dtype=dtype, device=dev, name=f"trtllm_mla_decode.{name}",
                                registry=registry)

        self._graph_buffers = {
            "qo_indptr": static((max_bs + 1,), torch.int32, "qo_indptr"),
            "kv_indptr": static((max_bs + 1,), torch.int32, "kv_indptr"),
            "kv_indices": static((max_bs * max_blocks,), torch.int32, "kv_indices"),
            "kv_len_arr": static((max_bs,), torch.int32, "kv_len_arr"),
            "out": static((max_bs * max_q_len, self.num_heads, self.kv_lora_rank), self.dtype, "out"),
        }

    # ------------------------------------------------------------------ host plan

    def prepare(
        self,
        *,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        q_len: int,
        sm_scale: float,
        graph_bs: Optional[int] = None,
    ) -> None:
        """Plan the next call(s) for ``block_tables``/``seq_lens`` as they are now.

        On CUDA with FlashInfer this reads ``seq_lens`` to the host (FlashInfer's scheduler
        splits work by KV length), so it must run outside a captured graph.
        """
        bs = block_tables.shape[0]
        if not self.uses_flashinfer:
            self._planned = (None, bs, q_len, sm_scale, None)
            return
        fi = self.flashinfer_mla
        if graph_bs is not None and self._graph_buffers is not None:
            wrapper = self._graph_wrappers.get(bs)
            if wrapper is None:
                buf = self._graph_buffers
                wrapper = fi.BatchMLAPagedAttentionWrapper(
                    self.workspace_buffer,
                    use_cuda_graph=True,
                    qo_indptr=buf["qo_indptr"][: bs + 1],
                    kv_indptr=buf["kv_indptr"][: bs + 1],
                    kv_indices=buf["kv_indices"],
                    kv_len_arr=buf["kv_len_arr"][:bs],
                )
                self._graph_wrappers[bs] = wrapper
            out = self._graph_buffers["out"][: bs * q_len]
        else:
            if self._eager_wrapper is None:
                self._eager_wrapper = fi.BatchMLAPagedAttentionWrapper(self.workspace_buffer)
            wrapper = self._eager_wrapper
            out = None
        cum_seq_lens_q = torch.arange(
            0, (bs + 1) * q_len, step=q_len, dtype=torch.int32, device=self.device
        )
        # The dense form is the trtllm-gen interface itself; FlashInfer derives its CSR from
        # it (live pages only: a CSR over whole table rows fails its page-count check).
        wrapper.plan(
            metadata=fi.MLAPlanMetadata.dense(
                cum_seq_lens_q=cum_seq_lens_q,
                block_tables=block_tables.contiguous(),
                # trtllm-gen reads no key for a length <= 0 (padded rows of a corrupt replay);
                # FlashInfer's plan refuses one. Such rows are never returned, so plan them
                # with one key instead of failing the whole batch.
                seq_lens=seq_lens[:bs].to(torch.int32).clamp(min=1).contiguous(),
                max_q_len=q_len,
            ),
            num_heads=self.num_heads,
            head_dim_ckv=self.kv_lora_rank,
            head_dim_kpe=self.qk_rope_head_dim,
            page_size=self.page_size,
            causal=True,
            sm_scale=float(sm_scale),
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._planned = (wrapper, bs, q_len, float(sm_scale), out)

    # ------------------------------------------------------------------ the run

    def __call__(
        self,
        *,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        workspace_buffer: Optional[torch.Tensor],
        qk_nope_head_dim: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        max_seq_len: int,
        bmm1_scale: float,
    ) -> torch.Tensor:
        if self._planned is None:
            raise RuntimeError("trtllm MLA stand-in called before prepare()")
        wrapper, bs, q_len, sm_scale, out = self._planned
        if tuple(query.shape[:2]) != (bs, q_len):
            raise RuntimeError(
                f"query laid out as {tuple(query.shape[:2])}, but prepared for (bs, q_len) = {(bs, q_len)}"
            )
        if wrapper is None:
            return trtllm_batch_decode_with_kv_cache_mla(
                query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank,
                qk_rope_head_dim, block_tables, seq_lens, max_seq_len, bmm1_scale,
            )
        if float(bmm1_scale) != sm_scale:
            raise RuntimeError(f"bmm1_scale {bmm1_scale} differs from the planned sm_scale {sm_scale}")
        dim = kv_lora_rank + qk_rope_head_dim
        packed_q = query.reshape(bs * q_len, self.num_heads, dim)
        packed_kv = kv_cache.reshape(-1, self.page_size, dim)
        o = wrapper.run(query=packed_q, kv_cache=packed_kv, out=out)
        return o.view(bs, q_len, self.num_heads, kv_lora_rank)
