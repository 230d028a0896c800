"""The judge of a hybrid model's ReplaySSM decode ring (``model.replayssm_ring``: sglang's
``--enable-linear-replayssm`` with ``--linear-replayssm-cache-len L``).

Under ReplaySSM each state slot keeps a ring of its last L decode steps, with a write cursor per
slot in the Mamba pool (``replayssm_write_pos``). Each decode metadata init hands the GDN layers,
per row, the cursor of its slot before the step (``replayssm_write_pos``) and whether the step
folds the ring into the state (``replayssm_force_flush``: the step's ``seq_lens`` on the radix
track's boundary, ``seq_lens % mamba_track_interval == 0``), then advances each live slot's cursor
once: to 0 after a flush or at the ring's end (L - 1), else by one. A capture hands the graph its
per-size buffers and advances nothing (its slots are the runner's padding); every replay refills
those buffers in place and advances as an eager step does.

The judge keeps the cursors it last saw (seeded at build), and after every init checks the
metadata and the pool's cursors against them, the batch's rows, their slots and ``seq_lens``
alone: a wrong snapshot, flush, advance, or an advance of a slot no live row holds is named.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.sglang.truth import host_ints

__all__ = ["TRACK_INTERVAL", "replayssm_pool_args", "replayssm_reference", "seed_cursors"]

# The radix track interval published for a ReplaySSM cell (sglang's --mamba-track-interval): small,
# so that a scenario's decode steps land on the boundary where the ring is flushed.
TRACK_INTERVAL = 8


def replayssm_pool_args(ring: int | None) -> dict[str, Any]:
    """The hybrid pool's arguments for a ReplaySSM ring of ``ring`` steps (none without one)."""
    return {} if ring is None else {"enable_linear_replayssm": True, "linear_replayssm_cache_len": ring}


def seed_cursors(pool: Any, *, seed: int) -> list[int] | None:
    """Seeded cursors in every slot (each in 0 .. L - 1, the ring's end among them), as the judge's
    first 'before'; None where the pool keeps no ring."""
    import torch

    mamba = getattr(pool, "mamba_pool", None)
    cursor = getattr(mamba, "replayssm_write_pos", None)
    if cursor is None or not getattr(mamba, "enable_linear_replayssm", False):
        return None
    ring = int(mamba.linear_replayssm_cache_len)
    gen = torch.Generator(device="cpu").manual_seed(seed + 13)
    values = torch.randint(0, ring, cursor.shape, generator=gen)
    values[::3] = ring - 1  # a third of the slots at the ring's end: their step wraps
    cursor.copy_(values.to(cursor.dtype))
    return [int(x) for x in values.tolist()]


def replayssm_reference(metadata: Any, batch: Any, backend: Any, *, real: int, slots: list[int]) -> str:
    """ "" when this init's ring metadata and the pool's cursors after it are the batch's; else the
    first thing wrong. ``real`` live rows hold state slots ``slots``."""
    before = getattr(backend, "_sglfix_cursors", None)
    if before is None:
        return ""
    mamba = backend._sglfix_linear.req_to_token_pool.mamba_pool
    ring = int(mamba.linear_replayssm_cache_len)
    after = host_ints(mamba.replayssm_write_pos, len(before))
    backend._sglfix_cursors = after  # the next init's "before", whatever this one did
    phase = getattr(backend, "_sglfix_phase", "eager")
    if not batch.forward_mode.is_decode_or_idle() or phase == "capture":
        moved = next((s for s, (a, b) in enumerate(zip(after, before)) if a != b), None)
        if moved is not None:
            what = "a capture" if phase == "capture" else f"a {batch.forward_mode.name} init"
            return f"{what} moved the ReplaySSM cursor of slot {moved} from {before[moved]} to {after[moved]}"
        return ""
    wp, ff = metadata.replayssm_write_pos, metadata.replayssm_force_flush
    if wp is None or ff is None:
        return "a decode under ReplaySSM hands the layers no replayssm_write_pos / replayssm_force_flush"
    lens = host_ints(batch.seq_lens_cpu, real)
    want_wp = [before[s] for s in slots]
    want_ff = [int(n % TRACK_INTERVAL == 0) for n in lens]
    got_wp, got_ff = host_ints(wp, real), host_ints(ff, real)
    for b in range(real):
        if got_wp[b] != want_wp[b]:
            return f"row {b} (state slot {slots[b]}) is handed ReplaySSM cursor {got_wp[b]}, its slot's is {want_wp[b]}"
        if got_ff[b] != want_ff[b]:
            return (
                f"row {b} (seq_lens {lens[b]}) is handed force_flush {got_ff[b]}; the radix track interval "
                f"{TRACK_INTERVAL} makes it {want_ff[b]}"
            )
    want_after = list(before)
    for s, p, f in zip(slots, want_wp, want_ff):
        want_after[s] = 0 if f or p == ring - 1 else (p + 1) % ring
    wrong = next((s for s, (a, w) in enumerate(zip(after, want_after)) if a != w), None)
    if wrong is not None:
        whose = "a live row's" if wrong in slots else "no live row's"
        return (
            f"state slot {wrong} ({whose}) has ReplaySSM cursor {after[wrong]} after the step, expected "
            f"{want_after[wrong]} (it was {before[wrong]}; ring of {ring})"
        )
    return ""
