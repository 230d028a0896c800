"""Speculative-decoding inputs handed to the attention backends (draft extend, target verify).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch


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
