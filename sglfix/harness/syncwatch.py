"""Detect device->host synchronisations inside a path declared sync-free.

On CUDA, torch's own sync debug mode reports every synchronising call (warn mode, recorded
rather than raised, so the cell still gets its other findings). Without CUDA the same code
path runs on CPU tensors that stand in for device tensors; there, reading a tensor's value
back into Python from the code under test is the equivalent event, so those calls are
intercepted — but only when made from ``sglfix.backends`` (the Triton interpreter itself
reads tensors on the host all the time, and that is not the engine's doing).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Iterator

import torch

from sglfix.common.codebase import is_code_under_test

__all__ = ["suspended", "watch_syncs"]

_PAUSED = threading.local()

# Tensor -> host conversions, and ops that must know a data-dependent size (they sync on CUDA).
_TENSOR_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "unique")
_TORCH_FUNCS = ("nonzero", "masked_select", "unique", "argwhere")


def _caller_under_test(depth: int = 2) -> str | None:
    frame = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if is_code_under_test(module):
            return f"{module}:{frame.f_lineno} in {frame.f_code.co_name}"
        # Torch's own frames and this module's spies stand between the read and its caller.
        if not (module.startswith("torch") or module == __name__):
            return None
        frame = frame.f_back
    return None


@contextlib.contextmanager
def _cpu_watch(found: list[str]) -> Iterator[None]:
    saved: list[tuple[object, str, object]] = []

    def wrap(owner, name, label):
        original = getattr(owner, name, None)
        if original is None:
            return

        def spy(*args, **kwargs):
            where = None if getattr(_PAUSED, "on", False) else _caller_under_test()
            if where is not None:
                found.append(f"host read {label} at {where}")
            __sglfix_passthrough__ = True  # noqa: F841 (what the read raises is its caller's: harness.misfit)
            return original(*args, **kwargs)

        saved.append((owner, name, original))
        setattr(owner, name, spy)

    for name in _TENSOR_METHODS:
        wrap(torch.Tensor, name, f"Tensor.{name.strip('_')}()")
    wrap(torch.Tensor, "repeat_interleave", "Tensor.repeat_interleave() without output_size")
    for name in _TORCH_FUNCS:
        wrap(torch, name, f"torch.{name}()")
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


@contextlib.contextmanager
def _cuda_watch(found: list[str]) -> Iterator[None]:
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    for w in caught:
        text = str(w.message)
        if "called a synchronizing" in text:
            found.append(f"{text.splitlines()[0]} ({w.filename}:{w.lineno})")


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """The tool's own reads inside a watched region (invariant checks) are not the engine's."""
    import torch

    cuda_mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    was = getattr(_PAUSED, "on", False)
    _PAUSED.on = True
    if cuda_mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        if cuda_mode:
            torch.cuda.set_sync_debug_mode(cuda_mode)
        _PAUSED.on = was


@contextlib.contextmanager
def watch_syncs(device: torch.device | str, *, enabled: bool = True) -> Iterator[list[str]]:
    """Yields a list that, after the block, holds one line per sync found in it."""
    found: list[str] = []
    if not enabled:
        yield found
        return
    dev = torch.device(device)
    watcher = _cuda_watch if dev.type == "cuda" else _cpu_watch
    with watcher(found):
        yield found
