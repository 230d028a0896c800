"""FlashMLA's dense decode kernel and its scheduler (``get_mla_metadata``, ``flash_mla_with_kvcache``
as sglang's ``flash_mla_interface`` calls them) as torch code, for real sglang's ``FlashMLABackend``
where the ``flash_mla`` package is not installed: on CPU, and on a GPU without it.

What FlashMLA reads, and so what this reads:

* ``get_mla_metadata(cache_seqlens, q_tokens_per_head_k, num_heads_k)`` splits the batch's pages
  (request ``b`` has ``ceil(cache_seqlens[b] / 64)``) into at most ``SM_PARTS`` contiguous runs, one
  per SM partition: ``tile_scheduler_metadata[p] = (begin request, begin page, end request, end page,
  0, 0, 0, 0)``, the end exclusive; ``num_splits[b]`` counts the runs of the requests before ``b``
  and ``num_splits[b + 1] - num_splits[b]`` those that touch ``b`` (the combine step reads ``b``'s
  partial results there).
* ``flash_mla_with_kvcache`` attends, for request ``b``, the keys its scheduled runs cover and
  ``cache_seqlens[b]`` admits, read through ``block_table[b]`` from the paged latent cache; causal
  aligns query row ``i`` of ``s_q`` to position ``cache_seqlens[b] - s_q + i``. A request whose
  ``num_splits`` disagree with the runs gets NaN (the combine would read other requests' partials),
  a block id outside the cache raises (on the GPU: an illegal address).

Scores are ``q . k`` over the key's full width scaled by ``softmax_scale``, the value the first
``head_dim_v`` values of the key (the latent); the log-sum-exp is natural, as FlashMLA returns it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

from sglfix.harness.codefault import OutOfBounds

__all__ = [
    "PAGE",
    "SM_PARTS",
    "covered_pages",
    "flash_mla_with_kvcache",
    "get_mla_metadata",
    "import_without_flash_mla",
    "in_ranges",
    "install",
]

PAGE = 64
# SM partitions the scheduler splits into (FlashMLA: the SM count over the KV heads and query
# tiles; the backend's graph buffer holds one row per SM, so any count up to that fits).
SM_PARTS = 8


def get_mla_metadata(
    cache_seqlens: torch.Tensor | None = None,
    num_q_tokens_per_head_k: int | None = None,
    num_heads_k: int | None = None,
    num_heads_q: int | None = None,
    is_fp8_kvcache: bool = False,
    topk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if cache_seqlens is None or topk is not None:
        raise NotImplementedError("the FlashMLA stand-in schedules the dense decode (cache_seqlens, no topk) only")
    lens = cache_seqlens.to("cpu", torch.int64).tolist()
    pages = [(n + PAGE - 1) // PAGE for n in lens]
    units = [(b, p) for b, n in enumerate(pages) for p in range(n)]
    parts = max(1, min(SM_PARTS, len(units)))
    meta = torch.zeros((parts, 8), dtype=torch.int32)
    touches = [0] * len(lens)
    per, extra = divmod(len(units), parts)
    start = 0
    for p in range(parts):
        end = start + per + (p < extra)
        if end > start:
            (b0, p0), (b1, p1) = units[start], units[end - 1]
            meta[p, :4] = torch.tensor([b0, p0, b1, p1 + 1])
            for b in range(b0, b1 + 1):
                touches[b] += 1
        start = end
    splits = torch.zeros(len(lens) + 1, dtype=torch.int32)
    splits[1:] = torch.cumsum(torch.tensor(touches, dtype=torch.int32), 0)
    return meta.to(cache_seqlens.device), splits.to(cache_seqlens.device)


def covered_pages(meta: torch.Tensor, bs: int) -> tuple[list[list[tuple[int, int | None]]], list[int]]:
    """Each request's page ranges its runs cover (``(lo, None)``: from ``lo`` to its last page)
    and how many runs touch it."""
    ranges: list[list[tuple[int, int | None]]] = [[] for _ in range(bs)]
    touches = [0] * bs
    if not isinstance(meta, torch.Tensor) or meta.dim() != 2 or meta.shape[1] < 4:
        raise ValueError("tile_scheduler_metadata must be a [num_sm_parts, 8] int32 tensor")
    for b0, p0, b1, p1 in meta[:, :4].to("cpu", torch.int64).tolist():
        if b1 < b0 or (b1 == b0 and p1 <= p0):
            continue  # an empty run
        for b in range(max(b0, 0), min(b1, bs - 1) + 1):
            ranges[b].append((p0 if b == b0 else 0, p1 if b == b1 else None))
            touches[b] += 1
    return ranges, touches


def in_ranges(ranges: list[tuple[int, int | None]], page: int) -> bool:
    return any(lo <= page and (hi is None or page < hi) for lo, hi in ranges)


def flash_mla_with_kvcache(  # noqa: PLR0913 - FlashMLA's own signature, as sglang calls it
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: Any,
    num_splits: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    descale_q: Any = None,
    descale_k: Any = None,
    is_fp8_kvcache: bool = False,
    indices: Any = None,
    attn_sink: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if indices is not None or attn_sink is not None or descale_q is not None or is_fp8_kvcache:
        raise NotImplementedError("the FlashMLA stand-in runs the dense bf16/fp16 decode kernel only")
    if block_table is None or cache_seqlens is None or num_splits is None:
        raise ValueError("the dense decode kernel needs block_table, cache_seqlens and num_splits")
    bs, s_q, heads, dim = q.shape
    if k_cache.dim() != 4 or k_cache.shape[1] != PAGE:
        raise ValueError(f"k_cache must be [blocks, {PAGE}, heads_k, dim], got {tuple(k_cache.shape)}")
    scale = softmax_scale if softmax_scale is not None else dim**-0.5
    lens = cache_seqlens.to("cpu", torch.int64).tolist()
    if len(lens) < bs or block_table.shape[0] < bs:
        # The kernel would read rows past both tensors (on the GPU an illegal address): the
        # caller's fault, not the stand-in's.
        raise OutOfBounds(
            f"cache_seqlens ({len(lens)}) and block_table ({block_table.shape[0]}) cover fewer than {bs} requests"
        )
    covered, touches = covered_pages(tile_scheduler_metadata, bs)
    splits = num_splits.to("cpu", torch.int64).tolist()
    table = block_table.to("cpu", torch.int64)
    out = torch.zeros((bs, s_q, heads, head_dim_v), dtype=torch.float32, device=q.device)
    lse = torch.full((bs, heads, s_q), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(bs):
        # The combine step reads request b's partial results at num_splits[b] .. num_splits[b + 1]
        # of one array: offsets that are not the runs' running count read other requests' partials.
        if len(splits) < b + 2 or splits[b] != sum(touches[:b]) or splits[b + 1] - splits[b] != touches[b]:
            out[b] = float("nan")
            continue
        n = lens[b]
        if n <= 0:
            continue
        pos = [j for j in range(n) if in_ranges(covered[b], j // PAGE)]
        if not pos:
            continue
        if pos[-1] // PAGE >= table.shape[1]:
            # The kernel would read past the row (the next request's blocks, or past the table).
            raise OutOfBounds(
                f"block_table is {table.shape[1]} blocks wide; request {b}'s {n} keys need {pos[-1] // PAGE + 1}"
            )
        blocks = table[b, [j // PAGE for j in pos]]
        if int(blocks.min()) < 0 or int(blocks.max()) >= k_cache.shape[0]:
            raise OutOfBounds(f"block_table row {b} names a block outside the cache ({k_cache.shape[0]} blocks)")
        offsets = torch.tensor([j % PAGE for j in pos])
        keys = k_cache[blocks.to(k_cache.device), offsets.to(k_cache.device), 0].float()  # [L, dim]
        qf = q[b].float()  # [s_q, heads, dim]
        scores = torch.einsum("shd,ld->hsl", qf, keys) * scale
        if causal:
            where = torch.tensor(pos, device=q.device)[None, :]
            limit = (n - s_q + torch.arange(s_q, device=q.device))[:, None]
            scores = scores.masked_fill(~(where <= limit)[None], float("-inf"))
        lse[b] = torch.logsumexp(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[b] = torch.einsum("hsl,ld->shd", probs, keys[:, :head_dim_v])
    return out.to(q.dtype), lse


def install(module: ModuleType) -> bool:
    """Bind the stand-ins over ``module``'s FlashMLA names when its ``flash_mla`` is a stand-in
    module (the package is missing); True when the module now runs on them."""
    current = module.__dict__.get("flash_mla_with_kvcache")
    # Newer releases import them from sglang's FlashMLA interface over the flash_mla package,
    # earlier ones from sgl_kernel, which is a stand-in where its CUDA wheel is missing.
    if current is flash_mla_with_kvcache or _runs_on_standin(module) or hasattr(current, "_standin_path"):
        module.flash_mla_with_kvcache = flash_mla_with_kvcache
        module.get_mla_metadata = get_mla_metadata
        return True
    return False


def _runs_on_standin(module: ModuleType) -> bool:
    interface = sys.modules.get("sglang.kernels.ops.attention.flash_mla_interface")
    package = getattr(interface, "flash_mla", None)
    return bool(getattr(package, "__sglfix_standin__", False))


@contextmanager
def import_without_flash_mla() -> Iterator[None]:
    """While open, ``import flash_mla`` (and its submodules) gives an inert stand-in when the
    package is missing, so that sglang's FlashMLA interface module imports; afterwards the package
    is missing again for everyone else (``find_spec("flash_mla")`` is None)."""
    from sglfix.codebases import standins

    if importlib.util.find_spec("flash_mla") is not None:
        yield
        return

    class _Finder:
        @staticmethod
        def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
            if fullname.split(".")[0] == "flash_mla":
                return standins.spec_for(fullname)
            return None

    sys.meta_path.append(_Finder)  # type: ignore[arg-type]
    try:
        yield
    finally:
        sys.meta_path.remove(_Finder)  # type: ignore[arg-type]
        for name in [n for n in sys.modules if n.split(".")[0] == "flash_mla"]:
            del sys.modules[name]
