"""Detect device->host synchronisations inside a path declared sync-free.

On CUDA, torch's own sync debug mode reports every synchronising call (warn mode, recorded
rather than raised, so the cell still gets its other findings), each kept only where a frame of
the code under test made it: the harness builds ground truth and reads it back inside the watched
forward, and that is not the engine's doing. Without CUDA the same code
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
from typing import Any

import torch

from sglfix.common.codebase import is_code_under_test

__all__ = ["suspended", "watch_syncs"]

_PAUSED = threading.local()

# Tensor -> host conversions, and ops that must know a data-dependent size (they sync on CUDA).
_TENSOR_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "unique")
_TORCH_FUNCS = ("nonzero", "masked_select", "unique", "argwhere")


def _caller_under_test(frame: Any, *, cuda: bool = False) -> str | None:
    """The first frame of the code under test from ``frame`` outwards, past torch's frames and this
    module's spies; on CUDA (a sync warning shown at ``frame``) also past the warning machinery
    and the harness's pass-through frames (a factory mode that makes its caller's call). None
    where the first other frame is the harness's own: its reads (the ground truth it builds and
    reads back inside the watched forward) are not the engine's doing."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if is_code_under_test(module):
            return f"{module}:{frame.f_lineno} in {frame.f_code.co_name}"
        between = module.startswith("torch") or module == __name__
        if cuda:
            between = between or module == "warnings" or "__sglfix_passthrough__" in frame.f_code.co_varnames
        if not between:
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
            where = None if getattr(_PAUSED, "on", False) else _caller_under_test(sys._getframe(1))
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


def _sync_recorder(found: list[str]) -> Any:
    """A ``warnings.showwarning`` that keeps torch's sync warnings the code under test raised
    (``_caller_under_test``, from the stack as it is when the warning is shown) and drops the rest."""

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        text = str(message)
        if "called a synchronizing" not in text or getattr(_PAUSED, "on", False):
            return
        where = _caller_under_test(sys._getframe(1), cuda=True)
        if where is not None:
            found.append(f"{text.splitlines()[0]} at {where}")

    return show


@contextlib.contextmanager
def _cuda_watch(found: list[str]) -> Iterator[None]:
    """torch's sync debug mode, each warning attributed as it is raised, from the Python stack
    then live (the warning's own file and line name the innermost frame, which may be the
    harness's allocation mode making the engine's call)."""

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _sync_recorder(found)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)


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
