"""The judge of a Mamba2 layer set's metadata (``model.linear_attention: mamba2``): what
``Mamba2AttnBackend`` adds to the linear layers' slots and offsets, ``Mamba2Metadata``, against
what the batch implies. A decode or verify (``prepare_decode``): every row a decode, no prefill. An
extend (``prepare_mixed``): the prefill count and tokens, which requests start from a cached state
(a prefix), each token's request (``seq_idx``), and the logical chunks the chunked scan walks: the
token stream cut at every request start and every ``chunk_size`` boundary, each chunk named by the
physical chunk it lies in (``chunk_indices``) and where in it it starts (``chunk_offsets``), only
where some request has a prefix (the scan reads them then). A GDN layer set has none of these.
"""

from __future__ import annotations

import itertools
from typing import Any

from sglfix.harness.adapters.sglang.truth import first_difference

__all__ = ["mamba2_reference", "mamba2_view"]

_SCALARS = ("num_prefills", "num_prefill_tokens", "num_decodes", "is_target_verify", "draft_token_num")


def _is_mamba2(metadata: Any) -> bool:
    return metadata is not None and type(metadata).__name__ == "Mamba2Metadata"


def mamba2_view(metadata: Any) -> dict[str, Any]:
    """The Mamba2 fields its kernels read, for the digest ({} for a GDN layer set)."""
    if not _is_mamba2(metadata):
        return {}
    mixed = metadata.mixed_metadata
    view = {name: getattr(metadata, name, None) for name in _SCALARS}
    if mixed is not None:
        view.update(
            has_initial_states=mixed.has_initial_states,
            prep_initial_states=mixed.prep_initial_states,
            chunk_size=mixed.chunk_size,
            seq_idx=mixed.seq_idx,
            chunk_indices=mixed.chunk_indices,
            chunk_offsets=mixed.chunk_offsets,
        )
    return view


def logical_chunks(lens: list[int], chunk_size: int) -> tuple[list[int], list[int]]:
    """The chunked scan's logical chunks over requests of ``lens`` tokens laid end to end: a new
    chunk at every request's first token and every ``chunk_size`` boundary; each chunk's physical
    chunk and its offset in it."""
    indices, offsets = [], []
    start = 0
    for n in lens:
        for t in range(start, start + n):
            if t == start or t % chunk_size == 0:
                indices.append(t // chunk_size)
                offsets.append(t % chunk_size)
        start += n
    return indices, offsets


def _ints(value: Any) -> Any:
    import torch

    return value.to("cpu", torch.long).reshape(-1).tolist() if isinstance(value, torch.Tensor) else value


def mamba2_reference(metadata: Any, batch: Any, *, offsets: list[int], draft_tokens: int, chunk: int | None) -> str:
    """What is wrong with a Mamba2 layer set's metadata for ``batch`` ("" when nothing or GDN);
    ``offsets`` are the batch's token offsets per request, as the caller derived them, ``chunk``
    the scan chunk the model's config declares."""
    if not _is_mamba2(metadata):
        return ""
    mode = batch.forward_mode
    bs = int(batch.batch_size)
    verify = bool(mode.is_target_verify())
    if mode.is_extend() and not verify:
        lens = [b - a for a, b in itertools.pairwise(offsets)]
        prefixes = _ints(batch.extend_prefix_lens)[:bs]
        want = {
            "num_prefills": bs,
            "num_prefill_tokens": sum(lens),
            "num_decodes": 0,
            "is_target_verify": False,
            "draft_token_num": 1,
        }
    else:
        lens, prefixes = [], []
        want = {
            "num_prefills": 0,
            "num_prefill_tokens": 0,
            "num_decodes": bs,
            "is_target_verify": verify,
            "draft_token_num": draft_tokens if verify else 1,
        }
    for name, value in want.items():
        have = getattr(metadata, name, None)
        if have != value:
            return f"Mamba2 {name} is {have!r}, the batch of {bs} ({mode.name}) gives {value!r}"
    if getattr(batch, "mamba_track_mask", None) is None:
        # Nothing tracked: no track destination for the kernels to write a snapshot to.
        for name in ("mamba_track_indices", "track_conv_indices"):
            if getattr(metadata, name, None) is not None:
                return f"Mamba2 {name} is set for a batch that tracks no Mamba state"
    mixed = metadata.mixed_metadata
    if not lens:
        if mixed is not None:
            return f"Mamba2 mixed_metadata is set for a {mode.name} batch (no prefill)"
        return ""
    if mixed is None:
        return f"Mamba2 mixed_metadata is None for an extend of {bs} requests"
    assert chunk is not None, "a Mamba2 layer set's adapter declares its scan chunk"
    return _mixed_reference(mixed, lens=lens, prefixes=prefixes, chunk=chunk)


def _mixed_reference(mixed: Any, *, lens: list[int], prefixes: list[int], chunk: int) -> str:
    """An extend's ``MixedMetadata`` against its requests' lengths and prefixes."""
    bs = len(lens)
    import torch

    for name in ("has_initial_states", "seq_idx"):
        if not isinstance(getattr(mixed, name, None), torch.Tensor):
            return f"Mamba2 {name} is {getattr(mixed, name, None)!r}, not a tensor, for an extend of {bs} requests"
    if tuple(mixed.seq_idx.shape) != (1, sum(lens)):
        # The chunked scan kernels take it batched: one row of every token's request.
        return f"Mamba2 seq_idx has shape {tuple(mixed.seq_idx.shape)}, the scan takes (1, {sum(lens)})"
    if mixed.chunk_size != chunk:
        return f"Mamba2 chunk_size is {mixed.chunk_size!r}, the model's mamba_chunk_size is {chunk}"
    initial = [p > 0 for p in prefixes]
    have = [bool(x) for x in _ints(mixed.has_initial_states)[:bs]]
    if have != initial:
        return f"Mamba2 has_initial_states is {have}, the prefixes {prefixes} give {initial}"
    if bool(mixed.prep_initial_states) != any(initial):
        return f"Mamba2 prep_initial_states is {mixed.prep_initial_states}, the prefixes {prefixes} give {any(initial)}"
    seq_idx = [r for r, n in enumerate(lens) for _ in range(n)]
    have = _ints(mixed.seq_idx)
    at = first_difference(have, seq_idx)
    if at is not None:
        return f"Mamba2 seq_idx names request {have[at] if at < len(have) else None} for token {at}, of request {seq_idx[at] if at < len(seq_idx) else None}"
    if any(initial):
        indices, chunk_offsets = logical_chunks(lens, chunk)
        for name, want_list in (("chunk_indices", indices), ("chunk_offsets", chunk_offsets)):
            have = _ints(getattr(mixed, name))
            if have != want_list:
                return f"Mamba2 {name} is {have}, the requests' {lens} tokens in chunks of {chunk} give {want_list}"
    return ""
