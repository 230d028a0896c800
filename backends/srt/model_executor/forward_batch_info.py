"""Forward modes and the forward batch: everything one forward of the attention layers reads.

The ``*_cpu`` mirrors may be None on the spec-v2 ``gpu_only`` path, which avoids
device->host syncs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch

from sglfix.backends.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglfix.backends.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput


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
