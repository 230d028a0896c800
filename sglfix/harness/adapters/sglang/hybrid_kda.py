"""The judge of a Kimi-Linear hybrid's delta-attention prefill under breakable prefill graphs
(``model.linear_attention: kda``, ``cuda_graph.breakable``).

Under sglang's breakable prefill backend the KDA extend stays inside the graph: each token bucket
captures static tables sized by the bucket (``KDAPrefillGraphMetadata``), and every replay
refreshes that bucket's tables in place for the batch it runs. The captured kernels launch fixed
grids over the tables' bounds, so every row counts, the padded ones too:

- ``cu_seqlens``: the requests' token offsets, then the total repeated (empty padded sequences);
- ``chunk_indices`` / ``chunk_offsets``: one (request, chunk) row per delta-rule chunk of 64 tokens,
  sequence-major, padded with a chunk index past any sequence; each request's first chunk row;
- ``conv_block_table``: one (request, block) row per causal-conv block, padded with the pad slot;
- ``cache_indices``: each request's state slot, the pad slot past the batch;
- ``has_initial_state``: whether the request resumes a prefix;
- the track tables (a batch that snapshots states for prefix caching, ``batch.mamba_track``, on a
  bucket captured with them): a tracked request's snapshot is its state after
  ``A = n // chunk * chunk`` of its ``n`` tracked tokens (the cache chunk): the extend's final state
  where A is the whole extend, else the delta-rule chunk state at ``A / 64``; its conv window ends
  at A (its start the request's offset + A - the window); its destination the slot the scheduler
  gave it. Untracked rows and rows past the batch track nothing; a capture tracks nothing;
- ``num_logical_tokens``, ``token_index``: the batch's tokens, the bucket's rows.

The judge derives each from the batch as the caller built it (lengths, prefixes, request rows and
the pool's slot mapping) and the kernels' tiles, and checks that a replay refreshes the tables its
bucket captured (the captured kernels read those addresses), never a fresh set.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.sglang.truth import first_difference, host_ints

__all__ = ["kda_graph_reference", "kda_graph_view"]

# chunk_kda's delta-rule chunk (fla's BT for KDA): the chunk tables count chunks of this many tokens.
KDA_CHUNK = 64
# Kimi-Linear's convolution width (the hybrid adapter's pool): a conv window holds this minus one.
KDA_CONV = 4
# A padded chunk row's chunk index: past the end of any sequence, so the varlen kernels return.
PAD_CHUNK = 1 << 20
# The tables the captured kernels read by address.
_TABLES = (
    "track_dst",
    "cu_seqlens",
    "chunk_indices",
    "chunk_offsets",
    "conv_block_table",
    "track_chunk_idx",
    "track_mode",
    "track_conv_start",
    "num_logical_tokens",
    "cache_indices",
    "has_initial_state",
    "token_index",
)


def kda_graph_view(meta: Any) -> dict[str, Any]:
    """The bucket tables a captured KDA extend reads (for the digest); none outside a graph."""
    if meta is None:
        return {}
    return {f"kda_{name}": getattr(meta, name, None) for name in _TABLES}


def _pairs(counts: list[int], rows: int, pad: tuple[int, int]) -> list[int]:
    """(request, index) rows, ``counts[i]`` per request, flattened, padded to ``rows`` with ``pad``."""
    out: list[int] = []
    for request, count in enumerate(counts):
        for index in range(count):
            out += [request, index]
    return out + list(pad) * (rows - len(out) // 2)


def _tracked(track: Any, *, cu: list[int], lens: list[int], max_seqs: int, conv: int) -> dict[str, list]:
    """The track tables of a batch's track plan (``hybrid_track.track_plan``); nothing tracked
    where there is none."""
    from sglang.kernels.ops.mamba.kda_prefill_track import TRACK_CHUNK_STATE, TRACK_FINAL_STATE

    chunk_idx, mode, conv_start = [-1] * max_seqs, [0] * max_seqs, [0] * max_seqs
    for row, n in enumerate([] if track is None else track.track):
        if n <= 0:
            continue
        aligned = n // track.chunk * track.chunk
        if aligned == lens[row]:
            mode[row] = TRACK_FINAL_STATE
        else:
            mode[row], chunk_idx[row] = TRACK_CHUNK_STATE, aligned // KDA_CHUNK
        conv_start[row] = cu[row] + aligned - conv
    return {"track_chunk_idx": chunk_idx, "track_mode": mode, "track_conv_start": conv_start}


def _want(
    meta: Any, *, lens: list[int], prefixes: list[int], slots: list[int], max_seqs: int, track: Any
) -> dict[str, list]:
    """Every table as the batch implies it, at the bounds of the bucket ``meta`` was captured for."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import CAUSAL_CONV1D_FWD_BLOCK_M, PAD_SLOT_ID

    tokens, bs, total = int(meta.num_tokens), len(lens), sum(lens)
    max_chunks = -(-tokens // KDA_CHUNK) + max_seqs
    max_blocks = -(-tokens // CAUSAL_CONV1D_FWD_BLOCK_M) + max_seqs
    chunks = [-(-n // KDA_CHUNK) for n in lens]
    blocks = [-(-n // CAUSAL_CONV1D_FWD_BLOCK_M) for n in lens]
    cu, offsets = [0], [0]
    for n, c in zip(lens, chunks):
        cu.append(cu[-1] + n)
        offsets.append(offsets[-1] + c)
    return {
        "cu_seqlens": cu + [total] * (max_seqs - bs),
        "chunk_indices": _pairs(chunks, max_chunks, (0, PAD_CHUNK)),
        "chunk_offsets": offsets + [offsets[-1]] * (max_seqs - bs),
        "conv_block_table": _pairs(blocks, max_blocks, (PAD_SLOT_ID, 0)),
        **_tracked(track, cu=cu, lens=lens, max_seqs=max_seqs, conv=KDA_CONV - 1),
        "num_logical_tokens": [total],
        "cache_indices": slots + [PAD_SLOT_ID] * (max_seqs - bs),
        "has_initial_state": [int(p > 0) for p in prefixes] + [0] * (max_seqs - bs),
        "token_index": list(range(tokens)),
    }


def kda_graph_reference(linear: Any, batch: Any, backend: Any, *, slots: list[int], track: Any = None) -> str:
    """ "" when the bucket tables this breakable capture or replay left are the batch's; else the
    first thing wrong. ``slots``: the batch's requests' state slots; ``track``: the batch's track
    plan (None: it tracks nothing)."""
    from sglang.srt.environ import envs

    meta = getattr(linear, "prefill_graph_metadata", None)
    if meta is None:
        return "no bucket tables: the KDA extend would run outside the graph"
    phase = getattr(backend, "_sglfix_phase", "eager")
    lens = host_ints(backend._sglfix_extend)
    tokens, total = int(meta.num_tokens), sum(lens)
    kept = backend.__dict__.setdefault("_sglfix_kda_tables", {})
    if phase == "capture":
        if tokens != total:
            return f"a capture of the {total}-token bucket allocated tables for {tokens} tokens"
        kept[tokens] = meta
    else:
        buckets = sorted(n for n in kept if n >= total)
        if not buckets or meta is not kept[buckets[0]]:
            return (
                f"a replay of {total} tokens hands tables other than its bucket's capture "
                f"({buckets[0] if buckets else None} tokens): the captured kernels read the capture's"
            )
    cap = int(envs.SGLANG_KDA_PREFILL_GRAPH_MAX_SEQS.get())
    max_seqs = max(1, min(tokens, cap))
    if int(meta.max_seqs) != max_seqs:
        return f"the tables hold {int(meta.max_seqs)} sequences, the bucket's bound is {max_seqs}"
    # A capture's batch is the runner's own: it tracks nothing, whatever the cell's batch does.
    plan = track if phase == "replay" else None
    want = _want(
        meta,
        lens=lens,
        prefixes=host_ints(batch.extend_prefix_lens)[: len(lens)],
        slots=slots,
        max_seqs=max_seqs,
        track=plan,
    )
    if plan is not None:
        want["track_dst"] = list(plan.dst)
    for name, expected in want.items():
        got = host_ints(getattr(meta, name).reshape(-1))
        if name == "track_dst":
            got = got[: len(expected)]  # rows past the batch are read where a mode is set only
        at = first_difference(got, expected)
        if at is not None:
            have = got[at] if at < len(got) else None
            wanted = expected[at] if at < len(expected) else None
            return f"{name}[{at}] = {have} ({len(got)} entries), the batch gives {wanted} ({len(expected)} entries)"
    return ""
