"""The CUDA allocations sglang's multi-step draft backends make, placed and guarded: ``CudaAllocations``
moves their ``device="cuda"`` factory calls to the CPU on a machine without CUDA and carves their
per-step kv_indices rows out of allocations with a sentinel tail (``GuardedBuffer``) for the judge's
guard check."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from sglfix.harness.guards import SENTINEL_BYTE

__all__ = ["SGLANG_ROOT", "CudaAllocations", "GuardedBuffer"]

SGLANG_ROOT = "sglang"


@dataclass
class GuardedBuffer:
    """A buffer the code under test allocated, followed by a guard zone of sentinel bytes (the
    layout ``sglfix.harness.guards`` checks)."""

    name: str
    shape: tuple
    flat: torch.Tensor
    numel: int


# By the factories themselves: a mode sees torch's own functions even where a cell's poisoned
# block (sglfix.harness.poison) has wrapped the module's names when this module is imported.
_FACTORIES = {
    getattr(f, "__wrapped__", f): name
    for f, name in ((torch.zeros, "zeros"), (torch.empty, "empty"), (torch.ones, "ones"), (torch.full, "full"))
}


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _caller_in(root: str, *, skip: int = 2) -> str:
    frame = sys._getframe(skip)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == root or name.startswith(root + "."):
            qual = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            return f"{qual}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class CudaAllocations(TorchFunctionMode):
    """Watches the factory calls (``zeros``/``empty``/``ones``/``full``) that sglang makes with
    ``device="cuda"`` while it is active.

    * ``remap``: without CUDA, such a tensor is made on the CPU instead (sglang's multi-step draft
      backends hard-code ``device="cuda"`` for their kv_indices rows; everything else about the call
      is unchanged), and a pinned host tensor an ordinary one (``pin_memory=True`` at a factory, or
      ``Tensor.pin_memory()``: a breakable prefill graph's table staging).
    * ``guard``: 2-D integer buffers (the per-step kv_indices rows) are carved from a larger flat
      allocation whose tail is sentinel bytes, so a write past the buffer's end is caught by the
      judge's guard check (``guarded``).
    """

    def __init__(self, *, remap: bool, guard: bool = True, guard_min: int = 4096) -> None:
        super().__init__()
        self.remap = remap
        self.guard = guard
        self.guard_min = guard_min
        self.guarded: list[GuardedBuffer] = []
        self.remapped = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if self.remap and func is torch.Tensor.pin_memory and not torch.cuda.is_available():
            return args[0]  # pinning a host tensor needs an accelerator; the tensor holds the same values
        kind = _FACTORIES.get(func)
        if self.remap and kind is not None and kwargs.get("pin_memory") and not torch.cuda.is_available():
            # Pinned host memory needs an accelerator; a plain host tensor holds the same values.
            kwargs.pop("pin_memory")
        if kind is None or not _is_cuda(kwargs.get("device")):
            __sglfix_passthrough__ = True  # an error of func is its caller's: harness.misfit
            return func(*args, **kwargs)
        if self.remap and not torch.cuda.is_available():
            kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            self.remapped += 1
        dtype = kwargs.get("dtype")
        size = args[0] if args else kwargs.get("size", ())
        shape = (
            tuple(size) if isinstance(size, (tuple, list, torch.Size)) else tuple(args[: len(args) - (kind == "full")])
        )
        if not (self.guard and len(shape) == 2 and dtype in (torch.int32, torch.int64)):
            __sglfix_passthrough__ = True  # noqa: F841
            return func(*args, **kwargs)
        numel = int(shape[0]) * int(shape[1])
        extra = max(numel, self.guard_min)
        flat = torch.empty(numel + extra, dtype=dtype, device=kwargs["device"])
        flat[numel:].view(torch.uint8).fill_(SENTINEL_BYTE)
        body = flat[:numel]
        if kind == "zeros":
            body.zero_()
        elif kind == "ones":
            body.fill_(1)
        elif kind == "full":
            body.fill_(args[1] if len(args) > 1 else kwargs["fill_value"])
        view = body.view(shape)
        self.guarded.append(GuardedBuffer(name=_caller_in(SGLANG_ROOT), shape=shape, flat=flat, numel=numel))
        return view
