"""The bits of the engine's model runner that an attention backend reads at init.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch

from sglfix.backends.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


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
