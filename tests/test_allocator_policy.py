"""The worker's allocator policy at CUDA graph captures (sglfix.harness.allocator), driven
through a stand-in for ``torch.cuda.graph`` whose ``__enter__`` empties the caches as torch's does."""

from __future__ import annotations

import torch

from sglfix.harness import allocator


class _Graph:
    def __enter__(self):
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()
        return self

    def __exit__(self, *exc):
        return None


def _install(monkeypatch, *, reserved: int, budget: int) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "graph", _Graph)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("device"))
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: calls.append("host"), raising=False)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: reserved)
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


def test_above_budget_a_capture_empties_as_torch_does(monkeypatch):
    calls = _install(monkeypatch, reserved=3 << 30, budget=2 << 30)
    with torch.cuda.graph():
        pass
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
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a, **k: 1 << 30)
    assert not allocator.trim_after_cell() and calls == ["device"]
