"""A seeded, scattering page allocator: a wrong index lands on another request's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Optional

import torch


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
