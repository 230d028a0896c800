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
    # Multi-head latent attention (DeepSeek-style; None for MHA/GQA models). With MLA the
    # pool is an MLATokenToKVPool and queries are absorbed: head_dim = kv_lora_rank +
    # qk_rope_head_dim, v_head_dim = kv_lora_rank.
    kv_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    qk_nope_head_dim: Optional[int] = None
    # The engine's context length (model_config.context_len): sizes graph buffers.
    context_len: Optional[int] = None

    @property
    def use_mla_backend(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def scaling(self) -> float:
        """Softmax scale of the model (MLA: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim))."""
        if self.use_mla_backend:
            return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        return self.head_dim ** -0.5
