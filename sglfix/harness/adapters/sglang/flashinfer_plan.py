"""The judge of FlashInfer's decode plans on real sglang: after every metadata init of a plain
decode (eager, each capture, each replay), each decode wrapper's planned page table against what
the batch it was planned for implies, read from the request rows as the case wrote them.

A graph's capture plans its wrappers over the runner's padding batch (every row request row 0,
``seq_lens`` the fill value), and every replay plans them again over the live batch: a capture
that plans other lengths leaves no trace in any replayed output, yet the captured graph was
recorded over that plan (its split-KV schedule among it). So the plan is judged where it is made,
capture included, not through the output.

Which keys a wrapper must read, for request row ``r`` of ``seq_lens`` L (page size 1, the size
sglang's FlashInfer backends run):
- one wrapper: positions ``[0, L)`` of row ``r``;
- a sliding-window layer (two wrappers): the window wrapper the last ``min(L, window + 1)``
  positions (the query at ``L - 1`` sees ``window`` keys back), the full wrapper ``[0, L)``;
- an encoder-decoder batch (two wrappers, encoder length E): the self wrapper the decoder's
  positions ``[E, E + L)``, the cross wrapper the encoder's ``[0, E)``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DecodePlanTruth", "decode_plan_reference"]


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


def _ints(t: Any, n: int | None = None) -> list[int]:
    values = t.to("cpu").reshape(-1).tolist()
    return [int(x) for x in (values if n is None else values[:n])]


def decode_plan_reference(truth: DecodePlanTruth, forward_batch: Any, wrappers: Any) -> str:
    """ "" when every decode wrapper of this init reads exactly the keys its rows imply; else what
    the first wrong one reads."""
    bs = int(forward_batch.batch_size)
    rows = _ints(forward_batch.req_pool_indices, bs)
    lens = _ints(forward_batch.seq_lens, bs)
    enc = forward_batch.encoder_lens
    encoder = _ints(enc, bs) if enc is not None else [None] * bs
    spans = [truth.spans(row=r, length=n, encoder=e) for r, n, e in zip(rows, lens, encoder)]
    if len(wrappers) != len(spans[0]):
        return f"the init planned {len(wrappers)} decode wrapper(s), the layer reads {len(spans[0])}"
    for w, wrapper in enumerate(wrappers):
        indptr = getattr(wrapper, "_paged_kv_indptr_buf", None)
        indices = getattr(wrapper, "_paged_kv_indices_buf", None)
        last = getattr(wrapper, "_paged_kv_last_page_len_buf", None)
        if indptr is None or indices is None:
            return f"wrapper {w} holds no planned page table"
        ptr, flat = _ints(indptr, bs + 1), _ints(indices)
        tails = _ints(last, bs) if last is not None else None
        for b, (row, per_wrapper) in enumerate(zip(rows, spans)):
            start, end = per_wrapper[w]
            want = truth.rows[row][start:end]
            got = flat[ptr[b] : ptr[b + 1]]
            where = f"wrapper {w} row {b} (request row {row}, seq_lens {lens[b]})"
            if len(got) != len(want):
                return f"{where} plans {len(got)} keys, its layer reads {len(want)} (positions {start}..{end - 1})"
            if got != want:
                i = next(i for i, (a, x) in enumerate(zip(got, want)) if a != x)
                return f"{where} reads slot {got[i]} for position {start + i}, which is at slot {want[i]}"
            if tails is not None and want and tails[b] != 1:
                return f"{where} plans a last page of {tails[b]} slots; at page size 1 every page holds one"
    return ""
