"""The DeepSeek-V4 attention backend, decode path of its sliding-window (SWA) layers: plain decode
(eager and CUDA graphs) and the multi-step EAGLE draft (``DeepseekV4MultiStepBackend``: one child
backend per draft step, each with its ``speculative_step_id``).

Mirrors the engine's ``deepseek_v4_backend`` at v0.5.13 (names, metadata fields, the decode
metadata and its one-row-per-request assertion, ``init_forward_metadata_out_graph`` for capture
and replay). Unlike most backends, DSv4 computes its KV write target when it builds the metadata
(``raw_out_loc``; upstream's compressors read their ``c4``/``c128`` locations from it) instead of
reading ``forward_batch.out_cache_loc`` in forward. The multi-step draft allocates
``out_cache_loc`` for all steps at once, laid out [bs, topk, num_steps], and its non-graph init
hands every child that whole buffer: PR 26239's fix has each child take its own step's slice
(``per_step_draft_out_cache_loc``) before ``init_forward_metadata_decode``, whose assertion
otherwise fires. CUDA-graph capture passes one dummy location per request and replay pads or
truncates to the graph's batch size, so graphs never reach that assertion.

Where the KV write goes (``get_swa_out_cache_loc``): eagerly, at the location baked into the
metadata (``swa_out_cache_loc``, the SWA view of ``raw_out_loc``). Upstream computes that field
inside its captured graphs (``init_forward_metadata_in_graph``, re-slicing the live all-steps
buffer per step); the runners here record no in-graph init, so graph metadata leaves it unset and
the store falls back, as upstream does for runners that only run the out-of-graph init, to
``forward_batch.out_cache_loc`` at forward time: the worker's ``draft_forward`` points it at the
step's slice of the static buffer, so a replay writes each step's live slots, with or without
PR 26239.

Left out: the compressed caches (c4 / c128 compressors, the C4 indexer and their metadata), the
FP8 SWA cache and its separate ring pool (the SWA cache here is the MLA latent pool, so
``translate_loc_from_full_to_swa`` is the identity), attention sinks, context parallelism, the
prefill / target-verify / draft-extend modes, the breakable-graph and prep-in-graph paths.
Queries are absorbed MLA (q [T, H, kv_lora_rank + qk_rope_head_dim], out [T, H, kv_lora_rank])
with the layer's softmax scale, the shapes of the other MLA cases, not DSv4's 512-dim MQA.

Reproduction changes, each marked where it sits: a draft child's window covers the step's own
draft tokens (seq lens + step + 1; upstream gives every step the batch's seq_lens); graph replay
of the multi-step backend refreshes every child (upstream refreshes child 0 and copies it to the
others, which only holds while the steps' metadata are the same); captured metadata lives in
registered static buffers (``alloc_static``, guard zones). PR 26239's slice sits on its own lines
so that ``toggles/26239.yaml`` can revert it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from sglfix.backends.kernels.ops.attention.swa_decode import store_kv_at_locs, swa_decode_attention_fwd
from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import StaticBuffer, alloc_static
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglfix.backends.srt.model_executor.model_runner import ModelRunner
from sglfix.backends.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

SWA_WINDOW = 128
PAGE_INDEX_ALIGNED_SIZE = 64


def _pad_last_dim(x: torch.Tensor, multiples_of: int = PAGE_INDEX_ALIGNED_SIZE) -> torch.Tensor:
    # FlashMLA's sparse indices come in multiples of 64 columns; -1 marks no entry.
    target = -(-x.shape[-1] // multiples_of) * multiples_of
    return F.pad(x, pad=(0, target - x.shape[-1]), mode="constant", value=-1)


@dataclass
class DSV4AttnMetadata:
    """One forward's SWA metadata, one row per query (one per request in decode)."""

    page_size: int
    # [rows, ceil(max_seq_len / page_size)] page ids: the compressors' page table.
    page_table: torch.Tensor
    # [rows] the KV write target, baked when the metadata is built.
    raw_out_loc: torch.Tensor
    seq_lens_casual: torch.Tensor
    positions_casual: torch.Tensor
    # [rows, 128] the window's slots (newest first, -1 past the sequence start) and its length.
    swa_page_indices: torch.Tensor
    swa_topk_lengths: torch.Tensor
    # The SWA store's target (raw_out_loc in SWA space); set by the eager init only (see module doc).
    swa_out_cache_loc: Optional[torch.Tensor] = None

    @property
    def positions(self) -> torch.Tensor:
        return self.positions_casual

    def copy_(self, other: DSV4AttnMetadata) -> None:
        """Refresh a captured metadata in place: its tensors are what the graph reads."""
        assert self.page_size == other.page_size
        for name in ("page_table", "raw_out_loc", "seq_lens_casual", "positions_casual",
                     "swa_page_indices", "swa_topk_lengths"):
            dst, src = getattr(self, name), getattr(other, name)
            assert dst.shape == src.shape, f"{name}: captured {tuple(dst.shape)}, replay {tuple(src.shape)}"
            dst.copy_(src)
        # Recomputed in graph upstream; never baked into graph metadata here.
        self.swa_out_cache_loc = other.swa_out_cache_loc


@dataclass
class DSV4Metadata:
    core_attn_metadata: DSV4AttnMetadata

    @property
    def core_metadata(self) -> DSV4AttnMetadata:
        return self.core_attn_metadata

    def copy_(self, other: DSV4Metadata) -> None:
        self.core_attn_metadata.copy_(other.core_attn_metadata)


class _GraphBucket(enum.Enum):
    DECODE_OR_IDLE = "decode_or_idle"

    @classmethod
    def of(cls, forward_mode: ForwardMode) -> _GraphBucket:
        if forward_mode.is_decode_or_idle():
            return cls.DECODE_OR_IDLE
        raise NotImplementedError(f"{forward_mode.name}: only the decode path is reproduced")


class DeepseekV4AttnBackend:
    """DeepSeek-V4 attention (SWA layers, decode)."""

    def __init__(
        self,
        model_runner: ModelRunner,
        skip_prefill: bool = False,
        speculative_step_id: int = 0,
        topk: int = 0,
        speculative_num_steps: int = 0,
    ):
        self.device = torch.device(model_runner.device)
        self.cuda_int32_kwargs = {"device": self.device, "dtype": torch.int32}
        self.swa_page_size = 128
        assert model_runner.page_size is not None
        assert model_runner.req_to_token_pool is not None
        self.page_size = model_runner.page_size
        assert self.page_size == 256, "the system hardcodes page_size=256"
        assert model_runner.use_mla_backend, "the SWA cache here is the MLA latent pool"

        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.MAX_SEQ_LEN_FOR_CAPTURE = self.req_to_token.shape[1]

        # As upstream, the engine's topk (not the argument) decides whether MTP is on.
        self.topk = model_runner.speculative_eagle_topk or 0
        assert self.topk in [0, 1], "MTP Topk > 1 not supported for DeepSeek V4"
        self.mtp_enabled = self.topk > 0
        self.speculative_num_steps = speculative_num_steps
        self.speculative_num_draft_tokens = model_runner.speculative_num_draft_tokens
        self.speculative_step_id = speculative_step_id
        self.forward_metadata: Optional[DSV4Metadata] = None

        # Every buffer a captured graph reads, with guard zones.
        self.static_buffers: list[StaticBuffer] = []
        self.cuda_graph_metadata_of_bucket_and_bs: Dict[_GraphBucket, Dict[int, DSV4Metadata]] = {
            bucket: {} for bucket in _GraphBucket
        }
        # Upstream v0.5.12's runner set this out of band before a replay; ours does not.
        self._replay_forward_batch: Optional[ForwardBatch] = None

    # ------------------------------------------------------------------ metadata

    def translate_loc_from_full_to_swa(self, loc: torch.Tensor) -> torch.Tensor:
        # The SWA cache is the latent pool itself: full and SWA slots coincide.
        return loc

    def _draft_tokens_seen(self) -> int:
        # Reproduction: a draft child's query sits after the step's own draft token, so its window
        # ends there (upstream hands every step the batch's seq_lens).
        if self.topk > 0 and self.speculative_num_steps > 1:
            return self.speculative_step_id + 1
        return 0

    def init_forward_metadata_decode(
        self,
        max_seq_len: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
    ) -> DSV4Metadata:
        assert (
            req_pool_indices.shape[0] == seq_lens.shape[0] == out_cache_loc.shape[0]
        ), f"{req_pool_indices.shape=} {seq_lens.shape=} {out_cache_loc.shape=}"

        seen = self._draft_tokens_seen()
        core_attn_metadata = self.make_core_attn_metadata(
            req_to_token=self.req_to_token,
            req_pool_indices_repeated=req_pool_indices,
            seq_lens_casual=seq_lens + seen,
            max_seq_len=min(max_seq_len + seen, self.MAX_SEQ_LEN_FOR_CAPTURE),
            out_loc=out_cache_loc,
        )
        return DSV4Metadata(core_attn_metadata)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if self.mtp_enabled and forward_batch.forward_mode.is_idle():
            return

        self.forward_metadata = self._build_forward_metadata(forward_batch)
        core = self.forward_metadata.core_attn_metadata
        core.swa_out_cache_loc = self.translate_loc_from_full_to_swa(core.raw_out_loc)

    def _build_forward_metadata(self, forward_batch: ForwardBatch) -> DSV4Metadata:
        req_pool_indices = forward_batch.req_pool_indices
        seq_lens = forward_batch.seq_lens.to(torch.int32)
        seq_lens_cpu = forward_batch.seq_lens_cpu
        assert self.req_to_token_pool.req_to_token is self.req_to_token

        assert self.swa_page_size % SWA_WINDOW == 0 and self.page_size % 128 == 0
        assert seq_lens_cpu is not None
        max_seq_len = int(seq_lens_cpu.max().item())

        if forward_batch.forward_mode.is_decode_or_idle():
            # DSv4 bakes this step's KV write target into metadata, so slice the shared
            # multi-step out_cache_loc now, not at forward time.
            out_cache_loc = forward_batch.out_cache_loc
            # PR 26239: a multi-step draft child takes its own step's slots.
            if self.topk > 0 and self.speculative_num_steps > 1:
                out_cache_loc = per_step_draft_out_cache_loc(
                    out_cache_loc, bs=forward_batch.batch_size, topk=self.topk, num_steps=self.speculative_num_steps
                )[self.speculative_step_id]
            metadata = self.init_forward_metadata_decode(
                max_seq_len=max_seq_len,
                req_pool_indices=req_pool_indices,
                seq_lens=seq_lens,
                out_cache_loc=out_cache_loc,
            )
        else:
            raise NotImplementedError(f"{forward_batch.forward_mode.name}: only the decode path is reproduced")
        return metadata

    def make_core_attn_metadata(
        self,
        req_to_token: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
        seq_lens_casual: torch.Tensor,
        max_seq_len: int,
        out_loc: torch.Tensor,
    ) -> DSV4AttnMetadata:
        assert self.swa_page_size == SWA_WINDOW

        swa_page_indices = self.get_swa_page_indices(
            seq_lens_casual=seq_lens_casual,
            req_pool_indices_repeated=req_pool_indices_repeated,
        )
        swa_page_indices = _pad_last_dim(swa_page_indices, multiples_of=PAGE_INDEX_ALIGNED_SIZE)

        raw_positions = seq_lens_casual - 1
        swa_topk_lengths = torch.clamp(seq_lens_casual, max=SWA_WINDOW)

        page_table = req_to_token[req_pool_indices_repeated, : max_seq_len : self.page_size]
        page_table = (page_table // self.page_size).to(torch.int32)

        return DSV4AttnMetadata(
            page_size=self.page_size,
            page_table=page_table,
            raw_out_loc=out_loc,
            seq_lens_casual=seq_lens_casual,
            positions_casual=raw_positions,
            swa_page_indices=swa_page_indices,
            swa_topk_lengths=swa_topk_lengths,
        )

    def get_swa_page_indices(
        self,
        seq_lens_casual: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
    ) -> torch.Tensor:
        pos_causal = seq_lens_casual - 1
        num_qo_tokens = seq_lens_casual.size(0)
        offsets = pos_causal.unsqueeze(1) - torch.arange(SWA_WINDOW, **self.cuda_int32_kwargs).unsqueeze(0)
        invalid_offset_mask = offsets < 0
        offsets.masked_fill_(invalid_offset_mask, 0)
        raw_indices = self.req_to_token[req_pool_indices_repeated[:, None], offsets]
        assert raw_indices.shape == (num_qo_tokens, SWA_WINDOW)
        raw_indices.masked_fill_(invalid_offset_mask, -1)
        swa_indices = self.translate_loc_from_full_to_swa(raw_indices)
        return swa_indices.to(torch.int32)

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        # Reproduction: upstream keeps the capture-time tensors; here every tensor a graph reads is
        # a registered static buffer, and each captured bs views its first rows.
        rows = max(max_bs, max_num_tokens)
        columns = len(range(0, self.MAX_SEQ_LEN_FOR_CAPTURE, self.page_size))
        reg = self.static_buffers

        def static(name, shape, dtype, fill=0):
            return alloc_static(shape, dtype=dtype, device=self.device, name=f"dsv4.{name}", registry=reg, fill=fill)

        self.cuda_graph_buffers = {
            "page_table": static("page_table", (rows, columns), torch.int32),
            "raw_out_loc": static("raw_out_loc", (rows,), torch.int64),
            "seq_lens_casual": static("seq_lens_casual", (rows,), torch.int32, fill=1),
            "positions_casual": static("positions_casual", (rows,), torch.int32),
            "swa_page_indices": static("swa_page_indices", (rows, SWA_WINDOW), torch.int32, fill=-1),
            "swa_topk_lengths": static("swa_topk_lengths", (rows,), torch.int32, fill=1),
        }
        self.cuda_graph_metadata_of_bucket_and_bs = {bucket: {} for bucket in _GraphBucket}

    def _static_metadata(self, rows: int) -> DSV4Metadata:
        views = {name: buf[:rows] for name, buf in self.cuda_graph_buffers.items()}
        return DSV4Metadata(DSV4AttnMetadata(page_size=self.page_size, **views))

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        bucket = _GraphBucket.of(forward_batch.forward_mode)
        bs = forward_batch.batch_size
        req_pool_indices = forward_batch.req_pool_indices
        seq_lens = forward_batch.seq_lens

        if in_capture:
            # Captured graph does no real cache writes, so synthesize a dummy
            # out_cache_loc (replay supplies the real value).
            assert req_pool_indices.size(0) == bs
            assert seq_lens.size(0) == bs
            out_cache_loc = torch.zeros_like(seq_lens)
            seq_lens_cpu = seq_lens.cpu()
        else:
            out_cache_loc = forward_batch.out_cache_loc
            seq_lens_cpu = forward_batch.seq_lens_cpu

        assert seq_lens_cpu is not None
        seq_lens = seq_lens[:bs].to(torch.int32)
        seq_lens_cpu = seq_lens_cpu[:bs]
        req_pool_indices = req_pool_indices[:bs]

        actual_max_seq_len = int(seq_lens_cpu.max().item())
        chosen_max_seq_len = self.MAX_SEQ_LEN_FOR_CAPTURE
        assert actual_max_seq_len <= chosen_max_seq_len

        assert out_cache_loc is not None
        assert len(out_cache_loc.shape) == 1, f"{out_cache_loc.shape=}"
        # Pads short, truncates long (a multi-step draft hands its all-steps buffer): one entry per
        # request either way. It only feeds raw_out_loc; a graph's SWA store reads the live batch.
        out_cache_loc_padded = F.pad(out_cache_loc, pad=(0, bs - len(out_cache_loc)), mode="constant", value=0)
        temp_metadata = self.init_forward_metadata_decode(
            max_seq_len=chosen_max_seq_len,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            out_cache_loc=out_cache_loc_padded,
        )
        self.replay_cuda_graph_metadata_from(bs=bs, temp_metadata=temp_metadata, bucket=bucket)

    def replay_cuda_graph_metadata_from(self, bs: int, temp_metadata: DSV4Metadata, bucket: _GraphBucket) -> None:
        if bs not in self.cuda_graph_metadata_of_bucket_and_bs[bucket]:
            # First call (from capture): the static buffers take the metadata.
            self.cuda_graph_metadata_of_bucket_and_bs[bucket][bs] = self._static_metadata(
                temp_metadata.core_attn_metadata.seq_lens_casual.shape[0]
            )
        chosen_metadata = self.cuda_graph_metadata_of_bucket_and_bs[bucket][bs]
        chosen_metadata.copy_(temp_metadata)
        self.forward_metadata = chosen_metadata

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info,
    ) -> None:
        # The runners here call the v0.5.12 entry points; v0.5.13 runs both through the out-graph init.
        assert encoder_lens is None, "encoder-decoder models are not reproduced"
        batch = SimpleNamespace(
            batch_size=bs, forward_mode=forward_mode, req_pool_indices=req_pool_indices[:bs],
            seq_lens=seq_lens[:bs], seq_lens_cpu=None, out_cache_loc=None,
        )
        self.init_forward_metadata_out_graph(batch, in_capture=True)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        encoder_lens: Optional[torch.Tensor],
        forward_mode: ForwardMode,
        spec_info,
        seq_lens_cpu: Optional[torch.Tensor],
    ) -> None:
        # v0.5.12 read the replay's out_cache_loc from _replay_forward_batch, set out of band by its
        # runner. Without it raw_out_loc keeps capture's dummy slots; the store reads the live batch.
        fb = self._replay_forward_batch
        out_cache_loc = fb.out_cache_loc if fb is not None else torch.zeros(bs, dtype=torch.int64, device=self.device)
        batch = SimpleNamespace(
            batch_size=bs, forward_mode=forward_mode, req_pool_indices=req_pool_indices,
            seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu, out_cache_loc=out_cache_loc,
        )
        self.init_forward_metadata_out_graph(batch)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    # ------------------------------------------------------------------ forward

    def get_swa_out_cache_loc(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """The SWA KV-store write target: the location baked into the metadata when there is one
        for this batch (eager), else ``out_cache_loc`` at forward time (graphs, see module doc)."""
        out_cache_loc = forward_batch.out_cache_loc
        core = getattr(self.forward_metadata, "core_attn_metadata", None)
        cached = core.swa_out_cache_loc if core is not None else None
        if (
            cached is not None
            and not forward_batch.forward_mode.is_idle()
            and cached.shape[0] == out_cache_loc.shape[0]
        ):
            return cached
        return self.translate_loc_from_full_to_swa(out_cache_loc)

    def store_cache(self, layer, swa_k: torch.Tensor, forward_batch: ForwardBatch) -> None:
        swa_loc = self.get_swa_out_cache_loc(forward_batch)
        store_kv_at_locs(swa_k, swa_loc, self.token_to_kv_pool.get_key_buffer(layer.layer_id))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: Optional[torch.Tensor],
        layer,
        forward_batch: ForwardBatch,
        compress_ratio: int = 0,
        save_kv_cache: bool = True,
        **_,
    ) -> torch.Tensor:
        if self.mtp_enabled and forward_batch.forward_mode.is_idle():
            return q.new_empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim)
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, compress_ratio, save_kv_cache)
        raise NotImplementedError(f"{forward_batch.forward_mode.name}: only the decode path is reproduced")

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: Optional[torch.Tensor],
        layer,
        forward_batch: ForwardBatch,
        compress_ratio: int = 0,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        # k carries the whole latent (v is its first kv_lora_rank values): DSv4 shares k and v.
        assert compress_ratio == 0, "compressed caches (c4/c128) are not reproduced"
        core_attn_metadata = self.forward_metadata.core_attn_metadata
        if save_kv_cache and k is not None:
            self.store_cache(layer, k, forward_batch)
        swa_k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)

        q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)

        def match_num_queries(x, value):
            if x.shape[0] == q.shape[0]:
                return x
            if x.shape[0] > q.shape[0]:
                return x[: q.shape[0]]
            return _pad_tensor_to_size(x, q.shape[0], value=value)

        swa_page_indices = match_num_queries(core_attn_metadata.swa_page_indices, value=0)
        swa_topk_lengths = match_num_queries(core_attn_metadata.swa_topk_lengths, value=1)
        assert swa_page_indices.shape[-1] % 64 == 0, f"{swa_page_indices.shape=}'s last dimension is not aligned to 64"

        return swa_decode_attention_fwd(
            q,
            swa_k_cache,
            swa_page_indices,
            swa_topk_lengths,
            v_head_dim=layer.v_head_dim,
            sm_scale=layer.scaling,
        )


class DeepseekV4MultiStepBackend(DeepseekV4AttnBackend):
    """One DeepseekV4AttnBackend per draft step; step i's child has speculative_step_id=i."""

    def __init__(self, model_runner: ModelRunner, topk: int, speculative_num_steps: int):
        super().__init__(model_runner)
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends: List[DeepseekV4AttnBackend] = []
        # Upstream builds num_steps children; the draft runs num_steps - 1 attention steps.
        for i in range(self.speculative_num_steps):
            self.attn_backends.append(
                DeepseekV4AttnBackend(
                    model_runner,
                    speculative_step_id=i,
                    topk=self.topk,
                    speculative_num_steps=self.speculative_num_steps,
                )
            )
        # One registry for the whole draft: the children's graph buffers land in it too.
        for backend in self.attn_backends:
            backend.static_buffers = self.static_buffers

    def _inner_forward_batch(self, forward_batch) -> SimpleNamespace:
        return SimpleNamespace(
            batch_size=forward_batch.batch_size,
            forward_mode=ForwardMode.DECODE,
            positions=getattr(forward_batch, "positions", None),
            req_pool_indices=forward_batch.req_pool_indices,
            seq_lens=forward_batch.seq_lens,
            seq_lens_sum=forward_batch.seq_lens_sum,
            seq_lens_cpu=forward_batch.seq_lens_cpu,
            encoder_lens=None,
            out_cache_loc=getattr(forward_batch, "out_cache_loc", None),
            spec_info=forward_batch.spec_info,
        )

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        inner_fb = self._inner_forward_batch(forward_batch)
        if in_capture:
            for i in range(self.speculative_num_steps):
                self.attn_backends[i].init_forward_metadata_out_graph(inner_fb, in_capture=True)
        else:
            if self.speculative_num_steps == 1:
                return
            # Reproduction: upstream refreshes child 0 and copies its metadata into children
            # 1 .. n-2; a step's window covers its own draft tokens here, so each refreshes its own.
            for i in range(self.speculative_num_steps - 1):
                self.attn_backends[i].init_forward_metadata_out_graph(inner_fb)

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        for i in range(self.speculative_num_steps - 1):
            self.attn_backends[i].init_forward_metadata(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        for i in range(self.speculative_num_steps):
            self.attn_backends[i].init_cuda_graph_state(max_bs, max_num_tokens)

    # The draft runner's v0.5.12 entry points.
    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch):
        self.init_forward_metadata_out_graph(forward_batch, in_capture=True)

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch, bs: int):
        assert forward_batch.batch_size == bs
        self.init_forward_metadata_out_graph(forward_batch)


def _pad_tensor_to_size(tensor: torch.Tensor, size: int, *, value: int = 0):
    return torch.cat([tensor, tensor.new_full((size - tensor.shape[0], *tensor.shape[1:]), value)], dim=0)
