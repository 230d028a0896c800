"""The judge of a gated-delta-net layer set's multi-item scoring metadata (``GDNAttnBackend.mis_metadata``,
built by sglang's ``build_gdn_mis_metadata`` on every eager init of a batch carrying delimiters).

GDN scores items by running the recurrence over the query once and over each item from the
query's final state: the metadata splits the batch's tokens into query segments (one per request
with a query) and branches (per request, each item with the delimiter before it, then the closing
delimiter alone), each naming its request. Its consumer (``_forward_extend_mis``, the layer's
forward) is not run where the fla kernels cannot run, so the segments are judged directly: from
the scenario's item lengths and extend lengths alone, never from the delimiter offsets the code
under test reads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gdn_mis_reference", "gdn_mis_segments", "gdn_mis_view"]

# The fields, their dtype and the host list that mirrors each split.
_INDEX = ("query_token_indices", "query_request_indices", "item_token_indices", "item_request_indices")
_CU = (("query_cu_seqlens", "query_seq_lens_cpu"), ("item_cu_seqlens", "item_seq_lens_cpu"))


def gdn_mis_segments(*, items: list[Any], extend_lens: list[int]) -> dict[str, list[int]] | None:
    """The query segments and item branches of a batch whose every request carries items (None
    for a batch without delimiters): token indices into the batch's new tokens, lengths, request
    of each."""
    if all(request is None for request in items):
        return None
    out: dict[str, list[int]] = {k: [] for k in ("qi", "ql", "qr", "ii", "il", "ir")}
    start = 0
    for b, (request, new) in enumerate(zip(items, extend_lens)):
        request = list(request or [])
        query = new - sum(request) - len(request) - 1
        if query > 0:
            out["qi"] += range(start, start + query)
            out["ql"].append(query)
            out["qr"].append(b)
        at = start + query
        # Each item after the delimiter before it; the closing delimiter is a branch of its own.
        for length in [*request, 0]:
            out["ii"] += range(at, at + 1 + length)
            out["il"].append(1 + length)
            out["ir"].append(b)
            at += 1 + length
        start += new
    return out


def gdn_mis_reference(metadata: Any, *, items: list[Any], extend_lens: list[int], device: Any) -> str:
    """What is wrong with ``metadata`` (GDN's ``mis_metadata`` after an init) for the batch the
    items describe ("" when nothing)."""
    import torch

    want = gdn_mis_segments(items=items, extend_lens=extend_lens)
    if want is None:
        return "" if metadata is None else "mis_metadata is built for a batch without delimiters"
    if metadata is None:
        return "mis_metadata is None for a batch whose requests carry delimiters"
    lists = dict(zip(_INDEX, (want["qi"], want["qr"], want["ii"], want["ir"])))
    lens = {"query_seq_lens_cpu": want["ql"], "item_seq_lens_cpu": want["il"]}
    for name, values in lists.items():
        wrong = _tensor(getattr(metadata, name), name, values, torch.int64, device)
        if wrong:
            return wrong
    for cu_name, host in _CU:
        cu = [0]
        for n in lens[host]:
            cu.append(cu[-1] + n)
        wrong = _tensor(getattr(metadata, cu_name), cu_name, cu, torch.int32, device)
        if wrong:
            return wrong
        got = getattr(metadata, host)
        if not isinstance(got, list):
            # The forward splits its host loops by this list.
            return f"{host} is {type(got).__name__}, not the list of the segments' lengths {lens[host]}"
        if [int(n) for n in got] != lens[host]:
            return f"{host} = {got}, the segments' lengths are {lens[host]}"
    return ""


def _tensor(got: Any, name: str, want: list[int], dtype: Any, device: Any) -> str:
    import torch

    if not isinstance(got, torch.Tensor):
        return f"{name} is {type(got).__name__}, not a tensor"
    if got.dtype != dtype:
        # The gathers and the kernels' offsets take these dtypes as they are.
        return f"{name} is {got.dtype}, its kernels read {dtype}"
    if got.device != torch.device(device):
        return f"{name} is on {got.device}, the batch's tokens on {device}"
    have = got.to("cpu", torch.long).tolist()
    if have != want:
        at = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
        return f"{name} = {have} ({len(have)} entries), the batch's segments give {want} (first difference at {at})"
    return ""


def gdn_mis_view(metadata: Any) -> dict[str, Any]:
    """The segments GDN's multi-item forward reads, for the digest ({} without them)."""
    if metadata is None:
        return {}
    return {f"mis_{name}": getattr(metadata, name) for name in (*_INDEX, *(cu for cu, _ in _CU))}
