"""Engine-side data the attention backends consume: forward modes, the forward
batch, speculative-decoding inputs, the request-to-token table, the paged KV pool
and a scattered slot allocator.

Names follow the engine (``ForwardMode``, ``ForwardBatch``, ``ReqToTokenPool``,
``MHATokenToKVPool``, ``EagleDraftInput``/``EagleVerifyInput``) so that revert
patches read like the upstream diffs.

Conventions (as upstream):
- request pool index 0 and KV page 0 are reserved: CUDA-graph padding points
  padded rows at request 0 (whose ``req_to_token`` row is all zeros) and writes
  padded tokens into slot 0, so padding never touches a real request's data;
- ``req_to_token[req, pos]`` is a token slot (``page * page_size + offset``);
  the Triton backend works with token slots whatever the page size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch


class ForwardMode(IntEnum):
    # Prefill of new tokens on top of a cached prefix.
    EXTEND = auto()
    # One new token per request.
    DECODE = auto()
    # Nothing to run on this rank.
    IDLE = auto()
    # Speculative decoding: the target model scores a draft tree.
    TARGET_VERIFY = auto()
    # Speculative decoding v1: the draft model extends the accepted tokens.
    DRAFT_EXTEND = auto()
    # Speculative decoding v2 (overlap): the draft model extends a fixed
    # num_draft_tokens window per request.
    DRAFT_EXTEND_V2 = auto()

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        return (
            self == ForwardMode.EXTEND
            or self == ForwardMode.DRAFT_EXTEND
            or self == ForwardMode.TARGET_VERIFY
            or (include_draft_extend_v2 and self == ForwardMode.DRAFT_EXTEND_V2)
        )

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self == ForwardMode.DECODE or self == ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend(self, include_v2: bool = False) -> bool:
        return self == ForwardMode.DRAFT_EXTEND or (
            include_v2 and self == ForwardMode.DRAFT_EXTEND_V2
        )

    def is_draft_extend_v2(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND_V2

    def is_cuda_graph(self) -> bool:
        return self in (
            ForwardMode.DECODE,
            ForwardMode.TARGET_VERIFY,
            ForwardMode.IDLE,
            ForwardMode.DRAFT_EXTEND,
            ForwardMode.DRAFT_EXTEND_V2,
        )


@dataclass
class AttentionLayer:
    """What a ``RadixAttention`` layer tells the backend about itself."""

    layer_id: int
    tp_q_head_num: int
    tp_k_head_num: int
    head_dim: int
    scaling: float
    # Causal within the new tokens; cross/encoder attention is out of scope.
    is_causal: bool = True

    @property
    def tp_v_head_num(self) -> int:
        return self.tp_k_head_num

    @property
    def v_head_dim(self) -> int:
        return self.head_dim


class ReqToTokenPool:
    """Maps (request pool index, token position) to a KV slot."""

    def __init__(self, *, size: int, max_context_len: int, device: torch.device | str):
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        # Row 0 stays all zeros: the padded request of CUDA-graph replays.
        self.req_to_token = torch.zeros(
            (size, max_context_len), dtype=torch.int32, device=self.device
        )


class ScatteredPageAllocator:
    """Hands out KV pages in a seeded random order.

    With contiguous allocation, an indexing bug that is off by a request or a
    page often still reads the right numbers; with pages scattered, a wrong index
    reads another request's (random) K/V and the output diverges. A request's
    tokens fill its pages in order, the pages themselves are scattered.
    """

    def __init__(self, *, num_pages: int, page_size: int, generator: torch.Generator):
        self.page_size = page_size
        self.num_pages = num_pages
        # Page 0 is reserved for padded writes.
        self._free = (torch.randperm(num_pages - 1, generator=generator) + 1).tolist()

    def alloc_pages(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"KV pool exhausted: need {n} pages, {len(self._free)} free")
        pages, self._free = self._free[:n], self._free[n:]
        return pages

    def alloc_token_slots(self, num_tokens: int) -> torch.Tensor:
        """Slots for positions 0..num_tokens-1 of one request (int64, on CPU)."""
        num_pages = -(-num_tokens // self.page_size)
        pages = torch.tensor(self.alloc_pages(num_pages), dtype=torch.int64)
        slots = pages[:, None] * self.page_size + torch.arange(self.page_size)[None, :]
        return slots.reshape(-1)[:num_tokens]


class MHATokenToKVPool:
    """Paged KV cache: per layer, k/v buffers of shape [num_slots, num_kv_heads, head_dim].

    Slots are token-granular (``page * page_size + offset``), as the Triton
    backend addresses them; ``page_size`` only shapes how slots are allocated.
    """

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device | str,
    ):
        self.page_size = page_size
        self.size = size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.layer_num = layer_num
        self.device = torch.device(device)
        # Slot 0..page_size-1 form the reserved padding page.
        self.k_buffer = [
            torch.zeros((size + page_size, head_num, head_dim), dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]
        self.v_buffer = [
            torch.zeros((size + page_size, head_num, head_dim), dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]

    @property
    def num_slots(self) -> int:
        return self.k_buffer[0].shape[0]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id]

    def get_kv_buffer(self, layer_id: int):
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(
        self, layer: AttentionLayer, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        layer_id = layer.layer_id
        if cache_k.dtype != self.dtype:
            cache_k = cache_k.to(self.dtype)
            cache_v = cache_v.to(self.dtype)
        self.k_buffer[layer_id][loc] = cache_k
        self.v_buffer[layer_id][loc] = cache_v


@dataclass
class EagleDraftInput:
    """Spec input of a draft-extend forward (v1 and v2).

    ``accept_length`` counts accepted draft tokens per request (without the bonus
    token): DRAFT_EXTEND v1 extends ``accept_length + 1`` tokens per request.
    ``extend_seq_lens_tensor`` is what the v2 CUDA-graph runner hands the
    backend: the per-request number of new tokens, padded rows included.
    """

    topk: int = 1
    num_steps: int = 1
    num_draft_tokens: int = 2
    accept_length: Optional[torch.Tensor] = None
    accept_length_cpu: Optional[list[int]] = None
    extend_seq_lens_tensor: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[list[int]] = None
    positions: Optional[torch.Tensor] = None
    # Multi-step draft decode hands the backend a ready page table.
    kv_indptr: Optional[torch.Tensor] = None
    kv_indices: Optional[torch.Tensor] = None


@dataclass
class EagleVerifyInput:
    """Spec input of a TARGET_VERIFY forward: the draft tree and its mask.

    ``custom_mask`` is the flattened per-request [num_draft_tokens, seq_len +
    num_draft_tokens] bool mask (prefix columns first), concatenated over
    requests; ``retrive_parent`` gives each draft node's parent (-1 for the root).
    """

    topk: int = 1
    num_steps: int = 1
    num_draft_tokens: int = 2
    custom_mask: Optional[torch.Tensor] = None
    retrive_parent: Optional[torch.Tensor] = None
    positions: Optional[torch.Tensor] = None
    # Non-positive means the backend's capture width (num_draft_tokens).
    num_tokens_per_req: int = -1
    kv_indptr: Optional[torch.Tensor] = None
    kv_indices: Optional[torch.Tensor] = None


@dataclass
class ForwardBatch:
    """Everything one forward of the attention layers reads.

    The ``*_cpu`` mirrors and ``seq_lens_sum`` may be None on the spec-v2
    ``gpu_only`` path, which avoids device->host syncs.
    """

    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    seq_lens_cpu: Optional[torch.Tensor] = None
    seq_lens_sum: Optional[int] = None
    positions: Optional[torch.Tensor] = None
    extend_num_tokens: Optional[int] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[list[int]] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[list[int]] = None
    encoder_lens: Optional[torch.Tensor] = None
    spec_info: Optional[EagleDraftInput | EagleVerifyInput] = None
    # Free-form notes for reports (which builder, gpu_only, ...); never read by backends.
    tags: dict = field(default_factory=dict)


@dataclass
class ModelRunner:
    """The bits of the engine's model runner that an attention backend reads at init."""

    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    page_size: int = 1
    speculative_eagle_topk: int = 1
    speculative_num_steps: int = 1
    speculative_num_draft_tokens: int = 2
    # Decode split-KV fan-out (upstream's --triton-attention-num-kv-splits).
    max_kv_splits: int = 4
