"""A worker's caching allocators kept across CUDA graph captures, up to a memory budget.

``torch.cuda.graph`` empties both of torch's caching allocators (device memory and pinned host
memory) before every capture, so that a server capturing once at start-up gives the graphs all
it can. A worker captures in nearly every cell: emptied each time, every cell hands its memory
back to the driver and takes it again, and the driver's frees wait for the device and serialise
the processes sharing the GPU (``bench/results/contention-h100.json``). A worker therefore keeps
its caches at a capture while its reserved device memory is within ``budget_bytes``, and empties
the device cache as torch does once it is above; after a cell it gives back a cache grown past the budget
(``trim_after_cell``), so workers sharing a GPU each hold little more than the budget between
cells. The pinned host cache is never emptied: it holds what the builders stage (a few MiB, the
machine's memory, not the GPU's), and each emptying frees it through calls that wait for the
device, to pin the same pages again in the next cell. Capture and replay themselves are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["WORKER_CACHE_BUDGET", "keep_caches_across_captures", "trim_after_cell"]

# What a worker may keep cached between captures; sglfix.execution.devices budgets each worker
# 5-6 GiB in all. (1, 2 and 4 GiB gave the same GPU peak and times over the full matrix while
# cyclic garbage set the peak, bench/results/workspace-h200.json; since, eight workers peak at
# 25 GB in all.)
WORKER_CACHE_BUDGET = 4 << 30

_MARK = "_sglfix_cache_budget"  # set on the installed wrapper: its budget in bytes


@contextlib.contextmanager
def _no_emptying(*, device: bool = True) -> Iterator[None]:
    """Neither cache emptied (``device=False``: the pinned host cache only)."""
    import torch

    saved = torch.cuda.empty_cache, getattr(torch._C, "_host_emptyCache", None)
    if device:
        torch.cuda.empty_cache = _nothing
    if saved[1] is not None:
        torch._C._host_emptyCache = _nothing
    try:
        yield
    finally:
        torch.cuda.empty_cache = saved[0]
        if saved[1] is not None:
            torch._C._host_emptyCache = saved[1]


def _nothing() -> None:
    return None


def _reserved() -> int:
    """The device memory torch's allocator holds (``torch.cuda.memory_reserved()``), read from the
    allocator's nested statistics: ``memory_reserved`` flattens every statistic into one dict
    first, which cost more than the rest of this policy together (a read per capture and per cell)."""
    import torch

    stats = torch.cuda.memory.memory_stats_as_nested_dict()
    return int(stats.get("reserved_bytes", {}).get("all", {}).get("current", 0))


def keep_caches_across_captures(*, budget_bytes: int = WORKER_CACHE_BUDGET) -> bool:
    """Install the policy in this process (once); False where torch has no CUDA graphs."""
    import torch

    graph = getattr(torch.cuda, "graph", None)
    enter = getattr(graph, "__enter__", None)
    if enter is None:
        return False
    if getattr(enter, _MARK, None) is not None:
        return True

    def __enter__(self):
        with _no_emptying(device=_reserved() <= budget_bytes):
            return enter(self)

    setattr(__enter__, _MARK, budget_bytes)
    graph.__enter__ = __enter__
    return True


def trim_after_cell() -> bool:
    """Between cells: a worker whose cache grew past the budget (a large cell, or one that
    never captured) gives it back, so that what it holds while idle stays within the budget.
    True when it emptied."""
    import torch

    budget = getattr(getattr(getattr(torch.cuda, "graph", None), "__enter__", None), _MARK, None)
    if budget is None or _reserved() <= budget:
        return False
    torch.cuda.empty_cache()
    return True
