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

    @property
    def tp_v_head_num(self) -> int:
        return self.tp_k_head_num

    @property
    def v_head_dim(self) -> int:
        return self.head_dim
