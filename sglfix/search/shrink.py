"""Shrinking a failing scenario: the single reductions of a scenario node and the loop that takes
one while the scenario still fails the same way, until none does.

A reduction makes a node smaller in one respect: a request fewer, a prefix or an extend shorter
(to nothing, to half, to the page boundary below, by one), a page smaller, a speculative size
smaller, the CUDA graph or a captured size dropped, an optional key left out, fewer heads. Each round
asks about every reduction of the current node at once (the caller runs them as cells in
parallel) and takes the first, in the order listed, that still fails: the result is the same for
the same failing node, and minimal over the reductions (no single one of them still fails). Asked
in chunks (as many at once as there are workers), a round stops at the first chunk that holds a
failing node: the same node is taken, and a round where most reductions still fail (the early
ones, on the biggest scenarios) runs a chunk instead of all of them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Shrunk", "node_key", "reductions", "reductions_by_kind", "shrink"]

# Per-request lists of a batch: a request dropped is dropped from each.
_PER_REQUEST = ("prefix_lens", "extend_lens", "accept_lens", "encoder_lens", "items", "mamba_track")
# Keys a scenario may leave out, outermost first: (path, what it means in words).
_OPTIONAL = (
    (("max_context_len",), "the context limit"),
    (("gpu_only",), "gpu_only"),
    (("dcp_size",), "decode context parallelism"),
    (("deterministic",), "deterministic inference"),
    (("env",), "the engine flags"),
    (("model", "full_layer"), "the window model's full-attention layer"),
    (("model", "sliding_window"), "the sliding window"),
)


def _shorter(value: int, *, page: int, low: int) -> list[int]:
    """Shorter lengths than ``value`` (never below ``low``), biggest cut first: ``low``, half, the
    page boundary below, and ``value`` less each power of two below it (so a length that must stay
    long shrinks in a few rounds, not one position a round)."""
    below = value - (value % page or page)
    steps = []
    step = 1
    while step < value - low:
        steps.append(value - step)
        step *= 2
    return sorted({v for v in (low, value // 2, below, *steps) if low <= v < value})


Edit = Callable[[dict], None]


def _fewer_requests(node: dict) -> Iterator[tuple[str, Edit]]:
    bs = len(node.get("batch", {}).get("prefix_lens", ()))
    for i in range(bs if bs > 1 else 0):

        def drop(n: dict, i: int = i) -> None:
            for key in _PER_REQUEST:
                if isinstance(n["batch"].get(key), list):
                    del n["batch"][key][i]

        yield f"request {i} dropped", drop


def _less_graph(node: dict) -> Iterator[tuple[str, Edit]]:
    if "cuda_graph" not in node:
        return
    yield "eager (no CUDA graph)", lambda n: n.pop("cuda_graph")
    sizes = node["cuda_graph"].get("capture_bs", [])
    for size in sizes if len(sizes) > 1 else ():
        kept = [s for s in sizes if s != size]
        yield f"captured size {size} dropped", lambda n, kept=kept: n["cuda_graph"].__setitem__("capture_bs", kept)


def _shorter_lengths(node: dict) -> Iterator[tuple[str, Edit]]:
    batch, page = node.get("batch", {}), node.get("page_size") or 1
    for key, low in (("prefix_lens", 0), ("extend_lens", 1), ("accept_lens", 0)):
        value = batch.get(key)
        if isinstance(value, int):
            for v in _shorter(value, page=page, low=low):
                yield f"batch.{key} {v}", lambda n, key=key, v=v: n["batch"].__setitem__(key, v)
            continue
        for i, length in enumerate(value or ()):
            for v in _shorter(length, page=page, low=low):

                def set_one(n: dict, key: str = key, i: int = i, v: int = v) -> None:
                    n["batch"][key][i] = v

                yield f"batch.{key}[{i}] {v}", set_one


def _smaller_sizes(node: dict) -> Iterator[tuple[str, Edit]]:
    page = node.get("page_size") or 1
    if page > 1:
        yield f"page_size {page // 2}", lambda n: n.__setitem__("page_size", page // 2)
    for key in ("num_steps", "topk", "num_draft_tokens"):
        value = node.get("spec", {}).get(key)
        # The biggest cut first, as for lengths: a size that may drop to one gets there in one round.
        for v in _shorter(value, page=1, low=1) if value is not None else ():
            yield f"spec.{key} {v}", lambda n, key=key, v=v: n["spec"].__setitem__(key, v)
    model = node.get("model", {})
    if model.get("num_kv_heads") and model.get("num_heads", 0) > model["num_kv_heads"]:
        yield "one query head per KV head", lambda n: n["model"].__setitem__("num_heads", model["num_kv_heads"])
    if model.get("head_dim", 0) > 16:
        half = model["head_dim"] // 2
        yield f"model.head_dim {half}", lambda n: n["model"].__setitem__("head_dim", half)


def _left_out(node: dict) -> Iterator[tuple[str, Edit]]:
    for path, what in _OPTIONAL:
        holder = node
        for part in path[:-1]:
            holder = holder.get(part, {})
        if path[-1] in holder:

            def leave_out(n: dict, path: tuple = path) -> None:
                h = n
                for part in path[:-1]:
                    h = h[part]
                del h[path[-1]]

            yield f"{what} left out", leave_out


# Biggest cuts first: a request, the graph, lengths, then sizes and optional keys.
_REDUCERS = (_fewer_requests, _less_graph, _shorter_lengths, _smaller_sizes, _left_out)


def reductions(node: dict) -> list[tuple[str, dict]]:
    """Every single reduction of ``node`` as (what it does, the smaller node), in the order the
    shrinker tries them; a reduction may give a node the schema refuses (the caller drops it)."""
    return [r for kind in reductions_by_kind(node) for r in kind]


def reductions_by_kind(node: dict) -> list[list[tuple[str, dict]]]:
    """``reductions`` grouped by what they cut (requests, the graph, lengths, sizes, optional keys)."""
    out: list[list[tuple[str, dict]]] = []
    for reducer in _REDUCERS:
        kind = []
        for what, edit in reducer(node):
            smaller = copy.deepcopy(node)
            edit(smaller)
            if smaller != node:
                kind.append((what, smaller))
        out.append(kind)
    return out


@dataclass
class Shrunk:
    """A shrink's outcome: the smallest node found, the reductions taken (in order), how many
    candidate nodes were asked about and how many of those the schema refused."""

    node: dict
    steps: list[str] = field(default_factory=list)
    asked: int = 0
    refused: int = 0
    rounds: int = 0
    # No single reduction of ``node`` still fails (False where the round budget cut the shrink short).
    minimal: bool = False


def shrink(
    node: dict,
    *,
    valid: Callable[[dict], bool],
    still_fails: Callable[[Sequence[dict]], Sequence[bool]],
    max_rounds: int = 200,
    chunk: int | None = None,
    on_round: Callable[[Shrunk], None] | None = None,
) -> Shrunk:
    """The smallest node the reductions reach from ``node`` that still fails.

    ``valid(node)``: whether the schema and the code base take it; ``still_fails(nodes)``: for each
    node, whether it fails the way the original did (asked for the valid reductions in order,
    ``chunk`` at a time, all at once without one, so the caller can run them together; a round
    asks no further than the first chunk with a failing node). Every distinct node is asked about
    once. ``on_round(result)`` is called as each round ends."""
    result = Shrunk(node=copy.deepcopy(node))
    known: dict[str, bool] = {node_key(node): True}  # every node asked about (or refused): fails?
    for _ in range(max_rounds):
        result.rounds += 1
        candidates = []
        for what, smaller in reductions(result.node):
            key = node_key(smaller)
            if key not in known and not valid(smaller):
                known[key] = False
                result.refused += 1
            candidates.append((what, key, smaller))
        unknown = list({key: smaller for _, key, smaller in candidates if key not in known}.items())
        step = max(1, chunk) if chunk else max(1, len(unknown))
        while True:
            # The first reduction, in order, not known to pass: taken once it is known to fail.
            taken = next((c for c in candidates if known.get(c[1]) is not False), None)
            if taken is None or known.get(taken[1]):
                break
            part = [(key, smaller) for key, smaller in unknown if key not in known][:step]
            answers = list(still_fails([smaller for _, smaller in part]))
            result.asked += len(part)
            known.update((key, bool(fails)) for (key, _), fails in zip(part, answers))
        if taken is None:
            result.minimal = True
        else:
            result.node = taken[2]
            result.steps.append(taken[0])
        if on_round is not None:
            on_round(result)
        if taken is None:
            break
    return result


def node_key(node: Any) -> str:
    """One string per distinct node (what a search and a shrink remember a node by)."""
    return json.dumps(node, sort_keys=True)
