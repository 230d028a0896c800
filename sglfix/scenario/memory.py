"""What a scenario's cell will allocate, estimated before any cell runs, and the budget it must fit.

Each size alone may be within its limit while their product is not (a 1000-request batch of
100K-token requests, a page size that multiplies the KV pool). The estimate follows what the
kit, the backend, the graph runner and the reference allocate, rounded up, and is checked
against a budget: 8 GiB unless ``SGLFIX_MEMORY_BUDGET`` (or the caller) says otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.scenario.models import Scenario
from sglfix.scenario.modes import rule_for

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "MEMORY_BUDGET_ENV",
    "MemoryEstimate",
    "check_memory",
    "estimate_memory",
    "format_size",
    "memory_budget",
    "parse_size",
]

GiB = 1024**3
DEFAULT_MEMORY_BUDGET = 8 * GiB
MEMORY_BUDGET_ENV = envs.SGLFIX_MEMORY_BUDGET.name
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
# The kit's decode split-KV scratch (max_kv_splits) and the reference's float64 accumulators.
_KV_SPLITS = 4
_REF_BYTES = 8


@dataclass(frozen=True)
class MemoryEstimate:
    parts: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.parts.items(), key=lambda kv: kv[1])


def _kit_context_len(*, longest: int, num_draft_tokens: int) -> int:
    # Mirrors build_case: the page-table row length (max_context_len).
    return max(64, 32 * math.ceil((longest + num_draft_tokens) / 32))


def _kit_req_pool_size(*, batch_size: int, max_graph_bs: int) -> int:
    # Mirrors the kit's default_req_pool_size (importing the kit would import torch).
    return max(32, batch_size + 1, max_graph_bs + 1)


def estimate_memory(scenario: Scenario) -> MemoryEstimate:
    """Bytes a cell of ``scenario`` allocates at its peak, by what allocates them (an upper estimate)."""
    # A probe scenario (no backend) is estimated as the Triton backend would run its batch: an upper bound.
    s, rule = scenario, rule_for(scenario.mode, scenario.backend or "triton")
    es = _DTYPE_BYTES[s.model.dtype]
    heads, kv_heads, dim = s.model.num_heads, s.model.num_kv_heads, s.model.head_dim
    if s.model.mla:
        # One latent KV head; queries are absorbed to the same width.
        kv_heads, dim = 1, s.model.kv_lora_rank + s.model.qk_rope_head_dim
    ndt = s.spec.num_draft_tokens
    bs = s.batch_size
    # An encoder-decoder batch's encoder tokens sit in the request's row and the pool too.
    encoder = s.encoder_lens or (0,) * bs
    totals = [n + p + e for n, p, e in zip(encoder, s.prefix_lens, s.extend_lens)]
    tokens, qmax, lmax = sum(s.extend_lens), max(s.extend_lens), max(totals)
    if rule.new_tokens == "draft_steps":
        # Every branch queries once per attention step.
        qmax = s.spec.topk * (s.spec.num_steps - 1)
        tokens = bs * qmax
    context = max(_kit_context_len(longest=lmax, num_draft_tokens=ndt), s.max_context_len or 0)
    graph_bs = ((s.graph_bs or 0) if s.mode == "EXTEND" else max(s.capture_bs)) if s.capture_bs else 0
    pool_rows = _kit_req_pool_size(batch_size=bs, max_graph_bs=graph_bs)
    # Twice the pages the batch needs, plus spares, so that slots scatter.
    slots = (2 * sum(math.ceil(t / s.page_size) for t in totals) + 8) * s.page_size
    kv_row = kv_heads * dim

    parts = {
        "KV pool (2x scattered pages)": 2 * slots * kv_row * es,
        "KV pool random fill (float32 scratch)": slots * kv_row * (4 + es),
        "req_to_token table": pool_rows * context * 4,
        "q/k/v and output": tokens * (2 * heads + 2 * kv_heads) * dim * es + bs * qmax * heads * dim * es,
        "padded ground truth and mask": (bs * qmax * heads * dim + 2 * bs * lmax * kv_row) * es
        + bs * qmax * lmax
        + bs * qmax,
        # float64 copies of q/k/v (k/v repeated to every head), scores, their masked copy and
        # the probabilities, and the output.
        "reference": _REF_BYTES
        * (2 * bs * qmax * heads * dim + 2 * bs * lmax * (heads + kv_heads) * dim + 3 * bs * heads * qmax * lmax),
        "page table and kernel scratch": 8 * bs * context
        + bs * heads * _KV_SPLITS * (dim + 1) * 4
        + sum(e * (p + e) for p, e in zip(s.prefix_lens, s.extend_lens)),
    }
    if rule.new_tokens == "draft_steps":
        # One kv_indices row per step, bs * topk * max_context_len wide (eager and graph).
        rows_bs = max(bs, graph_bs)
        parts["draft kv_indices rows"] = 2 * s.spec.num_steps * rows_bs * s.spec.topk * context * 4
    if s.capture_bs and s.mode == "EXTEND":
        # The prefill runner's token buffers and the full-graph wrappers' kv_indices and split-KV
        # workspace (sized for the largest bucket, at most 128 query rows a tile, 132 SMs).
        rows = max(s.capture_bs)
        tiles = max(264 // kv_heads, -(-rows * (heads // kv_heads) // 16) + graph_bs)
        parts["CUDA-graph static buffers"] = (
            rows * (3 * 8 + (2 * heads + 2 * kv_heads) * dim * es)  # token slots, static q/k/v and output
            + graph_bs * context * 4  # kv_indices
            + heads * tiles * 128 * 4 * (dim + 1) * 5 // 4  # float workspace
        )
    elif s.capture_bs:
        rows = graph_bs * rule.graph_tokens_per_request(
            num_steps=s.spec.num_steps, num_draft_tokens=ndt, canvas=max(s.extend_lens or (1,))
        )
        parts["CUDA-graph static buffers"] = (
            rows * heads * _KV_SPLITS * (dim + 1) * 4  # split-KV logits and lse
            + rows * context * 8  # kv_indices
            + graph_bs * ndt * (context + ndt)  # verify mask
            + rows * (2 * heads + 2 * kv_heads) * dim * es  # static q/k/v and output
        )
    return MemoryEstimate(parts=parts)


def parse_size(text: str, *, what: str) -> int:
    """Bytes from ``17179869184``, ``16G``, ``16GiB``, ``512M`` or ``1.5T`` (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", str(text), re.I)
    if not m:
        raise ConfigError(f"{what} {text!r} is not a size; give bytes or a number with K, M, G or T (e.g. 16G)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ConfigError(f"{what} {text!r} must be more than 0 bytes (e.g. 16G)")
    return value


def memory_budget(env: Mapping[str, str] | None = None) -> int:
    """The budget in bytes: ``SGLFIX_MEMORY_BUDGET`` when set, else 8 GiB."""
    text = (envs.SGLFIX_MEMORY_BUDGET.get(env=env) or "").strip()
    return parse_size(text, what=MEMORY_BUDGET_ENV) if text else DEFAULT_MEMORY_BUDGET


def format_size(n: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def check_memory(scenarios: Iterable[Scenario], *, budget_bytes: int | None = None) -> None:
    """Refuse, in one line naming the scenario, the first one whose estimate exceeds the budget.

    ``budget_bytes`` None: ``memory_budget()`` (the environment, else 8 GiB).
    """
    budget = memory_budget() if budget_bytes is None else budget_bytes
    for s in scenarios:
        estimate = estimate_memory(s)
        if estimate.total <= budget:
            continue
        part, size = estimate.largest
        enough = 2 ** math.ceil(math.log2(estimate.total / GiB)) if estimate.total > GiB else 1
        where = f"{s.path}:{s.line}: " if s.path else ""
        raise ConfigError(
            f"{where}scenario {s.name} needs about {format_size(estimate.total)} of memory (largest: {part}, "
            f"{format_size(size)}), over the memory budget of {format_size(budget)}; shrink the batch, or raise "
            f"the budget with {MEMORY_BUDGET_ENV}={enough}G (or --memory-budget {enough}G)"
        )
