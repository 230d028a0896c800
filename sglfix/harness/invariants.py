"""Metadata invariants, checked after every metadata init (eager, capture and replay).

One table for every backend: an adapter names which of its metadata fields are CSR offsets
(start at 0, never decrease), lengths (never negative), page/slot indices (inside the pool,
covered by an offsets field, or by a lengths field for a dense block table) and locations (one
pool slot per row, e.g. a KV write target baked into the metadata). The field names follow
upstream's metadata (``kv_indptr``, ``qo_indptr``, ``mask_indptr``, ``window_kv_indptr``,
``cu_seqlens_q/k``, ``cache_seqlens_int32``, ``max_seq_len_k``, ``raw_out_loc`` ...). These
catch corrupt metadata even where the real rows' output happens to stay right (padded rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["UPSTREAM_FIELDS", "MetadataFields", "check_metadata", "check_metadata_views"]


@dataclass(frozen=True)
class MetadataFields:
    """Which metadata attributes are checked, and as what."""

    indptr: tuple[str, ...] = ()
    lengths: tuple[str, ...] = ()
    # indices field -> the indptr field whose last entry says how many are used
    indices: Mapping[str, str] = field(default_factory=dict)
    # dense block table [rows, width] of page ids -> (lengths field, page-size field): row b's
    # first ceil(lengths[b] / page_size) entries are read, so they must be pages of the pool
    block_tables: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # 1-D tensors of pool slots, exactly one per row, each inside the pool
    locations: tuple[str, ...] = ()
    # scratch buffers the kernels write before they read (split-K partials, a persistent grid's
    # partial results): not checked; their contents and slack are no part of what was built
    # (``sglfix.harness.fingerprint``)
    scratch: tuple[str, ...] = ()
    # flat buffers other than indices read through an indptr (a custom mask through its
    # mask_indptr): field -> that indptr; read up to the last row's end (the fingerprint only)
    read_to: Mapping[str, str] = field(default_factory=dict)
    # offsets that only say where each row's data lies in a buffer the view also carries as the
    # rows read it (FlashInfer's mask_indptr beside its custom_mask, the bits each row reads):
    # checked as indptrs, but the fingerprint digests the data read, not where it lies
    offsets: tuple[str, ...] = ()
    # fields that only choose how the kernels split the work (split-K counts, a launch's grid
    # bound, a scratch sized by them): any value the kernels accept computes the same attention,
    # summed in another order. A mutant that changes these alone, and no cell's verdict, is a
    # suspected equivalent of its own kind (``sglfix.report.mutation``), never a survivor
    schedule: tuple[str, ...] = ()


# Every field name upstream's attention test kit checks; an adapter picks the ones its
# metadata has (a field that is absent or None is skipped).
UPSTREAM_FIELDS = MetadataFields(
    indptr=("kv_indptr", "qo_indptr", "mask_indptr", "window_kv_indptr", "cu_seqlens_q", "cu_seqlens_k"),
    lengths=(
        "cache_seqlens_int32",
        "seq_lens_q",
        "seq_lens_k",
        "max_seq_len_q",
        "max_seq_len_k",
        "max_extend_len",
        "window_kv_lens",
    ),
    indices={"kv_indices": "kv_indptr", "window_kv_indices": "window_kv_indptr"},
)


def _indptr(name: str, t: torch.Tensor, rows: int, found: list[str]) -> torch.Tensor | None:
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


def _lengths(name: str, value: Any, rows: int, found: list[str]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if value < 0:
            found.append(f"{name} = {value} < 0")
        return
    if isinstance(value, torch.Tensor):
        v = value.reshape(-1)[: rows if value.dim() else 1].to(torch.int64).cpu()
        if bool((v < 0).any()):
            i = int((v < 0).nonzero()[0])
            found.append(f"{name}[{i}] = {int(v[i])} < 0")


def _block_table(
    name: str,
    table: torch.Tensor,
    len_name: str,
    lengths: torch.Tensor,
    page_size: int,
    rows: int,
    num_slots: int,
    found: list[str],
) -> None:
    t = table[:rows].to(torch.int64).cpu()
    lens = lengths.reshape(-1)[:rows].to(torch.int64).cpu()
    if t.dim() != 2 or t.shape[0] < rows or lens.numel() < rows:
        found.append(
            f"{name} has {t.shape[0] if t.dim() else 0} rows / {len_name} {lens.numel()} entries for {rows} rows"
        )
        return
    num_pages = num_slots // page_size
    # Negative lengths are the lengths check's finding; they read no page.
    needed = (lens.clamp(min=0) + page_size - 1) // page_size
    width = t.shape[1]
    if bool((needed > width).any()):
        i = int((needed > width).nonzero()[0])
        found.append(f"{len_name}[{i}] = {int(lens[i])} needs {int(needed[i])} pages, {name} has {width} columns")
    live = torch.arange(width)[None, :] < needed[:, None]
    bad = live & ((t < 0) | (t >= num_pages))
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        found.append(f"{name}[{i}, {j}] = {int(t[i, j])} outside the KV pool's pages [0, {num_pages})")


def _locations(name: str, t: torch.Tensor, rows: int, num_slots: int, found: list[str]) -> None:
    v = t.reshape(-1).to(torch.int64).cpu()
    if t.dim() != 1 or v.numel() != rows:
        found.append(f"{name} has {v.numel()} entries (shape {tuple(t.shape)}) for {rows} rows, not one per row")
    bad = (v[:rows] < 0) | (v[:rows] >= num_slots)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        found.append(f"{name}[{i}] = {int(v[i])} outside the KV pool [0, {num_slots})")


_WHOLE_INDICES = 1 << 16


class _HostView:
    """The metadata's checked fields as host tensors (read in one wait), anything else as is."""

    def __init__(self, metadata: Any, host: dict[str, Any]) -> None:
        self._metadata, self._host = metadata, host

    def __getattr__(self, name: str) -> Any:
        if name in self._host:
            return self._host[name]
        return getattr(self._metadata, name)


def _picks(metadata: Any, fields: MetadataFields, rows: int) -> dict[str, torch.Tensor]:
    """The checked fields, each cut to what its check reads (buffers are sized for the largest
    batch), still on the device."""

    def head(t: torch.Tensor, n: int) -> torch.Tensor:
        return t[:n] if t.dim() else t

    def flat_head(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1)[:rows] if t.dim() else t

    cuts: dict[str, set] = {}
    for name in fields.indptr:
        cuts.setdefault(name, set()).add(("head", rows + 1))
    for name in fields.lengths:
        cuts.setdefault(name, set()).add(("flat", rows))
    for table, (len_name, _page) in fields.block_tables.items():
        cuts.setdefault(table, set()).add(("head", rows))
        cuts.setdefault(len_name, set()).add(("flat", rows))
    for name in [*fields.indices, *fields.locations]:
        cuts.setdefault(name, set()).add(("whole", 0))
    picked: dict[str, torch.Tensor] = {}
    for name, how in cuts.items():
        t = getattr(metadata, name, None)
        if not isinstance(t, torch.Tensor):
            continue
        # An indices buffer sized for the largest batch is read up to its offsets' end only, a
        # second wait, rather than copied whole.
        if name in fields.indices and t.numel() > _WHOLE_INDICES:
            continue
        kind, n = next(iter(how)) if len(how) == 1 else ("whole", 0)  # read two ways: copied whole
        picked[name] = head(t, n) if kind == "head" else flat_head(t) if kind == "flat" else t
    return picked


def check_metadata(
    metadata: Any, *, fields: MetadataFields = UPSTREAM_FIELDS, rows: int, num_slots: int, phase: str
) -> list[str]:
    """Findings (empty when sound) for a backend's metadata covering ``rows`` requests."""
    return check_metadata_views([(phase, metadata, rows)], fields=fields, num_slots=num_slots)


def check_metadata_views(
    views: list[tuple[str, Any, int]], *, fields: MetadataFields = UPSTREAM_FIELDS, num_slots: int
) -> list[str]:
    """``check_metadata`` over several metadata views at once, as ``(phase, metadata, rows)``:
    the checked fields of every view read in one wait (each wait also waits for the other
    workers sharing the GPU: sglfix.harness.hostcopy)."""
    from sglfix.harness.hostcopy import to_host

    picks = [_picks(metadata, fields, rows) for _phase, metadata, rows in views]
    read = iter(to_host([t for picked in picks for t in picked.values()]))
    found: list[str] = []
    for (phase, metadata, rows), picked in zip(views, picks):
        host = {name: next(read) for name in picked}
        found += _check(_HostView(metadata, host), fields=fields, rows=rows, num_slots=num_slots, phase=phase)
    return found


def _check(metadata: Any, *, fields: MetadataFields, rows: int, num_slots: int, phase: str) -> list[str]:
    found: list[str] = []
    offsets: dict[str, torch.Tensor] = {}
    for name in fields.indptr:
        t = getattr(metadata, name, None)
        if isinstance(t, torch.Tensor):
            before = len(found)
            v = _indptr(name, t, rows, found)
            if v is not None and len(found) == before:
                offsets[name] = v
    for name in fields.lengths:
        _lengths(name, getattr(metadata, name, None), rows, found)
    for name, ptr_name in fields.indices.items():
        indices = getattr(metadata, name, None)
        ptr = offsets.get(ptr_name)
        if not isinstance(indices, torch.Tensor) or ptr is None:
            continue
        end = int(ptr[-1])
        if end > indices.numel():
            found.append(f"{ptr_name}[{rows}] = {end} exceeds {name} length {indices.numel()}")
            continue
        used = indices[:end].to(torch.int64).cpu()
        bad = (used < 0) | (used >= num_slots)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            row = int(torch.searchsorted(ptr, torch.tensor(i), right=True)) - 1
            found.append(f"{name}[{i}] = {int(used[i])} (row {row}) outside the KV pool [0, {num_slots})")
    for name, (len_name, page_name) in fields.block_tables.items():
        table, lengths = getattr(metadata, name, None), getattr(metadata, len_name, None)
        page_size = getattr(metadata, page_name, None)
        if isinstance(table, torch.Tensor) and isinstance(lengths, torch.Tensor) and isinstance(page_size, int):
            _block_table(name, table, len_name, lengths, page_size, rows, num_slots, found)
    for name in fields.locations:
        t = getattr(metadata, name, None)
        if isinstance(t, torch.Tensor):
            _locations(name, t, rows, num_slots, found)
    return [f"{phase}: {f}" for f in found]
