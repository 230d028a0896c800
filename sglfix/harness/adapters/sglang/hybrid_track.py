"""The Mamba state tracking of real sglang's hybrid backend, as ``sglang.hybrid_linear`` drives it
(a scenario's ``batch.mamba_track``): the scheduler's track fields handed to the batch
(``track_plan``), and their judge from the batch alone: a prefill's track plan
(``track_reference``: conv positions, the chunk each snapshot starts, the backend's own state copy
over marker states) and a decode step's (``decode_track_reference``: the destinations as the
backend hands them, the step's state copy per layer and fused for all layers).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

__all__ = ["TRACK_FIELDS", "decode_track_reference", "track_plan", "track_reference"]

# What the linear layers' kernels and state copies read of a prefill's track plan.
TRACK_FIELDS = (
    "has_mamba_track_mask",
    "mamba_track_indices",
    "track_conv_indices",
    "track_chunk_idx",
    "track_ssm_h_src",
    "track_ssm_h_dst",
    "track_ssm_h_batch_src",
    "track_ssm_final_src",
    "track_ssm_final_dst",
)


def track_plan(case: Any, scenario: Any) -> Any:
    """Hand the extend batch a prefill's Mamba state tracking as the scheduler does: per tracked
    request its destination slot (a free slot of the pool, seeded), its track length as
    ``mamba_track_seqlens`` (prefix + tokens covered; -1 untracked) and, where the scenario says the
    host plan comes along, the host lists production's extend carries. Returns what the judge needs."""
    import torch
    from sglang.srt.runtime_context import get_server_args

    from sglfix.scenario.rules import MAMBA_TRACK_CHUNK

    batch, device = case.forward_batch, case.device
    pool = case.runner.req_to_token_pool
    track = list(scenario.mamba_track)
    taken = set(pool.req_index_to_mamba_index_mapping[batch.req_pool_indices.long()].tolist())
    free = [s for s in range(1, pool.mamba_pool.size + 1) if s not in taken]
    gen = torch.Generator(device="cpu").manual_seed(scenario.seed + 11)
    order = torch.randperm(len(free), generator=gen).tolist()
    dst = [free[order[i]] for i in range(len(track))]
    mask = [n > 0 for n in track]
    batch.mamba_track_mask = torch.tensor(mask, dtype=torch.bool, device=device)
    batch.mamba_track_indices = torch.tensor(dst, dtype=torch.int64, device=device)
    if scenario.mode == "DECODE":
        # A decode step snapshots the state it leaves in the request's slot; no lengths.
        batch.mamba_track_seqlens = None
        return SimpleNamespace(mode="DECODE", track=track, dst=dst, mask=mask)
    chunk = max(MAMBA_TRACK_CHUNK, int(scenario.page_size))
    # The snapshot grid is the model's chunk or the page (sglang's mamba_cache_chunk_size); the
    # kit's model has no HF config to read it from, so it is seeded as sglang's own fixtures seed it.
    get_server_args()._mamba_cache_chunk_size = chunk
    prefix, extend = list(scenario.prefix_lens), list(scenario.extend_lens)
    seqlens = [p + n if n else -1 for p, n in zip(prefix, track)]
    batch.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=device)
    batch.mamba_track_seqlens = torch.tensor(seqlens, dtype=torch.int64, device=device)
    if scenario.mamba_track_host:
        batch.mamba_prefill_track_mask_cpu = list(mask)
        batch.mamba_track_seqlens_cpu = list(seqlens)
        batch.extend_seq_lens_cpu = list(extend)
        batch.extend_prefix_lens_cpu = list(prefix)
    else:
        batch.mamba_prefill_track_mask_cpu = None
        batch.mamba_track_seqlens_cpu = None
    return SimpleNamespace(mode="EXTEND", track=track, dst=dst, mask=mask, extend=extend, chunk=chunk)


def track_reference(metadata: Any, batch: Any, backend: Any, *, offsets: list[int], conv: int) -> str:
    """What is wrong with the extend's track plan ("" when nothing), from the batch alone: request
    r's tracked state is its state after ``A = n // chunk * chunk`` of its extend's tokens (``n``
    its track length). Its convolution state is then the ``conv`` inputs before position A, so
    the conv positions must be those of the flattened batch. Its SSM state is the extend's final
    state where A is the whole extend, else the chunk state at the start of chunk ``A / chunk``:
    the plan is run through the backend's own state copy (``_track_mamba_state_extend``, what the
    layer's forward runs after its kernel) over marker states (each chunk state of each request,
    each slot's final state, told apart), and every destination must hold the state it wants;
    nothing else may change."""
    import torch

    plan = getattr(backend, "_sglfix_track", None)
    tracked = plan is not None
    if bool(getattr(metadata, "has_mamba_track_mask", False)) != tracked:
        return f"has_mamba_track_mask is {not tracked} for a batch that tracks {'some' if tracked else 'no'} state"
    if not tracked:
        return ""
    rows = [r for r, n in enumerate(plan.track) if n]
    covered = {r: plan.track[r] // plan.chunk * plan.chunk for r in rows}
    given = getattr(metadata, "mamba_track_indices", None)
    if given is None or given.to("cpu", torch.long).tolist() != plan.dst:
        shown = None if given is None else given.to("cpu", torch.long).tolist()
        return f"mamba_track_indices = {shown}, the batch's track destinations are {plan.dst}"
    want_conv = [[offsets[r] + covered[r] - conv + j for j in range(conv)] for r in rows]
    got_conv = metadata.track_conv_indices
    got_conv = None if got_conv is None else got_conv.to("cpu", torch.long).tolist()
    if got_conv != want_conv:
        return f"track_conv_indices = {got_conv}, the {conv} inputs before each tracked boundary are {want_conv}"
    want_chunk = [
        covered[r] // plan.chunk if r in covered and covered[r] < plan.extend[r] else -1 for r in range(len(plan.track))
    ]
    got_chunk = metadata.track_chunk_idx
    got_chunk = None if got_chunk is None else got_chunk.to("cpu", torch.long).tolist()
    if got_chunk != want_chunk:
        return f"track_chunk_idx = {got_chunk}, the chunks whose start state is tracked are {want_chunk}"
    return _track_copies(metadata, batch, backend, plan, covered)


def _track_copies(metadata: Any, batch: Any, backend: Any, plan: Any, covered: dict[int, int]) -> str:
    import torch

    linear = backend._sglfix_linear
    slots = backend._sglfix_linear.req_to_token_pool.req_index_to_mamba_index_mapping
    slot_of = slots[backend._sglfix_rows.long()].to("cpu", torch.long).tolist()
    chunks = [(n + plan.chunk - 1) // plan.chunk for n in plan.extend]
    # Chunk state c of request r reads 1000 (r + 1) + c; slot s's final state -(s + 1). On the
    # device the plan's indices are on.
    dev = metadata.query_start_loc.device
    h = torch.tensor(
        [1000.0 * (r + 1) + c for r, n in enumerate(chunks) for c in range(n)], dtype=torch.float32, device=dev
    ).view(1, -1, 1, 1, 1)
    size = linear.req_to_token_pool.mamba_pool.size + 1
    states = -(torch.arange(size, dtype=torch.float32, device=dev) + 1).view(-1, 1, 1, 1)
    want = states.to("cpu", copy=True)  # a copy on every device: the copies below must not reach it
    for r, a in covered.items():
        want[plan.dst[r]] = -(slot_of[r] + 1) if a == plan.extend[r] else 1000.0 * (r + 1) + a // plan.chunk
    # The kernel's own snapshot (``h_track_buf``, where the kernel writes one): one row per request
    # of the batch, its state at the start of its tracked chunk (a request that tracks no chunk
    # state holds its chunk 999, which no destination may get).
    snap = torch.tensor(
        [1000.0 * (r + 1) + (covered[r] // plan.chunk if r in covered else 999) for r in range(len(chunks))],
        dtype=torch.float32,
        device=dev,
    ).view(-1, 1, 1, 1)
    what = {plan.dst[r]: r for r in covered}
    for source, kwargs in (("the chunk states", {}), ("the kernel's snapshot", {"h_track_buf": snap})):
        got = states.clone()
        try:
            linear._track_mamba_state_extend(batch, h, got, metadata, **kwargs)
        except (IndexError, RuntimeError) as exc:
            # An index past the chunk states, the snapshot or the pool: what the layer's copy would hit.
            return f"the track plan's state copy from {source} fails: {str(exc).splitlines()[0]}"
        got = got.cpu()
        if not torch.equal(got, want):
            s = (got != want).flatten().nonzero().flatten().tolist()[0]
            who = f"request {what[s]}'s destination" if s in what else "a slot no request tracks into"
            return (
                f"the track plan's state copy from {source} leaves slot {s} ({who}) holding "
                f"{_marker(float(got[s]))}, want {_marker(float(want[s]))}"
            )
    return ""


def decode_track_reference(metadata: Any, backend: Any, plan: Any, *, real: int, bs: int, layer: int) -> str:
    """A decode step's track ("" when right): each tracked request's destination as the batch
    gives it (on a replay, the backend's own copy of the runner's slot), and the step's state
    copy, per layer and for all layers at once (the fused launch at the last Mamba layer), over
    marker states: each tracked request's destination holds its own slot's state after the
    copy, nothing else changes."""
    import torch

    got = getattr(metadata, "mamba_track_indices", None)
    shown = None if got is None else got.to("cpu", torch.long).tolist()
    if shown is None or shown[:real] != plan.dst[:real]:
        return f"mamba_track_indices = {shown}, the batch's track destinations are {plan.dst}"
    linear = backend._sglfix_linear
    mapping = linear.req_to_token_pool.req_index_to_mamba_index_mapping
    slot_of = mapping[backend._sglfix_rows[:real].long()].to("cpu", torch.long).tolist()
    dev = metadata.mamba_cache_indices.device
    mask = torch.zeros(bs, dtype=torch.bool)
    mask[:real] = torch.tensor(plan.mask[:real])
    batch = SimpleNamespace(mamba_track_mask=mask.to(dev), batch_size=bs)
    moves = {plan.dst[r]: slot_of[r] for r in range(real) if plan.mask[r]}
    cache = linear.req_to_token_pool.mamba_pool.mamba_cache
    conv_pool, ssm_pool = cache.conv[0], cache.temporal
    for how, layer_id in (("per layer", None), ("for all layers", layer)):
        saved = (conv_pool.clone(), ssm_pool.clone())
        try:
            markers = -(torch.arange(conv_pool.shape[1], device=dev, dtype=torch.float32) + 1)
            conv_pool.copy_(markers.view(1, -1, *[1] * (conv_pool.dim() - 2)).expand_as(conv_pool))
            ssm_pool.copy_((10 * markers).view(1, -1, *[1] * (ssm_pool.dim() - 2)).expand_as(ssm_pool))
            want = [t[0].to("cpu", copy=True) for t in (conv_pool, ssm_pool)]
            for d, s in moves.items():
                for w in want:
                    w[d] = w[s]
            try:
                linear._track_mamba_state_decode(
                    batch, conv_pool[0], ssm_pool[0], metadata.mamba_cache_indices, layer_id=layer_id
                )
            except (IndexError, RuntimeError) as exc:
                return f"the decode track's state copy ({how}) fails: {str(exc).splitlines()[0]}"
            for name, w, t in (("conv", want[0], conv_pool), ("SSM", want[1], ssm_pool)):
                t = t[0].cpu()
                if not torch.equal(t, w):
                    at = int((t != w).reshape(t.shape[0], -1).any(dim=1).nonzero()[0, 0])
                    owner = next((r for r in range(real) if plan.mask[r] and plan.dst[r] == at), None)
                    who = f"request {owner}'s destination" if owner is not None else "a slot no request tracks into"
                    return (
                        f"the decode track's {name} state copy ({how}) leaves slot {at} ({who}) holding slot "
                        f"{_slot_marker(t[at], scale=10 if name == 'SSM' else 1)}'s state, want slot "
                        f"{_slot_marker(w[at], scale=10 if name == 'SSM' else 1)}'s"
                    )
        finally:
            conv_pool.copy_(saved[0])
            ssm_pool.copy_(saved[1])
    return ""


def _slot_marker(row: Any, *, scale: int) -> int:
    """The slot a marker state row names (-scale (s + 1) everywhere)."""
    return round(-float(row.reshape(-1)[0]) / scale) - 1


def _marker(value: float) -> str:
    """A marker state in words."""
    if value < 0:
        return f"slot {int(-value) - 1}'s final state"
    return f"request {int(value) // 1000 - 1}'s chunk state {int(value) % 1000}"
