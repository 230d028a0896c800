"""Where a recorder of executed code meets the kernel launchers and the import system: what a cell
ran, for the result store (``sglfix.execution.entered``).

Three things only those sites know:

* **Which kernel was launched.** A compiled Triton kernel runs on the GPU without a Python frame
  of its own, so no recorder sees its code; every launch names it here (``note``).
* **When the Triton interpreter is running a kernel.** Before Python 3.12 the recorder is the C
  profiler, which costs a callback per Python call; an interpreted kernel is most of a CPU cell
  and makes millions of them. The recorder steps aside for the kernel (``kernel_running``): the
  kernel's code is noted, and the ``@triton.jit`` helpers it calls count as import-time code of
  their files (``sglfix.execution.store.fingerprint`` keeps their bodies in the file's skeleton),
  so nothing is lost.
* **When a module is being imported.** A module a cell imports first runs its body, and what that
  body calls, once per process: a later cell of the process reads what it made. What runs under
  an import (``watch_imports``) is kept apart (``Recorder.imported``), so that the store can key
  every later cell of the process on it, and not on everything the importing cell ran.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["Recorder", "kernel_running", "note", "recording", "watch_imports", "wrap_compiled_launches"]


class Recorder:
    """One recorder's lists: code objects by id (``ran``; what ran under an import goes to
    ``imported`` when that is kept apart), and the C profiler to pause (None on 3.12+)."""

    __slots__ = ("depth", "imported", "profiler", "ran")

    def __init__(self, ran: dict[int, Any], profiler: Any = None, imported: dict[int, Any] | None = None) -> None:
        self.ran, self.profiler, self.imported = ran, profiler, imported
        self.depth = 0  # imports under way

    def target(self) -> dict[int, Any]:
        """Where a code object seen now goes."""
        return self.imported if self.depth and self.imported is not None else self.ran


# The recorders now listening, innermost last.
_ACTIVE: list[Recorder] = []


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """While open, ``note`` adds to ``recorder``, ``kernel_running`` pauses its profiler and an
    import (once ``watch_imports`` ran) is recorded apart."""
    _ACTIVE.append(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.pop()


def note(code: Any) -> None:
    if _ACTIVE and code is not None:
        _ACTIVE[-1].target()[id(code)] = code


@contextlib.contextmanager
def kernel_running(kernel: Any) -> Iterator[None]:
    """Around an interpreted kernel: its code noted, the C profiler (if any) paused."""
    if not _ACTIVE:
        yield
        return
    profiler = _ACTIVE[-1].profiler
    note(getattr(getattr(kernel, "fn", None), "__code__", None))
    if profiler is None:
        yield
        return
    profiler.disable()
    try:
        yield
    finally:
        profiler.enable()


def watch_imports() -> None:
    """From now on, a module body executed while a recorder that keeps imports apart listens is
    recorded into its ``imported``: before 3.12 under a C profiler of its own (the recorder's
    paused meanwhile), on 3.12+ by the same tool, every code object's first entry seen again."""
    from importlib._bootstrap_external import _LoaderBasics

    original = _LoaderBasics.exec_module
    if getattr(original, "_sglfix_watched", False):
        return

    def exec_module(self: Any, module: Any) -> Any:
        rec = _ACTIVE[-1] if _ACTIVE else None
        if rec is None or rec.imported is None or rec.depth:
            return original(self, module)  # not recorded apart, or inside an import already
        rec.depth += 1
        try:
            if rec.profiler is None:
                if sys.version_info >= (3, 12):
                    sys.monitoring.restart_events()  # seen earlier in the cell: seen again here
                return original(self, module)
            import cProfile

            rec.profiler.disable()
            inner = cProfile.Profile(builtins=False, subcalls=False)
            inner.enable()
            try:
                return original(self, module)
            finally:
                inner.disable()
                rec.imported.update((id(e.code), e.code) for e in inner.getstats() if not isinstance(e.code, str))
                rec.profiler.enable()
        finally:
            rec.depth -= 1

    exec_module._sglfix_watched = True  # type: ignore[attr-defined]
    _LoaderBasics.exec_module = exec_module


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
        __sglfix_passthrough__ = True  # noqa: F841 (a failed launch is its caller's: harness.misfit)
        return original(self, *args, **kwargs)

    run._sglfix_noted = True  # type: ignore[attr-defined]
    JITFunction.run = run
    return True
