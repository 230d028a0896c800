"""What an attention layer tells its backend about itself (upstream ``RadixAttention``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch


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
    # MLA (absorbed): head_dim = kv_lora_rank + qk_rope_head_dim, v_head_dim = kv_lora_rank.
    v_head_dim_override: Optional[int] = None
    logit_cap: float = 0.0

    @property
    def tp_v_head_num(self) -> int:
        return self.tp_k_head_num

    @property
    def v_head_dim(self) -> int:
        return self.v_head_dim_override if self.v_head_dim_override is not None else self.head_dim
