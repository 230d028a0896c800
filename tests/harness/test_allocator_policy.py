"""The worker's allocator policy at CUDA graph captures (sglfix.harness.allocator), driven
through a stand-in for ``torch.cuda.graph`` whose ``__enter__`` empties the caches as torch's does."""

from __future__ import annotations

import pytest
import torch
from clihelp import run_probe

from sglfix.harness import allocator


class _Graph:
    def __enter__(self):
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()
        return self

    def __exit__(self, *exc):
        return None


def _reserved(monkeypatch, reserved: int) -> None:
    """What the allocator's statistics say it holds (the policy reads them nested, not flattened)."""
    stats = {"reserved_bytes": {"all": {"current": reserved}}}
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", lambda *a, **k: stats)


def _install(monkeypatch, *, reserved: int, budget: int) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "graph", _Graph)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("device"))
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: calls.append("host"), raising=False)
    _reserved(monkeypatch, reserved)
    monkeypatch.setattr(_Graph, "__enter__", _Graph.__enter__)  # restored after the test
    assert allocator.keep_caches_across_captures(budget_bytes=budget)
    return calls


def test_within_budget_a_capture_keeps_both_caches(monkeypatch):
    calls = _install(monkeypatch, reserved=1 << 30, budget=2 << 30)
    with torch.cuda.graph():
        pass
    assert calls == []
    # ... and the real functions are back once the capture has begun
    torch.cuda.empty_cache()
    torch._C._host_emptyCache()
    assert calls == ["device", "host"]


def test_above_budget_a_capture_empties_the_device_cache_only(monkeypatch):
    calls = _install(monkeypatch, reserved=3 << 30, budget=2 << 30)
    with torch.cuda.graph():
        pass
    assert calls == ["device"]
    torch._C._host_emptyCache()  # the real host emptying is back after the capture began
    assert calls == ["device", "host"]


def test_installed_once(monkeypatch):
    _install(monkeypatch, reserved=0, budget=1)
    wrapped = _Graph.__enter__
    assert allocator.keep_caches_across_captures(budget_bytes=1)
    assert _Graph.__enter__ is wrapped


def test_after_a_cell_a_cache_past_the_budget_is_given_back(monkeypatch):
    monkeypatch.setattr(torch.cuda, "graph", _Graph)
    monkeypatch.setattr(_Graph, "__enter__", _Graph.__enter__)
    assert not allocator.trim_after_cell()  # no policy installed: nothing to trim
    calls = _install(monkeypatch, reserved=3 << 30, budget=2 << 30)
    assert allocator.trim_after_cell() and calls == ["device"]
    _reserved(monkeypatch, 1 << 30)
    assert not allocator.trim_after_cell() and calls == ["device"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator's own statistics need a GPU")
def test_the_policy_reads_what_memory_reserved_says():
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    assert allocator._reserved() == torch.cuda.memory_reserved() > 0
    del held


_GC_PROBE = r"""
import gc, json, torch
seen = {}
class FakeGraph:  # stands in for torch.cuda.graph: what the collector's state is inside
    def __enter__(self):
        seen["enter"] = gc.isenabled()
        if getattr(self, "fail", False):
            raise RuntimeError("capture_begin failed")
        return self
    def __exit__(self, *exc):
        seen["exit"] = gc.isenabled()
        return False
torch.cuda.graph = FakeGraph
from sglfix.harness.allocator import keep_caches_across_captures, trim_after_cell
from sglfix.harness.capturegc import hold_gc_during_captures
assert keep_caches_across_captures() and hold_gc_during_captures() and hold_gc_during_captures()
with FakeGraph():
    pass
after_capture = gc.isenabled()
try:
    with FakeGraph():
        raise ValueError("an assertion of the code under test, inside the capture")
except ValueError:
    pass
after_crash = gc.isenabled()
g = FakeGraph(); g.fail = True
try:
    g.__enter__()
except RuntimeError:
    pass
after_failed_enter = gc.isenabled()
gc.disable()
with FakeGraph():
    pass
stays_off = not gc.isenabled()
budget = getattr(torch.cuda.graph.__enter__, "_sglfix_cache_budget", None)
print(json.dumps({**seen, "after_capture": after_capture, "after_crash": after_crash,
                  "after_failed_enter": after_failed_enter, "stays_off": stays_off, "budget": budget}))
"""


def test_no_garbage_collection_while_a_graph_is_captured_and_it_comes_back_after():
    """A collection mid-capture finalises an earlier cell's garbage (a crashed cell's graph and
    its pool), whose frees invalidate the capture under way: the collector is off between enter
    and exit, on again after, after a cell that raised inside the capture, and after a capture
    that could not begin; a collector the process had turned off stays off; the allocator
    policy's budget mark survives the wrapping."""
    out = run_probe(_GC_PROBE)
    assert out == {
        "enter": False,
        "exit": False,
        "after_capture": True,
        "after_crash": True,
        "after_failed_enter": True,
        "stays_off": True,
        "budget": 4 << 30,
    }, out
