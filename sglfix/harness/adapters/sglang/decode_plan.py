"""The judge of a plain decode's page tables on real sglang: after every metadata init (eager,
each capture, each replay), each page table a decode kernel reads (FlashInfer's decode wrappers'
plans, Triton's ``kv_indptr`` / ``kv_indices``) against what the batch it was built for implies,
read from the request rows as the case wrote them.

A graph's capture builds its tables over the runner's padding batch (every row request row 0,
``seq_lens`` the fill value), and every replay builds them again over the live batch: a capture
that builds other lengths leaves no trace in any replayed output, yet the captured graph was
recorded over them (a split-KV schedule among it). So the tables are judged where they are made,
capture included, not through the output.

Which keys a table must read, for request row ``r`` of ``seq_lens`` L (page size 1: FlashInfer's
backends run no other; Triton's table is of slots whatever the page size):
- one wrapper: positions ``[0, L)`` of row ``r``;
- a sliding-window layer (two wrappers): the window wrapper the last ``min(L, window + 1)``
  positions (the query at ``L - 1`` sees ``window`` keys back), the full wrapper ``[0, L)``;
- an encoder-decoder batch (two wrappers, encoder length E): the self wrapper the decoder's
  positions ``[E, E + L)``, the cross wrapper the encoder's ``[0, E)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglfix.harness.adapters.sglang.reports import init_reports, keep_report
from sglfix.harness.adapters.sglang.truth import first_difference, host_ints

__all__ = ["DecodePlanTruth", "Rail", "decode_plan_findings", "decode_plan_reference", "judge_decode", "wrapper_rails"]


class DecodePlanTruth:
    """The request rows as written before any backend ran, and the layer's window."""

    def __init__(self, *, rows: list[list[int]], window: int | None) -> None:
        self.rows, self.window = rows, window

    def spans(self, *, row: int, length: int, encoder: int | None) -> list[tuple[int, int]]:
        """Per wrapper, the [start, end) positions of row ``row`` it must read."""
        if encoder is not None:
            return [(encoder, encoder + length), (0, encoder)]
        if self.window is not None:
            return [(length - min(length, self.window + 1), length), (0, length)]
        return [(0, length)]


# Where a backend keeps its decode tables' reports.
_KEY = "_sglfix_decode_reports"


@dataclass(frozen=True)
class Rail:
    """One page table a decode kernel reads: its row offsets, its slots and (FlashInfer) the
    length of each row's last page."""

    name: str
    indptr: Any
    indices: Any
    last_page_len: Any = None


def wrapper_rails(wrappers: Any) -> list[Rail]:
    """FlashInfer's decode wrappers' planned tables (its private buffers, which sglfix's torch
    stand-ins keep under the same names)."""
    return [
        Rail(
            name=f"wrapper {w}",
            indptr=getattr(wrapper, "_paged_kv_indptr_buf", None),
            indices=getattr(wrapper, "_paged_kv_indices_buf", None),
            last_page_len=getattr(wrapper, "_paged_kv_last_page_len_buf", None),
        )
        for w, wrapper in enumerate(wrappers)
    ]


def decode_plan_reference(truth: DecodePlanTruth, forward_batch: Any, rails: list[Rail]) -> str:
    """ "" when every table of this init reads exactly the keys its rows imply; else what the
    first wrong one reads."""
    bs = int(forward_batch.batch_size)
    rows = host_ints(forward_batch.req_pool_indices, bs)
    lens = host_ints(forward_batch.seq_lens, bs)
    enc = getattr(forward_batch, "encoder_lens", None)
    encoder = host_ints(enc, bs) if enc is not None else [None] * bs
    spans = [truth.spans(row=r, length=n, encoder=e) for r, n, e in zip(rows, lens, encoder)]
    if len(rails) != len(spans[0]):
        return f"the init built {len(rails)} decode table(s), the layer reads {len(spans[0])}"
    for w, rail in enumerate(rails):
        if rail.indptr is None or rail.indices is None:
            return f"{rail.name} holds no page table"
        ptr, flat = host_ints(rail.indptr, bs + 1), host_ints(rail.indices)
        tails = host_ints(rail.last_page_len, bs) if rail.last_page_len is not None else None
        if len(flat) < ptr[bs]:
            return f"{rail.name} holds {len(flat)} slots, its offsets read {ptr[bs]}"
        for b, (row, per_rail) in enumerate(zip(rows, spans)):
            start, end = per_rail[w]
            want = truth.rows[row][start:end]
            got = flat[ptr[b] : ptr[b + 1]]
            where = f"{rail.name} row {b} (request row {row}, seq_lens {lens[b]})"
            if len(got) != len(want):
                return f"{where} reads {len(got)} keys, its layer reads {len(want)} (positions {start}..{end - 1})"
            i = first_difference(got, want)
            if i is not None:
                return f"{where} reads slot {got[i]} for position {start + i}, which is at slot {want[i]}"
            if tails is not None and want and tails[b] != 1:
                return f"{where} plans a last page of {tails[b]} slots; at page size 1 every page holds one"
    return ""


def judge_decode(backend: Any, forward_batch: Any, rails: list[Rail]) -> None:
    """After an init of ``backend``: where it is a plain decode (no speculative input) and the
    adapter gave the backend its truth (``_sglfix_decode_truth``), the init's tables judged, the
    report kept for ``decode_plan_findings``."""
    truth = getattr(backend, "_sglfix_decode_truth", None)
    if truth is None or not forward_batch.forward_mode.is_decode_or_idle() or forward_batch.spec_info is not None:
        return
    keep_report(backend, _KEY, decode_plan_reference(truth, forward_batch, rails))


def decode_plan_findings(backend: Any) -> list[tuple[str, str]]:
    """The first wrong init's report (DIVERGE), or a PASS row naming how many were judged."""
    return init_reports(
        backend,
        _KEY,
        what="decode plan, ",
        passed=lambda n: (
            f"metadata reference: every decode page table, at each of {n} metadata init(s), reads the keys its "
            "rows imply"
        ),
    )
