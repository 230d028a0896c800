"""The judge of a short-convolution layer set's conv-state handle (``model.linear_attention:
short_conv``, LFM2's and ZAYA1's sidecar): what ``ShortConvAttnBackend`` hands a conv layer through
``conv_state_metadata`` after each init, against what the batch implies.

The model runs its own conv kernel against that handle, so every field is a read: the layer's pool
view, each row's state slot as int64 (the requests' slots, -1 for a padded row), the query offsets,
and for a prefill which requests resume a cached prefix (on the device and, for the host loops of
ZAYA1, as host lists); a decode or verify carries none of the prefill fields. Under a graph the
slots must be handed out at the address the capture saw: the captured conv kernels read that
buffer, so a replay that hands a fresh tensor leaves them reading the last capture's slots.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.sglang.truth import first_difference

__all__ = ["short_conv_reference", "short_conv_view"]


def _is_short_conv(backend: Any) -> bool:
    return type(backend).__name__ == "ShortConvAttnBackend"


def short_conv_view(handle: Any) -> dict[str, Any]:
    """The fields of the handle its conv kernels read, for the digest ({} without one)."""
    if handle is None:
        return {}
    return {
        "conv_cache_indices": handle.cache_indices,
        "conv_has_initial_state": handle.has_initial_state,
        "conv_slot_ids_cpu": handle.slot_ids_cpu,
        "conv_has_prefix_cpu": handle.has_prefix_cpu,
    }


def short_conv_reference(
    handle: Any, batch: Any, *, linear: Any, layer: int, want_slots: list[int], real: int, phase: str, seen: dict
) -> str:
    """What is wrong with ``handle`` for ``batch`` ("" when nothing). ``want_slots`` are the live
    rows' state slots; ``seen`` keeps the slots' address from the first capture, which every later
    capture and replay must hand out again."""
    import torch

    if not _is_short_conv(linear):
        return ""
    if handle is None:
        return "conv_state_metadata returned nothing"
    bs = int(batch.batch_size)
    pool = linear.req_to_token_pool
    want_cache = pool.mamba2_layer_cache(layer)
    if handle.layer_cache is None or handle.layer_cache.conv[0].data_ptr() != want_cache.conv[0].data_ptr():
        return f"the handle's layer cache is not the pool's conv state of layer {layer}"
    idx = handle.cache_indices
    # One slot per row, no more: the conv kernels take the number of sequences from its length
    # (a verify reshapes its tokens by it).
    if idx is None or idx.numel() != bs:
        return f"the handle's cache_indices hold {0 if idx is None else idx.numel()} entries for a batch of {bs}"
    if idx.dtype != torch.int64:
        return f"the handle's cache_indices are {idx.dtype}; the conv kernels index the pool with int64"
    got = idx[:bs].to("cpu", torch.long).tolist()
    want = want_slots + [-1] * (bs - real)
    row = first_difference(got, want)
    if row is not None:
        return f"the handle's cache_indices[{row}] = {got[row]}, the row's state slot is {want[row]}"
    if handle.query_start_loc is None or not torch.equal(
        handle.query_start_loc.cpu(), linear.forward_metadata.query_start_loc.cpu()
    ):
        return "the handle's query_start_loc is not the step's query offsets"
    if phase in ("capture", "replay"):
        first = seen.setdefault("cache_indices", idx.data_ptr())
        if idx.data_ptr() != first:
            return (
                f"a {phase} hands the slots out at another address than the first capture's: "
                "the captured conv kernels read the old buffer"
            )
    return _step_fields(handle, batch, want_slots=want_slots)


def _step_fields(handle: Any, batch: Any, *, want_slots: list[int]) -> str:
    """A prefill's fields (which requests resume a prefix, on the device and as host lists); a
    decode or verify step sets none of them."""
    mode = batch.forward_mode
    prefill = mode.is_extend() and not mode.is_target_verify() and not mode.is_draft_extend_v2()
    if not prefill:
        for name in ("has_initial_state", "slot_ids_cpu", "has_prefix_cpu"):
            if getattr(handle, name) is not None:
                return f"the handle's {name} is set for a {mode.name} step (a prefill's field)"
        return ""
    prefixes = [int(p) for p in batch.extend_prefix_lens.to("cpu").tolist()]
    starts = [p > 0 for p in prefixes]
    has = handle.has_initial_state
    if has is None or has.to("cpu").tolist() != starts:
        got = None if has is None else has.tolist()
        return f"the handle's has_initial_state = {got}, the prefixes {prefixes} give {starts}"
    if handle.slot_ids_cpu != want_slots:
        return f"the handle's slot_ids_cpu = {handle.slot_ids_cpu}, the rows' state slots are {want_slots}"
    if handle.has_prefix_cpu != starts:
        return f"the handle's has_prefix_cpu = {handle.has_prefix_cpu}, the prefixes {prefixes} give {starts}"
    return ""
