"""The reference: what each query must see, computed from the ground-truth K/V only.

It never reads backend metadata. One padded, masked computation per cell (a Python loop
over requests cost more than the backend itself): float64 on CPU, float32 on CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["BAD_ROW_RULE", "Comparison", "compare_outputs", "reference_attention", "reference_dtype", "row_ranges"]


def reference_dtype(device_type: str) -> str:
    """The dtype the reference computes in on a device of this type (a finding quotes it)."""
    return "float64" if device_type == "cpu" else "float32"


def reference_attention(
    *, q_pad: torch.Tensor, k_pad: torch.Tensor, v_pad: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """q_pad [bs, Q, H, D], k_pad/v_pad [bs, L, Hkv, D], mask [bs, Q, L] -> [bs, Q, H, D]."""
    acc = getattr(torch, reference_dtype(q_pad.device.type))
    _bs, _nq, heads, dim = q_pad.shape
    kv_heads = k_pad.shape[2]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    q = q_pad.to(acc)
    k = k_pad.to(acc).repeat_interleave(group, dim=2)
    v = v_pad.to(acc).repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    visible = mask[:, None, :, :]
    scores = scores.masked_fill(~visible, float("-inf"))
    # A query row that sees nothing (padding) gives zeros instead of NaN.
    any_visible = visible.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~any_visible, 0.0), dim=-1) * any_visible
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


@dataclass
class Comparison:
    max_abs: float
    max_rel: float
    bad_rows: int
    rows: int
    first_bad_request: int | None
    first_bad_row: int | None
    nonfinite: int
    # The bad rows (packed query rows) as ranges, "0-2,5": which rows a divergence hits, so that
    # a change that moves a divergence to other rows is told from one that leaves it as it was.
    bad_at: str = ""

    @property
    def bad_fraction(self) -> float:
        return self.bad_rows / self.rows if self.rows else 0.0

    def to_json(self) -> dict:
        return {
            "max_abs_err": self.max_abs,
            "max_rel_err": self.max_rel,
            "bad_rows": self.bad_rows,
            "rows": self.rows,
            "bad_fraction": round(self.bad_fraction, 4),
            "first_bad_request": self.first_bad_request,
            "first_bad_row": self.first_bad_row,
            "nonfinite": self.nonfinite,
            "bad_at": self.bad_at,
        }


# ``compare_outputs``'s test of a row, in words (a finding's "Expected" quotes it).
BAD_ROW_RULE = (
    "a query row fails when any element differs from the reference by more than tolerance x (1 + |reference|)"
)


def compare_outputs(*, out: torch.Tensor, ref: torch.Tensor, q_valid: torch.Tensor, tolerance: float) -> Comparison:
    """out [tokens, H, D] (packed in request order) vs ref [bs, Q, H, D] at q_valid [bs, Q].

    A row (one query token) is bad when any element differs by more than
    tolerance * (1 + |ref|): absolute near zero, relative for large values.
    """
    from sglfix.harness.hostcopy import to_host

    # On the host, read in one wait: a boolean mask on the device would wait for its own count.
    ref, q_valid, out = to_host([ref, q_valid, out])
    expected = ref[q_valid].to(torch.float64)
    got = out.reshape(expected.shape).to(torch.float64)
    nonfinite = int((~torch.isfinite(got)).sum())
    diff = (got - expected).abs().nan_to_num(nan=float("inf"))
    rel = diff / expected.abs().clamp_min(1e-6)
    bad = (diff > tolerance * (1.0 + expected.abs())).flatten(1).any(dim=1)
    owner = q_valid.nonzero()  # (request, row) per packed token
    first = int(bad.nonzero()[0]) if bool(bad.any()) else None
    return Comparison(
        max_abs=float(diff.max()) if diff.numel() else 0.0,
        max_rel=float(rel.max()) if rel.numel() else 0.0,
        bad_rows=int(bad.sum()),
        rows=int(bad.numel()),
        first_bad_request=int(owner[first, 0]) if first is not None else None,
        first_bad_row=int(owner[first, 1]) if first is not None else None,
        nonfinite=nonfinite,
        bad_at=row_ranges(bad.nonzero().flatten().tolist()),
    )


def row_ranges(rows: list[int]) -> str:
    """Sorted row numbers as ranges: [0, 1, 2, 5] -> "0-2,5"."""
    spans: list[list[int]] = []
    for r in rows:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
