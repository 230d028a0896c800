"""The scheduler's view of a batch, as far as the spec-v2 draft-extend step reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglfix.backends.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardMode


@dataclass
class ScheduleBatch:
    """The scheduler's view of a spec-v2 batch before the draft-extend step.

    ``seq_lens`` counts the tokens already in the cache (the prefix);
    ``out_cache_loc`` holds the slots of the ``num_draft_tokens`` window that
    verify allocated (and wrote into ``req_to_token``) right after the prefix.
    """

    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    forward_mode: ForwardMode = ForwardMode.DECODE
    seq_lens_cpu: Optional[torch.Tensor] = None
    seq_lens_sum: Optional[int] = None
    positions: Optional[torch.Tensor] = None
