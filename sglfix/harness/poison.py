"""Memory a cell allocates without initialising holds a fixed poison pattern, not what was there.

``torch.empty`` returns whatever the allocator hands back: zeros from a fresh page, the previous
cell's values from a recycled block, garbage from the GPU's cache. Code that reads rows it never
wrote (a grid too small to cover an output, a stride that skips rows) then gives a verdict that
depends on the allocator's history: DIVERGE on one run, NAN on the next, PASS when the stale
values happen to be right. While a cell runs, every ``torch.empty``, ``empty_like``,
``empty_strided`` and ``Tensor.new_empty`` called from the code under test or from sglfix's
harness (which builds buffers on the engine's behalf, as the engine's own callers do) is filled
with the pattern below, on CPU and GPU alike, so the same cell reads the same bytes every run.

The pattern is a quiet NaN with a payload for floating types (arithmetic over it gives NaN; a
value copied through untouched keeps its bits, which ``unwritten`` recognises in an output) and
``0xA5`` bytes for the rest (a negative, out-of-pool index in every signed integer type, which the
invariants' range checks name). Allocations made by torch's own code, inside operators, are not
Python calls and are not touched.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["PATTERNS", "poison_", "poisoned", "unwritten"]

# Floating dtype name -> (same-width integer dtype name, bits of a quiet NaN with a payload).
PATTERNS: dict[str, tuple[str, int]] = {
    "float16": ("int16", 0x7E5A),
    "bfloat16": ("int16", 0x7FDA),
    "float32": ("int32", 0x7FDA5A5A),
    "float64": ("int64", 0x7FFA5A5A5A5A5A5A),
}
_BYTE = 0xA5

_SGLFIX_HARNESS = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def poison_(tensor: Any) -> Any:
    """Fill ``tensor`` with the poison pattern of its dtype, in place; returns it."""
    import torch

    if tensor.numel() == 0:
        return tensor
    name = str(tensor.dtype).removeprefix("torch.")
    if name in PATTERNS:
        int_name, bits = PATTERNS[name]
        int_dtype = getattr(torch, int_name)
        width = torch.iinfo(int_dtype).bits
        tensor.view(int_dtype).fill_(_signed(bits, width))
    elif tensor.dtype == torch.bool:
        tensor.view(torch.uint8).fill_(_BYTE)
    elif tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        # fp8 and complex types: every byte 0xA5 (a finite value, but the same one every run).
        tensor.view(torch.uint8).fill_(_BYTE)
    else:
        width = tensor.element_size() * 8
        pattern = int.from_bytes(bytes([_BYTE]) * tensor.element_size(), "little")
        tensor.fill_(_signed(pattern, width) if tensor.dtype.is_signed else pattern)
    return tensor


def unwritten(tensor: Any) -> Any:
    """A boolean mask of ``tensor``'s elements that still hold the poison: the floating poison
    bits, or a bool's byte that is neither 0 nor 1 (a store of a bool writes one of those two;
    read as a bool, the ``0xA5`` poison is True, so a mask nobody filled looks all visible)."""
    import torch

    if tensor.dtype == torch.bool:
        return tensor.contiguous().view(torch.uint8) > 1
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in PATTERNS:
        return torch.zeros(tensor.shape, dtype=torch.bool, device=tensor.device)
    int_name, bits = PATTERNS[name]
    int_dtype = getattr(torch, int_name)
    return tensor.view(int_dtype) == _signed(bits, torch.iinfo(int_dtype).bits)


class _Filter:
    """Whose allocations are poisoned: the code under test's and the harness's, by the calling
    frame's file (decided once per file)."""

    def __init__(self) -> None:
        from sglfix.common.codebase import is_code_under_test

        self._is_code_under_test = is_code_under_test
        self._seen: dict[str, bool] = {}

    def __call__(self, filename: str) -> bool:
        ok = self._seen.get(filename)
        if ok is None:
            ok = self._is_code_under_test(filename) or os.path.abspath(filename).startswith(_SGLFIX_HARNESS)
            self._seen[filename] = ok
        return ok


def _wrap(original: Any, wanted: _Filter) -> Any:
    def allocate(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if wanted(sys._getframe(1).f_code.co_filename):
            poison_(out)
        return out

    allocate.__wrapped__ = original  # type: ignore[attr-defined]
    allocate.__name__ = getattr(original, "__name__", "empty")
    allocate.__doc__ = getattr(original, "__doc__", None)
    return allocate


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    """Within the block, uninitialised allocations by the code under test hold the poison."""
    import torch

    wanted = _Filter()
    saved = [
        (torch, "empty", torch.empty),
        (torch, "empty_like", torch.empty_like),
        (torch, "empty_strided", torch.empty_strided),
        (torch.Tensor, "new_empty", torch.Tensor.new_empty),
    ]
    if getattr(torch.empty, "__wrapped__", None) is not None:  # already inside a poisoned block
        yield
        return
    try:
        for owner, name, original in saved:
            setattr(owner, name, _wrap(original, wanted))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
