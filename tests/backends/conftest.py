"""Fixtures for the tests of the system under test (``sglfix.backends``): a
batched float32 reference computed from a kit case's ground truth only, and a
minimal sglang-style revert helper (match lines after strip(), exactly once,
replace, recompile, swap ``__code__``) to check that each fix line matters."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

# Before anything imports triton: selects the Triton interpreter without CUDA.
import sglfix.backends  # noqa: F401


def reference_attention(case) -> torch.Tensor:
    """softmax(q k^T * scale, masked by ``visible``) v in float32, padded [bs, Qmax, H, D]."""
    q = case.q_pad.float()
    k = case.k_pad.float()
    v = case.v_pad.float()
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,blhd->bhql", q, k) * case.sm_scale
    scores = scores.masked_fill(~case.visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhql,blhd->bqhd", probs, v)


def max_error(case, out: torch.Tensor) -> float:
    ref = reference_attention(case)
    got = case.pad_output(out).float()
    diff = (got - ref).abs()
    diff[~case.q_valid] = 0
    return float(diff.max())


def tolerance(dtype: torch.dtype) -> float:
    # bf16 output rounding alone is up to ~0.4% of |o|, hence the wider bound.
    return 2e-2 if dtype == torch.bfloat16 else 1e-2


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        owner = None
        for name in parts[i:]:
            owner, obj = obj, getattr(obj, name)
        return owner, obj
    raise ImportError(dotted)


def _apply_edit(src_lines: list[str], match: str, replacement: str) -> list[str]:
    want = [line.strip() for line in match.strip("\n").splitlines()]
    n = len(want)
    hits = [
        i
        for i in range(len(src_lines) - n + 1)
        if [line.strip() for line in src_lines[i : i + n]] == want
    ]
    assert len(hits) == 1, f"match must occur exactly once, found {len(hits)}: {want}"
    i = hits[0]
    indent = src_lines[i][: len(src_lines[i]) - len(src_lines[i].lstrip())]
    new = [indent + line.strip() for line in replacement.strip("\n").splitlines()] if replacement.strip() else []
    return src_lines[:i] + new + src_lines[i + n :]


@contextlib.contextmanager
def reverted(patches):
    """``patches``: list of (dotted target, [(match, replacement), ...])."""
    saved = []
    try:
        for target, edits in patches:
            _, func = _resolve(target)
            lines = textwrap.dedent(inspect.getsource(func)).splitlines()
            for match, replacement in edits:
                lines = _apply_edit(lines, match, replacement)
            namespace: dict = {}
            exec(compile("\n".join(lines) + "\n", f"<revert {target}>", "exec"), func.__globals__, namespace)
            saved.append((func, func.__code__))
            func.__code__ = namespace[func.__name__].__code__
        yield
    finally:
        for func, code in reversed(saved):
            func.__code__ = code


@pytest.fixture
def revert():
    return reverted


@pytest.fixture
def check():
    """Reference helpers: ``check.max_error(case, out)``, ``check.tolerance(dtype)``,
    ``check.reference_attention(case)``."""
    return SimpleNamespace(
        reference_attention=reference_attention, max_error=max_error, tolerance=tolerance
    )
