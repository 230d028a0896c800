"""Where a recorder of executed code meets the kernel launchers: what a cell ran, for the result
store (``sglfix.execution.entered``).

Two things only the launch sites know:

* **Which kernel was launched.** A compiled Triton kernel runs on the GPU without a Python frame
  of its own, so no recorder sees its code; every launch names it here (``note``).
* **When the Triton interpreter is running a kernel.** Before Python 3.12 the recorder is the C
  profiler, which costs a callback per Python call; an interpreted kernel is most of a CPU cell
  and makes millions of them. The recorder steps aside for the kernel (``kernel_running``): the
  kernel's code is noted, and the ``@triton.jit`` helpers it calls count as import-time code of
  their files (``sglfix.execution.store.fingerprint`` keeps their bodies in the file's skeleton),
  so nothing is lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["kernel_running", "note", "recording", "wrap_compiled_launches"]

# The recorder now listening: (code objects noted by id, the profiler to pause or None).
_ACTIVE: list[tuple[dict[int, Any], Any]] = []


@contextlib.contextmanager
def recording(codes: dict[int, Any], profiler: Any = None) -> Iterator[None]:
    """While open, ``note`` adds to ``codes`` and ``kernel_running`` pauses ``profiler``."""
    _ACTIVE.append((codes, profiler))
    try:
        yield
    finally:
        _ACTIVE.pop()


def note(code: Any) -> None:
    if _ACTIVE and code is not None:
        _ACTIVE[-1][0][id(code)] = code


@contextlib.contextmanager
def kernel_running(kernel: Any) -> Iterator[None]:
    """Around an interpreted kernel: its code noted, the C profiler (if any) paused."""
    if not _ACTIVE:
        yield
        return
    profiler = _ACTIVE[-1][1]
    note(getattr(getattr(kernel, "fn", None), "__code__", None))
    if profiler is None:
        yield
        return
    profiler.disable()
    try:
        yield
    finally:
        profiler.enable()


def wrap_compiled_launches() -> bool:
    """Note the code of every compiled Triton kernel launched in this process (GPU workers);
    False when this Triton has no ``JITFunction.run`` to wrap."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    original = JITFunction.run
    if getattr(original, "_sglfix_noted", False):
        return True

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE:
            note(getattr(self.fn, "__code__", None))
        return original(self, *args, **kwargs)

    run._sglfix_noted = True  # type: ignore[attr-defined]
    JITFunction.run = run
    return True
