"""Static (CUDA-graph) buffers with guard zones.

A captured graph bakes the addresses of its buffers, so every static buffer is
allocated once and reused by every replay. An undersized buffer does not crash:
the kernel writes past its end into whatever lies next. To make such a write
visible, each buffer is carved out of a larger flat allocation whose tail (the
guard zone) is filled with a sentinel bit pattern. The judge (``sglfix.harness.guards``,
outside the patchable code) later reports any buffer whose guard zone no longer holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

# Elements of guard after each buffer: at least GUARD, and as many as the buffer
# itself holds (up to MAX_GUARD), so that a kernel overflowing by up to a whole
# buffer writes into the guard rather than into a neighbouring allocation. An
# overflow by more is still caught as long as its first out-of-bounds element is
# written.
GUARD = 256
MAX_GUARD = 1 << 20


def guard_elements(numel: int) -> int:
    return max(GUARD, min(numel, MAX_GUARD))

# One byte repeated: finite as fp16/bf16/fp32 (so it never produces NaN by
# itself) and, as an integer, a slot/page index far outside any pool.
_SENTINEL_BYTE = 0x5A

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _sentinel_value(itemsize: int) -> int:
    value = 0
    for _ in range(itemsize):
        value = (value << 8) | _SENTINEL_BYTE
    if itemsize > 1 and value >= 1 << (8 * itemsize - 1):
        value -= 1 << (8 * itemsize)
    return value


@dataclass
class StaticBuffer:
    """One registered allocation: the flat storage and where the guard starts."""

    name: str
    flat: torch.Tensor
    numel: int
    shape: tuple

    def guard_bits(self) -> torch.Tensor:
        guard = self.flat[self.numel :]
        return guard.view(_INT_VIEW[guard.element_size()])

    def fill_guard(self) -> None:
        bits = self.guard_bits()
        bits.fill_(_sentinel_value(self.flat.element_size()))


def alloc_static(
    shape: Sequence[int] | int,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    name: str,
    registry: list[StaticBuffer],
    fill: float | int | bool = 0,
) -> torch.Tensor:
    """Allocate a static buffer followed by a guard zone and register it.

    Returns a contiguous view of exactly ``prod(shape)`` elements, filled with
    ``fill``; the guard zone after it is only reachable by an out-of-bounds write.
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    # bool has no same-size integer view in every torch version: store as uint8
    # and hand out a bool view of the same bytes.
    storage_dtype = torch.uint8 if dtype == torch.bool else dtype
    flat = torch.empty(numel + guard_elements(numel), dtype=storage_dtype, device=device)
    entry = StaticBuffer(name=name, flat=flat, numel=numel, shape=shape)
    entry.fill_guard()
    flat[:numel].fill_(fill)
    registry.append(entry)
    view = flat[:numel]
    if dtype == torch.bool:
        view = view.view(torch.bool)
    return view.view(shape)
