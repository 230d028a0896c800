"""KV memory: the request-to-token table, the paged MHA KV pool and the MLA latent pool.

Conventions (as upstream): request pool index 0 and KV page 0 are reserved; CUDA-graph padding
points padded rows at request 0 (whose ``req_to_token`` row is all zeros) and writes padded
tokens into slot 0, so padding never touches a real request's data. ``req_to_token[req, pos]``
is a token slot (``page * page_size + offset``) whatever the page size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch


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


class MLATokenToKVPool:
    """Latent KV cache of multi-head latent attention: one KV head per token holding
    ``kv_lora_rank`` compressed-KV values followed by ``qk_rope_head_dim`` RoPE values.

    ``kv_buffer[layer]`` has shape ``[num_slots, 1, kv_lora_rank + qk_rope_head_dim]``;
    slots are token-granular (``page * page_size + offset``) as in the MHA pool, so a paged
    kernel views it as ``[num_pages, page_size, 576]``.
    """

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device | str,
    ):
        self.page_size = page_size
        self.size = size
        self.dtype = dtype
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.head_num = 1
        self.head_dim = self.kv_cache_dim
        self.layer_num = layer_num
        self.device = torch.device(device)
        self.kv_buffer = [
            torch.zeros((size + page_size, 1, self.kv_cache_dim), dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]

    @property
    def num_slots(self) -> int:
        return self.kv_buffer[0].shape[0]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[layer_id][..., : self.kv_lora_rank]

    def set_mla_kv_buffer(self, layer, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                          cache_k_rope: torch.Tensor) -> None:
        buf = self.kv_buffer[layer.layer_id]
        buf[loc, :, : self.kv_lora_rank] = cache_k_nope.reshape(-1, 1, self.kv_lora_rank).to(self.dtype)
        buf[loc, :, self.kv_lora_rank :] = cache_k_rope.reshape(-1, 1, self.qk_rope_head_dim).to(self.dtype)
