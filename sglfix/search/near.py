"""The search's local moves: a scenario node's neighbours, and the built-in scenarios as nodes to
start from.

A change (a mutant, a revert, a patch) that an example runs and that builds other metadata there
without moving a verdict is alive in that example: its effect is computed and then not read, or
read where the kernel's answer does not depend on it. A scenario a step or two away (a request
more, a prefix one longer, a page larger, a padded graph) is where such an effect is most often
read. ``neighbours`` draws those steps: every reduction the shrinker knows, and their opposites
(longer lengths, to the next page boundary and past it, a request copied, a larger page or draft,
a captured size added above the batch, the context limit at the batch's need, the window moved
across a length), one to three at a time, the same for the same random state.

``node_of`` spells a runnable scenario (a built-in one, grid points included) as a scenario file
would: the node it gives loads to the same scenario, checked by loading it (``seeds``).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.scenario.models import DEFAULT_TOLERANCE, BatchNode, Scenario
from sglfix.scenario.modes import PROBE_COMMON_KEYS, probe_rule, rule_for
from sglfix.search.schema_types import field_kind
from sglfix.search.shrink import reductions_by_kind

__all__ = ["moves", "moves_by_kind", "neighbours", "node_of", "seeds"]

# Fields a scenario carries that are not the node's (its name and where it was written).
_NOT_THE_NODE = {"name", "path", "line", "description"}
# A neighbour stacks this many steps at most (one, two or three, as a fuzzer's havoc stage).
MAX_STACK = 3


def node_of(scenario: Scenario) -> dict:
    """``scenario`` as a scenario file spells it (``seeds`` checks that it loads back to it)."""
    s = scenario
    node: dict[str, Any] = {"mode": s.mode, "batch": _batch_of(s)}
    if s.probe is not None:
        node["probe"] = s.probe
    else:
        node["backend"] = s.backend
    if s.capture_bs is not None:
        node["cuda_graph"] = _graph_of(s)
    node["page_size"] = s.page_size
    node["model"] = s.model.model_dump(exclude_defaults=True)
    node["spec"] = s.spec.model_dump()
    for key, default in (("builder", "kit"), ("dcp_size", 1), ("deterministic", False), ("gpu_only", False)):
        if getattr(s, key) != default:
            node[key] = getattr(s, key)
    for key in ("seed", "max_context_len", "env"):
        if getattr(s, key):
            node[key] = copy.deepcopy(getattr(s, key))
    if s.tolerance != DEFAULT_TOLERANCE[s.model.dtype]:
        node["tolerance"] = s.tolerance
    if s.probe is not None:
        keep = set(PROBE_COMMON_KEYS) | set(probe_rule(s.probe).reads) | {"probe"}
        node = {k: v for k, v in node.items() if k in keep}
    return node


def _batch_of(s: Scenario) -> dict:
    batch: dict[str, Any] = {"prefix_lens": list(s.prefix_lens)}
    if rule_for(s.mode, s.backend or "triton").takes_extend_lens:
        batch["extend_lens"] = list(s.extend_lens)
    for key in ("accept_lens", "mamba_track", "encoder_lens"):
        value = getattr(s, key)
        if value is not None:
            batch[key] = list(value)
    if s.items is not None:
        batch["items"] = [None if i is None else list(i) for i in s.items]
    if s.mamba_track is not None and not s.mamba_track_host:
        batch["mamba_track_host"] = False
    return batch


def _graph_of(s: Scenario) -> dict:
    graph: dict[str, Any] = {"capture_bs": list(s.capture_bs or ())}
    if s.full_prefill_max_req is not None:
        graph["full_prefill_max_req"] = s.full_prefill_max_req
    if s.breakable_prefill:
        graph["breakable"] = True
    if s.cpu_graph:
        graph["cpu"] = True
    return graph


def _same(a: Scenario, b: Scenario) -> bool:
    return a.model_dump(exclude=_NOT_THE_NODE) == b.model_dump(exclude=_NOT_THE_NODE)


def seeds(scenarios: Sequence[Scenario], *, space: Any) -> list[tuple[dict, Scenario, str]]:
    """The scenarios of ``space``'s kinds as (node, its runnable scenario, the scenario's own name),
    each one whose node loads back to it on the code base and holds the space's pins."""
    from sglfix.search.space import kind_of, kinds, to_scenario

    wanted = set(kinds(space))
    out: list[tuple[dict, Scenario, str]] = []
    for s in scenarios:
        if kind_of(s) not in wanted:
            continue
        node = node_of(s)
        if not space.admits(node):
            continue
        try:
            again = to_scenario(node, codebase=space.codebase)
        except ConfigError:
            continue
        # The sizing of a seed's graph or gpu_only may be a default the node cannot spell: the
        # scenario run must be the one written, or the seed says nothing of it.
        if _same(again, s.model_copy(update={"sync_free": again.sync_free})):
            out.append((node, again, s.name))
    return out


# ----------------------------------------------------------------------------- single steps


def _page(node: dict) -> int:
    return int(node.get("page_size") or 1)


def _high() -> int:
    return field_kind(BatchNode, "prefix_lens").high


def _longer(value: int, *, page: int) -> list[int]:
    """Longer lengths than ``value``: one more, a page more, the next page boundary and one past
    it, twice it."""
    above = value + (page - value % page)
    return sorted({v for v in (value + 1, value + page, above, above + 1, 2 * value) if value < v <= _high()})


def _longer_lengths(node: dict) -> Iterator[tuple[str, dict]]:
    batch, page = node.get("batch", {}), _page(node)
    for key in ("prefix_lens", "extend_lens", "accept_lens"):
        value = batch.get(key)
        if isinstance(value, int):
            for v in _longer(value, page=page):
                yield f"batch.{key} {v}", _set(node, ("batch", key), v)
            continue
        for i, length in enumerate(value or ()):
            for v in _longer(length, page=page) if key != "accept_lens" else (length + 1,):
                yield f"batch.{key}[{i}] {v}", _set(node, ("batch", key, i), v)


def _more_requests(node: dict) -> Iterator[tuple[str, dict]]:
    batch = node.get("batch", {})
    bs = len(batch.get("prefix_lens", ()))
    for i in range(bs):
        n = copy.deepcopy(node)
        for value in n["batch"].values():
            if isinstance(value, list) and len(value) == bs:
                value.append(copy.deepcopy(value[i]))
        yield f"request {i} copied", n


def _larger_sizes(node: dict) -> Iterator[tuple[str, dict]]:
    page = node.get("page_size")
    if page is not None:
        yield f"page_size {2 * page}", _set(node, ("page_size",), 2 * page)
    for key in ("num_steps", "topk", "num_draft_tokens"):
        value = node.get("spec", {}).get(key)
        if value is not None:
            yield f"spec.{key} {value + 1}", _set(node, ("spec", key), value + 1)
    heads = node.get("model", {}).get("num_heads")
    if heads is not None:
        yield f"model.num_heads {2 * heads}", _set(node, ("model", "num_heads"), 2 * heads)
    yield "another seed", _set(node, ("seed",), int(node.get("seed", 0)) + 1)


def _graphs(node: dict) -> Iterator[tuple[str, dict]]:
    bs = len(node.get("batch", {}).get("prefix_lens", ()))
    graph = node.get("cuda_graph")
    if node.get("mode") == "EXTEND":
        if graph:
            top = max(graph.get("capture_bs", [1]))
            yield (
                f"token bucket {top + 1}",
                _set(node, ("cuda_graph", "capture_bs"), sorted({*graph["capture_bs"], top + 1})),
            )
            slots = graph.get("full_prefill_max_req")
            if slots is not None:
                yield f"request slots {slots + 1}", _set(node, ("cuda_graph", "full_prefill_max_req"), slots + 1)
        return
    if not graph:
        for size in (bs, bs + 1):
            yield f"a graph captured at {size}", _set(node, ("cuda_graph",), {"capture_bs": [size]})
        return
    sizes = graph.get("capture_bs", [])
    for size in (bs + 1, max(sizes, default=bs) + 1):
        if size not in sizes:
            yield f"captured size {size} added", _set(node, ("cuda_graph", "capture_bs"), sorted({*sizes, size}))


def _edges(node: dict) -> Iterator[tuple[str, dict]]:
    """The context limit and the window moved onto the batch's lengths."""
    batch, page = node.get("batch", {}), _page(node)
    prefixes = [p for p in batch.get("prefix_lens", ()) if isinstance(p, int)]
    extends = batch.get("extend_lens")
    extends = [extends] * len(prefixes) if isinstance(extends, int) else list(extends or [1] * len(prefixes))
    ends = [p + e for p, e in zip(prefixes, extends)]
    limit = node.get("max_context_len")
    if limit is not None:
        for v in (limit - 1, limit + 1, limit + page):
            if v >= 1:
                yield f"max_context_len {v}", _set(node, ("max_context_len",), v)
    for end in sorted(set(ends))[-1:]:
        for v in (end, end + 1, end + page):
            if v != limit:
                yield f"max_context_len {v}", _set(node, ("max_context_len",), v)
    model = node.get("model", {})
    window = model.get("sliding_window")
    if window is None:
        return
    for v in sorted({window - 1, window + 1, *(p - 1 for p in prefixes), *prefixes, *(e - 1 for e in ends)}):
        if v >= 1 and v != window:
            yield f"model.sliding_window {v}", _set(node, ("model", "sliding_window"), v)
    flip = not model.get("full_layer", False)
    yield f"model.full_layer {str(flip).lower()}", _set(node, ("model", "full_layer"), flip)


def _set(node: dict, path: tuple, value: Any) -> dict:
    out = copy.deepcopy(node)
    at: Any = out
    for part in path[:-1]:
        if isinstance(at, dict) and not isinstance(at.get(part), (dict, list)):
            at[part] = {}
        at = at[part]
    at[path[-1]] = copy.deepcopy(value)
    return out


_GROWERS = (_longer_lengths, _more_requests, _larger_sizes, _graphs, _edges)


def moves(node: dict) -> list[tuple[str, dict]]:
    """Every single step from ``node``: the shrinker's reductions and the growths above (some give
    a node the schema refuses: the caller drops it)."""
    return [m for kind in moves_by_kind(node) for m in kind]


def moves_by_kind(node: dict) -> list[list[tuple[str, dict]]]:
    """``moves`` grouped by what they change (a request fewer or more, the graph, shorter or longer
    lengths, smaller or larger sizes, optional keys, the edges), empty kinds left out: a step is
    drawn kind first, so that a node with many lengths does not drown its one graph step."""
    kinds = [*reductions_by_kind(node), *([(w, n) for w, n in grower(node) if n != node] for grower in _GROWERS)]
    return [k for k in kinds if k]


def _interleaved(kinds: list[list[tuple[str, dict]]], rng: random.Random) -> list[tuple[str, dict]]:
    """Every step, each kind's in a random order, the kinds taken in turn (a random turn order)."""
    lines = [list(k) for k in kinds]
    for line in lines:
        rng.shuffle(line)
    rng.shuffle(lines)
    out: list[tuple[str, dict]] = []
    while any(lines):
        for line in lines:
            if line:
                out.append(line.pop())
    return out


def neighbours(
    node: dict, *, count: int, rng: random.Random, admits: Any, known: set[str], key: Any
) -> list[tuple[list[str], dict]]:
    """Up to ``count`` distinct nodes near ``node`` that ``admits`` takes and whose ``key`` is not
    in ``known`` (added to it), each with the steps taken: single steps first, the kinds of step in
    turn (the whole neighbourhood of a node is reached over its descendants), then two to
    ``MAX_STACK`` steps stacked, each of a kind drawn first."""
    out: list[tuple[list[str], dict]] = []
    single = _interleaved(moves_by_kind(node), rng)
    stacked = (_stack(node, rng) for _ in range(20 * count))
    for steps, near in (*(([what], n) for what, n in single), *stacked):
        if len(out) >= count:
            break
        k = key(near)
        if not steps or k in known:
            continue
        known.add(k)
        if admits(near):
            out.append((steps, near))
    return out


def _stack(node: dict, rng: random.Random) -> tuple[list[str], dict]:
    current, steps = node, []
    for _ in range(rng.randint(2, MAX_STACK)):
        kinds = moves_by_kind(current)
        if not kinds:
            break
        kind = kinds[rng.randrange(len(kinds))]
        what, current = kind[rng.randrange(len(kind))]
        steps.append(what)
    return steps, current
