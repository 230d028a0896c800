"""No cyclic garbage collection while a CUDA graph is being captured, in a worker process.

A collection that runs in the middle of a capture finalises whatever cyclic garbage earlier cells
left behind: a crashed cell's CUDA graph and its memory pool, say, kept alive by the cycle of its
exception's traceback. The frees that come with it are calls a capture forbids, so the capture
under way fails ("operation failed due to a previous error during capture"), and a cell that did
nothing wrong reads CRASH. It was seen once on four H100s, in a worker that had run a cell whose
assertion fired inside its capture (bench/results/scale-out-h100x4.json). sglang's own capture
holds the collector off the same way. Collections still run between captures, where such frees
are allowed, and frees by reference count are untouched.
"""

from __future__ import annotations

import functools
import gc

__all__ = ["hold_gc_during_captures"]

_MARK = "_sglfix_holds_gc"


def hold_gc_during_captures() -> bool:
    """Wrap ``torch.cuda.graph``'s enter and exit (once per process); False where torch has no
    CUDA graphs. Whatever else wraps them (``sglfix.harness.allocator``) keeps working: this
    wrapper carries the attributes of the one it wraps."""
    import torch

    graph = getattr(torch.cuda, "graph", None)
    enter, leave = getattr(graph, "__enter__", None), getattr(graph, "__exit__", None)
    if enter is None or leave is None:
        return False
    if getattr(enter, _MARK, False):
        return True

    @functools.wraps(enter)
    def __enter__(self):
        was_on = gc.isenabled()
        gc.disable()
        self._sglfix_gc_was_on = was_on
        try:
            return enter(self)
        except BaseException:
            self._sglfix_gc_was_on = False
            if was_on:
                gc.enable()
            raise

    @functools.wraps(leave)
    def __exit__(self, *exc):
        try:
            return leave(self, *exc)
        finally:
            if getattr(self, "_sglfix_gc_was_on", False):
                self._sglfix_gc_was_on = False
                gc.enable()

    setattr(__enter__, _MARK, True)
    graph.__enter__, graph.__exit__ = __enter__, __exit__
    return True
