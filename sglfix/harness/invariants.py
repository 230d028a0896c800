"""Metadata invariants, checked after every metadata init (eager, capture and replay).

A CSR offset array must start at 0 and never decrease; lengths are non-negative; every index
the offsets cover must lie inside the KV pool and inside its buffer. These catch corrupt
metadata even where the real rows' output happens to stay right (padded rows).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_metadata"]


def _indptr(name: str, t: torch.Tensor | None, rows: int, found: list[str]) -> torch.Tensor | None:
    if t is None:
        return None
    v = t[: rows + 1].to(torch.int64).cpu()
    if v.numel() < rows + 1:
        found.append(f"{name} has {v.numel()} entries for {rows} rows")
        return None
    if int(v[0]) != 0:
        found.append(f"{name}[0] = {int(v[0])}, not 0")
    steps = v[1:] - v[:-1]
    if bool((steps < 0).any()):
        i = int((steps < 0).nonzero()[0])
        found.append(f"{name} not monotone at row {i}: {int(v[i])} -> {int(v[i + 1])} (negative length)")
    return v


def check_metadata(metadata: Any, *, rows: int, num_slots: int, phase: str) -> list[str]:
    """Findings (empty when sound) for a backend's ForwardMetadata covering ``rows`` requests."""
    found: list[str] = []
    kv_indptr = _indptr("kv_indptr", getattr(metadata, "kv_indptr", None), rows, found)
    _indptr("qo_indptr", getattr(metadata, "qo_indptr", None), rows, found)
    _indptr("mask_indptr", getattr(metadata, "mask_indptr", None), rows, found)
    kv_indices = getattr(metadata, "kv_indices", None)
    if kv_indptr is not None and kv_indices is not None and not found:
        end = int(kv_indptr[-1])
        if end > kv_indices.numel():
            found.append(f"kv_indptr[{rows}] = {end} exceeds kv_indices length {kv_indices.numel()}")
        else:
            used = kv_indices[:end].to(torch.int64).cpu()
            bad = (used < 0) | (used >= num_slots)
            if bool(bad.any()):
                i = int(bad.nonzero()[0])
                row = int(torch.searchsorted(kv_indptr, torch.tensor(i), right=True)) - 1
                found.append(f"kv_indices[{i}] = {int(used[i])} (row {row}) outside the KV pool [0, {num_slots})")
    max_extend_len = getattr(metadata, "max_extend_len", None)
    if isinstance(max_extend_len, int) and max_extend_len < 0:
        found.append(f"max_extend_len = {max_extend_len} < 0")
    return [f"{phase}: {f}" for f in found]
