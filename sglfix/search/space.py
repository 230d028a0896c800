"""The search space of ``sglfix search``: scenarios drawn from the scenario schema, as a
hypothesis strategy, kept only where the code base takes them.

Nothing here restates the schema. Bounds and choices come from the pydantic field types
(``schema_types``); which keys a scenario gives comes from the mode, backend and probe tables
(``sglfix.scenario.modes``: a mode's new tokens, accept lengths and graphs, a backend's page sizes,
dtypes, heads and window modes, a probe's modes and the keys it reads) and from the code base's
record (its adapters, probes, the modes and features each adapter runs). A drawn node then passes
the same validation, memory estimate and runnable check a scenario file passes, or is rejected.

Sizes are drawn small and near the edges where metadata bugs live: a page boundary and one
either side of it, the window, the context limit, a graph bucket one above the batch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from sglfix.codebases import check_engine_flags, check_scenarios_runnable
from sglfix.common.errors import ConfigError
from sglfix.common.schema import model_in, nearest, validate_node
from sglfix.scenario.memory import check_memory
from sglfix.scenario.models import BatchNode, CudaGraphNode, ModelShape, Scenario, ScenarioNode, SpecShape
from sglfix.scenario.modes import MODE_RULES, PROBE_COMMON_KEYS, backend_rule, probe_rule, rule_for
from sglfix.scenario.rules import FULL_LAYER_MODES, draft_tree_capacity
from sglfix.search.schema_types import field_kind

__all__ = [
    "Space",
    "examples",
    "kinds",
    "node_name",
    "parse_pins",
    "scenario_nodes",
    "scenarios",
    "space_for",
    "to_scenario",
]

# The search's working sizes: far inside the schema's limits, where a cell takes a second.
DEFAULT_MAX_REQUESTS = 4
DEFAULT_MAX_PAGES = 4
# Lengths reach this far whatever the page: a row, a buffer or a context sized for a few hundred
# positions overflows only past them (a draft's topk x prefix, a graph's bs x context).
DEFAULT_MAX_TOKENS = 160
# Head shapes the search tries where a backend does not pin them (small: the metadata does not
# scale with heads, the cell's time does).
_SMALL_HEADS = (1, 2, 4, 8)
_SMALL_HEAD_DIMS = (16, 32, 64)
_SMALL_PAGES = (1, 2, 4, 16, 64)
DRAWS_PER_EXAMPLE = 2
# Examples of one kind drawn per hypothesis run; a kind's examples are these blocks in turn.
BLOCK = 8
MAX_BLOCKS = 10_000


@dataclass(frozen=True)
class Space:
    """What one search draws from: the backends and probes of a code base it may use (after
    ``--family`` and ``--mode``) and the working sizes."""

    codebase: Any
    backends: tuple[str, ...]
    probes: tuple[str, ...]
    modes: tuple[str, ...] | None = None
    max_requests: int = DEFAULT_MAX_REQUESTS
    max_pages: int = DEFAULT_MAX_PAGES
    max_tokens: int = DEFAULT_MAX_TOKENS
    # --where: keys every drawn scenario holds at these values (a dotted path into the node).
    pins: tuple[tuple[tuple[str, ...], Any], ...] = ()
    # Only these kinds, (backend or probe, mode) (None: every kind of the space): a search for a
    # change narrowed to the kinds whose examples enter its functions.
    only: tuple[tuple[str, str], ...] | None = None

    def pinned(self, node: dict) -> dict:
        """``node`` with the pinned keys set (a copy; the node itself where nothing is pinned)."""
        if not self.pins:
            return node
        import copy

        out = copy.deepcopy(node)
        for path, value in self.pins:
            at = out
            for key in path[:-1]:
                inner = at.get(key)
                if not isinstance(inner, dict):
                    inner = at[key] = {}
                at = inner
            at[path[-1]] = value
        return out

    def holds_pins(self, node: dict) -> bool:
        for path, value in self.pins:
            at: Any = node
            for key in path:
                if not isinstance(at, dict) or key not in at:
                    return False
                at = at[key]
            if at != value:
                return False
        return True

    def reached_by_engine(self, node: dict) -> bool:
        """Whether every request's prefix is one the engine runs the node's mode on
        (``ModeRule.engine_min_prefix``)."""
        low = rule_for(node.get("mode", "")).engine_min_prefix if node.get("mode") in MODE_RULES else 0
        return all(p >= low for p in node.get("batch", {}).get("prefix_lens", ()))

    def admits(self, node: dict) -> bool:
        """Whether ``node`` is a scenario of this space: its pins held, and a scenario file with it
        would load and run on the code base (what a shrinker's reduction must keep)."""
        if not self.holds_pins(node) or not self.reached_by_engine(node):
            return False
        try:
            to_scenario(node, codebase=self.codebase)
        except ConfigError:
            return False
        return True

    def modes_of(self, backend: str) -> tuple[str, ...]:
        """The modes ``backend``'s adapter runs on the code base, within ``--mode``."""
        cb = self.codebase
        runs = cb.backend_modes.get(backend, backend_rule(backend).modes)
        return tuple(
            m
            for m in backend_rule(backend).modes
            if m in runs and m not in cb.lacks_modes and (self.modes is None or m in self.modes)
        )

    def probe_modes(self, probe: str) -> tuple[str, ...]:
        return tuple(
            m
            for m in probe_rule(probe).modes
            if m not in self.codebase.lacks_modes and (self.modes is None or m in self.modes)
        )


def space_for(
    codebase: Any,
    *,
    family: str | None = None,
    mode: str | None = None,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    max_pages: int = DEFAULT_MAX_PAGES,
    pins: tuple[tuple[tuple[str, ...], Any], ...] = (),
    with_probes: bool = False,
) -> Space:
    """The space of ``codebase``: every backend it has an adapter for and every probe it has, or
    only ``family`` (a backend, or ``probes``; ``with_probes``: a backend and every probe) and
    ``mode``, every scenario holding ``pins`` (``parse_pins``); ConfigError naming a bad one."""
    backends = tuple(b for b in field_kind(ScenarioNode, "backend").choices if b in codebase.adapters)
    probes = tuple(p for p in field_kind(ScenarioNode, "probe").choices if p in codebase.probes)
    if family is not None:
        families = (*backends, "probes")
        if family not in families:
            raise ConfigError(
                f"--family {family}: {codebase.name} has no such backend family{nearest(family, families)}; "
                f"families: {', '.join(families)}"
            )
        backends, probes = ((), probes) if family == "probes" else ((family,), probes if with_probes else ())
    for backend, flags in getattr(codebase, "search_flags", {}).items():
        if backend in backends and flags:
            # A flag the profile names wrongly would only make every draw holding it refused.
            check_engine_flags(dict.fromkeys(flags, "true"), codebase, where=f"{codebase.name}: search_flags.{backend}")
    _check_sync_free_flags(codebase)
    modes = None
    if mode is not None:
        all_modes = field_kind(ScenarioNode, "mode").choices
        canonical = mode.strip().upper().replace("-", "_")
        if canonical not in all_modes:
            raise ConfigError(
                f"--mode {mode}: no such mode{nearest(canonical, all_modes)}; modes: {', '.join(all_modes)}"
            )
        modes = (canonical,)
    space = Space(
        codebase=codebase,
        backends=backends,
        probes=probes,
        modes=modes,
        max_requests=max_requests,
        max_pages=max_pages,
        pins=pins,
    )
    if not any(space.modes_of(b) for b in backends) and not any(space.probe_modes(p) for p in probes):
        raise ConfigError(
            f"--mode {mode}: no {family or 'backend or probe'} of {codebase.name} runs it; drop --mode or pick another"
        )
    return space


# ----------------------------------------------------------------------------- sizes near edges


def _near(edges: list[int], *, low: int, high: int) -> st.SearchStrategy[int]:
    """An edge, one below or one above it, or any size in [low, high]."""
    edges = sorted({e for e in edges if low <= e <= high}) or [low]
    at_edge = st.tuples(st.sampled_from(edges), st.sampled_from((-1, 0, 1))).map(
        lambda t: min(high, max(low, t[0] + t[1]))
    )
    return st.one_of(at_edge, st.integers(low, high))


def _tokens(draw: Any, *, page: int, space: Space, low: int, extra: list[int] = ()) -> int:
    """A length near a page boundary, a power of two (or an extra edge: the window, a bucket), within
    the space's pages and tokens."""
    kind = field_kind(BatchNode, "prefix_lens")
    high = min(kind.high, max(space.max_pages * page + 1, space.max_tokens))
    powers = [2**k for k in range(high.bit_length())]
    edges = [k * page for k in range(space.max_pages + 1)] + powers + list(extra)
    return draw(_near(edges, low=max(low, kind.low), high=max(high, low)))


def _page_size(allowed: tuple[int, ...] | None) -> st.SearchStrategy[int]:
    kind = field_kind(ScenarioNode, "page_size")
    choices = allowed or tuple(p for p in _SMALL_PAGES if kind.low <= p <= kind.high)
    return st.sampled_from(choices)


@st.composite
def _spec(draw: Any, rule: Any) -> dict:
    topk_kind, steps_kind, tokens_kind = (field_kind(SpecShape, n) for n in ("topk", "num_steps", "num_draft_tokens"))
    top = min(rule.max_topk, 8, topk_kind.high)
    # Chain drafting (topk 1) one time in four besides: the engine's commonest draft and a branch of
    # its own in the sizing and the backends (a tree of one), not one value in eight.
    topk = topk_kind.low if draw(st.integers(0, 3)) == 0 else draw(st.integers(topk_kind.low, top))
    # A multi-step draft runs num_steps - 1 attention steps: at least one.
    low = max(steps_kind.low, 2 if rule.new_tokens == "draft_steps" else 1)
    steps = draw(st.integers(low, min(5, steps_kind.high)))
    room = draft_tree_capacity(topk=topk, num_steps=steps) if rule.draft_tree else 8
    high = max(tokens_kind.low, min(room, 16, tokens_kind.high))
    # The count a server sets for the draft (a chain's steps + 1, a tree's full capacity) one time in
    # three, where the schema takes it: sizes that take the larger of steps x topk and the draft
    # tokens tip over there.
    usual = steps + 1 if topk == 1 else high
    if tokens_kind.low <= usual <= high and draw(st.integers(0, 2)) == 0:
        tokens = usual
    else:
        tokens = draw(st.integers(tokens_kind.low, high))
    return {"topk": topk, "num_steps": steps, "num_draft_tokens": tokens}


@st.composite
def _model(draw: Any, brule: Any) -> dict:
    dtypes = tuple(d for d in field_kind(ModelShape, "dtype").choices if d in brule.dtypes)
    model: dict[str, Any] = {"dtype": draw(st.sampled_from(dtypes))}
    if brule.mla:
        # One latent KV head of the kernels' fixed shape: only the query heads are free.
        model["num_heads"] = draw(st.sampled_from(brule.num_heads or _SMALL_HEADS))
        return model
    heads = draw(st.sampled_from(brule.num_heads or _SMALL_HEADS))
    groups = [g for g in range(1, heads + 1) if heads % g == 0 and (brule.max_group is None or g <= brule.max_group)]
    kv = heads // draw(st.sampled_from(groups))
    dims = tuple(d for d in (brule.head_dims or _SMALL_HEAD_DIMS) if field_kind(ModelShape, "head_dim").low <= d)
    model.update(num_heads=heads, num_kv_heads=kv, head_dim=draw(st.sampled_from(dims)))
    return model


@st.composite
def _graph(draw: Any, *, rule: Any, bs: int, new_tokens: list[int], space: Space) -> dict | None:
    """No graph, or captured sizes with the batch's own or a padded one (a prefill graph: token
    buckets and request slots)."""
    if not rule.graph or not draw(st.booleans()):
        return None
    high = field_kind(CudaGraphNode, "capture_bs").high
    if rule.name == "EXTEND":
        tokens = sum(new_tokens)
        bucket = min(high, tokens + draw(st.integers(0, tokens)))
        return {"capture_bs": [bucket], "full_prefill_max_req": min(high, bs + draw(st.integers(0, 2)))}
    own = min(high, bs + draw(st.integers(0, 2)))
    others = draw(st.lists(st.integers(1, space.max_requests + 2), max_size=2))
    return {"capture_bs": sorted({own, *others})}


# ----------------------------------------------------------------------------- nodes


@st.composite
def _backend_node(draw: Any, space: Space, backend: str, mode: str) -> dict:
    brule, cb = backend_rule(backend), space.codebase
    rule = rule_for(mode, backend)
    page = draw(_page_size(brule.page_sizes))
    spec = draw(_spec(rule))
    bs = draw(st.integers(1, space.max_requests))
    node: dict[str, Any] = {"backend": backend, "mode": mode, "page_size": page, "spec": spec}
    builders = tuple(b for b in field_kind(ScenarioNode, "builder").choices if b in rule.builders)
    if len(builders) > 1:
        # The kit's batch or the production glue's (a spec-v2 draft extend): the glue's own bugs.
        node["builder"] = draw(st.sampled_from(builders))
    model = draw(_model(brule))
    window = None
    if mode in brule.sliding_window_modes and backend in cb.sliding_window and draw(st.booleans()):
        # A window of a page or two, or of a few tokens to a few dozen whatever the page: prefixes
        # and extends are drawn around it, shorter and longer.
        sizes = [page, 2 * page, *(2**k for k in range(2, 6))]
        window = draw(_near(sizes, low=field_kind(ModelShape, "sliding_window").low, high=max(2 * page + 1, 33)))
        model["sliding_window"] = window
        if mode in FULL_LAYER_MODES and draw(st.booleans()):
            model["full_layer"] = True  # the window model's other layer: its full-attention metadata
    node["model"] = model
    edges = [window, window + 1] if window else []
    low = rule.engine_min_prefix
    batch: dict[str, Any] = {
        "prefix_lens": [_tokens(draw, page=page, space=space, low=low, extra=edges) for _ in range(bs)]
    }
    if rule.takes_extend_lens:
        low = field_kind(BatchNode, "extend_lens").low
        if rule.canvas:
            batch["extend_lens"] = _tokens(draw, page=page, space=space, low=low)
        else:
            batch["extend_lens"] = [_tokens(draw, page=page, space=space, low=low, extra=edges) for _ in range(bs)]
    if rule.needs_accept_lens:
        top = min(spec["num_steps"], spec["num_draft_tokens"] - 1)
        batch["accept_lens"] = [draw(st.integers(0, max(0, top))) for _ in range(bs)]
    node["batch"] = batch
    new = _new_tokens(rule, batch, spec, bs)
    graph = draw(_graph(rule=rule, bs=bs, new_tokens=new, space=space))
    if graph is not None:
        node["cuda_graph"] = graph
    if rule.gpu_only and brule.gpu_only and draw(st.booleans()):
        node["gpu_only"] = True
    _features(draw, node, space=space, brule=brule, rule=rule)
    if draw(st.booleans()):
        # The tightest context the batch fits, or a little above it: the headroom arithmetic's edge.
        new = _new_tokens(rule, node["batch"], spec, bs)
        need = max(p + n for p, n in zip(node["batch"]["prefix_lens"], new))
        node["max_context_len"] = need + draw(st.integers(0, 3))
    return node


def _sometimes(draw: Any) -> bool:
    """A rarer feature is drawn one time in four: several at once are mostly refused together."""
    return draw(st.integers(0, 3)) == 0


def _check_sync_free_flags(codebase: Any) -> None:
    """A ``sync_free_flags`` entry names a flag the search draws for that backend, and modes."""
    for backend, by_flag in codebase.sync_free_flags.items():
        drawn = codebase.search_flags.get(backend, ())
        for flag, modes in by_flag.items():
            where = f"{codebase.name}: sync_free_flags.{backend}.{flag}"
            if flag not in drawn:
                raise ConfigError(f"{where}: not one of search_flags.{backend}{nearest(flag, drawn)}; add it there")
            for m in modes:
                if m not in backend_rule(backend).modes:
                    raise ConfigError(f"{where}: {backend} runs no mode {m}{nearest(m, backend_rule(backend).modes)}")


def _features(draw: Any, node: dict, *, space: Space, brule: Any, rule: Any) -> None:
    """The rarer keys, each where the code base's adapter for this backend builds it (its record's
    feature lists) and the backend's mode table takes it: deterministic inference, a hybrid's
    linear layer set and Mamba tracking, an encoder-decoder batch, a multi-item scoring batch,
    decode context parallelism, an engine flag the profile lets the search turn on
    (``search_flags``; declared sync-free on CUDA where ``sync_free_flags`` says so). What the schema then refuses is rejected like any other draw."""
    cb, backend, mode, batch = space.codebase, node["backend"], node["mode"], node["batch"]
    bs = len(batch["prefix_lens"])
    if backend in cb.deterministic and _sometimes(draw):
        node["deterministic"] = True
    if backend in cb.linear_attention and _sometimes(draw):
        node["model"]["linear_attention"] = draw(st.sampled_from(field_kind(ModelShape, "linear_attention").choices))
    if backend in cb.mamba_track and mode in ("EXTEND", "DECODE") and _sometimes(draw):
        if mode == "DECODE":
            batch["mamba_track"] = [draw(st.integers(0, 1)) for _ in range(bs)]
        else:
            new = _new_tokens(rule, batch, node["spec"], bs)
            # Tracked: the extend's end, or one past a 64-token chunk boundary inside it.
            batch["mamba_track"] = [draw(st.sampled_from((0, n, min(n, 65)))) for n in new]
            batch["mamba_track_host"] = draw(st.booleans())
    if backend in cb.encoder_decoder and mode in brule.encoder_decoder_modes and _sometimes(draw):
        node["model"]["cross_attention"] = draw(st.booleans())
        batch["encoder_lens"] = [draw(st.integers(1, 2 * node.get("page_size", 1) + 1)) for _ in range(bs)]
    if backend in cb.multi_item_scoring and mode in brule.multi_item_modes and _sometimes(draw):
        items = []
        # A hybrid's batch scores every request or none (GDN's scoring is prefill-only).
        everyone = backend == "hybrid_linear" and draw(st.booleans())
        for i in range(bs):
            one = st.lists(st.integers(1, 6), min_size=1, max_size=3)
            request = draw(one if everyone else st.none() if backend == "hybrid_linear" else st.none() | one)
            items.append(request)
            if request is not None and isinstance(batch.get("extend_lens"), list):
                # Room for a query, a delimiter before each item, the items and the closing one.
                batch["extend_lens"][i] = max(batch["extend_lens"][i], sum(request) + len(request) + 2)
        batch["items"] = items
        if backend == "hybrid_linear":
            batch["prefix_lens"] = [0] * bs  # the hybrid scores items with no cached prefix
        node.pop("cuda_graph", None)
        node["model"].pop("sliding_window", None)
        node["model"].pop("full_layer", None)
    if backend in cb.decode_context_parallel and mode in brule.dcp_modes and _sometimes(draw):
        node["dcp_size"] = draw(st.sampled_from((2, 4)))
    flags = tuple(cb.search_flags.get(backend, ()))
    if flags and _sometimes(draw):
        flag = draw(st.sampled_from(flags))
        node["env"] = {flag: True}
        if mode in cb.sync_free_flags.get(backend, {}).get(flag, ()):
            node["sync_free"] = "cuda"


def _new_tokens(rule: Any, batch: dict, spec: dict, bs: int) -> list[int]:
    extend = batch.get("extend_lens")
    return list(
        rule.new_token_counts(
            batch_size=bs,
            extend_lens=(extend,) * bs if isinstance(extend, int) else tuple(extend) if extend else None,
            accept_lens=tuple(batch["accept_lens"]) if batch.get("accept_lens") else None,
            num_draft_tokens=spec["num_draft_tokens"],
            topk=spec["topk"],
            num_steps=spec["num_steps"],
        )
    )


@st.composite
def _probe_node(draw: Any, space: Space, probe: str, mode: str) -> dict:
    prule = probe_rule(probe)
    rule = rule_for(mode)
    page = draw(_page_size(prule.page_sizes)) if "page_size" in prule.reads else 1
    spec = draw(_spec(rule))
    bs = draw(st.integers(1, space.max_requests))
    node: dict[str, Any] = {"probe": probe, "mode": mode}
    low = rule.engine_min_prefix
    # Prefixes whose end after what a draft step writes (its tokens, its tree, the doubled reserve
    # an overlapped step holds) lands on a page edge: a sizing a token or two off rounds to another
    # page there and only there.
    ahead = _draft_footprints(spec) if "spec" in prule.reads and page > 1 else []
    shifted = [k * page - f for f in ahead for k in range(1, space.max_tokens // page + 3)]
    prefix_lens = [_tokens(draw, page=page, space=space, low=low, extra=shifted) for _ in range(bs)]
    batch: dict[str, Any] = {"prefix_lens": prefix_lens}
    if rule.takes_extend_lens:
        low = field_kind(BatchNode, "extend_lens").low
        batch["extend_lens"] = [_tokens(draw, page=page, space=space, low=low) for _ in range(bs)]
    if rule.needs_accept_lens:
        batch["accept_lens"] = [
            draw(st.integers(0, min(spec["num_steps"], spec["num_draft_tokens"] - 1))) for _ in range(bs)
        ]
    node["batch"] = batch
    reads = set(prule.reads) - set(PROBE_COMMON_KEYS)
    if "spec" in reads:
        node["spec"] = spec
    if "page_size" in reads:
        node["page_size"] = page
    if "gpu_only" in reads and rule.gpu_only and draw(st.booleans()):
        node["gpu_only"] = True
    if "cuda_graph" in reads and (prule.needs_graph or draw(st.booleans())):
        new = _new_tokens(rule, batch, spec, bs)
        graph = draw(_graph(rule=rule, bs=bs, new_tokens=new, space=space).filter(lambda g: g is not None))
        node["cuda_graph"] = graph
    if "dcp_size" in reads and draw(st.booleans()):
        node["dcp_size"] = draw(st.sampled_from((2, 4)))
    # Mostly at the edge (the default is the longest prefix + 3, tight the batch's need + 0-3), now
    # and then far from it.
    shares = ("default", "default", "tight", "tight", "tight", "roomy")
    context = draw(st.sampled_from(shares)) if "max_context_len" in reads else "default"
    if context != "default":
        margin = prule.prefix_margin or 0
        new = _new_tokens(rule, batch, spec, bs)
        need = max(max(p + margin for p in batch["prefix_lens"]), max(p + n for p, n in zip(batch["prefix_lens"], new)))
        # Tight: the headroom arithmetic's edge. Roomy: far from any edge, where a sizing that is
        # short (an allocation below what a step writes) shows apart from one that overflows a row.
        node["max_context_len"] = need + (draw(st.integers(0, 3)) if context == "tight" else draw(st.integers(16, 256)))
    return node


def _draft_footprints(spec: dict) -> list[int]:
    """What one draft step may write past a request's committed length: its verify tokens, its tree
    (topk x steps), and twice the larger (a step overlapped with the next holds two)."""
    tree = spec["topk"] * spec["num_steps"]
    return sorted({spec["num_draft_tokens"], tree, 2 * max(tree, spec["num_draft_tokens"])})


def node_name(node: dict) -> str:
    """A stable name for a drawn node: what it runs, its mode, a digest of the rest."""
    digest = hashlib.sha256(json.dumps(node, sort_keys=True).encode()).hexdigest()[:10]
    what = node.get("probe") or node.get("backend")
    return f"search-{what}-{str(node['mode']).lower().replace('_', '-')}-{digest}"


def to_scenario(node: dict, *, codebase: Any, where: str = "<search>") -> Scenario:
    """The runnable scenario of a drawn node, named for it; ConfigError where the schema, the
    memory estimate or the code base refuses it."""
    node = {"name": node_name(node), **node}
    parsed = validate_node(ScenarioNode, node, where=where, what=f"scenario {node['name']}")
    scenario = parsed.to_scenario(name=parsed.name, path=where, line=0)
    check_memory([scenario])
    check_scenarios_runnable([scenario], codebase)
    return scenario


def kind_of(scenario: Scenario) -> tuple[str, str]:
    """The kind a scenario is, as ``kinds`` names them: (backend or probe, mode)."""
    return (str(scenario.probe or scenario.backend), str(scenario.mode))


def kinds(space: Space) -> list[tuple[str, str]]:
    """What a scenario of the space runs, (backend or probe, mode), in the schema's order."""
    out = [(b, m) for b in space.backends for m in space.modes_of(b)]
    out += [(p, m) for p in space.probes for m in space.probe_modes(p)]
    return out if space.only is None else [k for k in out if k in space.only]


def scenario_nodes(space: Space, kind: tuple[str, str]) -> st.SearchStrategy[dict]:
    """Nodes of one kind as a scenario file would spell them (before validation)."""
    what, mode = kind
    return _probe_node(space, what, mode) if what in space.probes else _backend_node(space, what, mode)


@st.composite
def scenarios(draw: Any, space: Space, kind: tuple[str, str]) -> tuple[dict, Scenario]:
    """A drawn node (with the space's pins set) and its runnable scenario; a node the code base
    refuses is rejected."""
    node = space.pinned(draw(scenario_nodes(space, kind)))
    try:
        return node, to_scenario(node, codebase=space.codebase)
    except ConfigError:
        from hypothesis import reject

        reject()


def examples(space: Space, *, count: int, seed: int) -> list[tuple[dict, Scenario]]:
    """``count`` distinct valid examples (fewer where the space holds fewer), the same for the same
    seed, every kind in turn (round robin); a larger ``count`` gives these first and more after
    them. Hypothesis draws each kind's share in blocks of its own seed; nothing fails, so it
    neither shrinks nor stores anything."""
    every = kinds(space)
    share = -(-count // len(every))
    drawn = [_kind_examples(space, kind, count=share, seed=seed) for kind in every]
    out: list[tuple[dict, Scenario]] = []
    for i in range(share):
        out += [d[i] for d in drawn if i < len(d)]
    return out[:count]


def _kind_examples(space: Space, kind: tuple[str, str], *, count: int, seed: int) -> list[tuple[dict, Scenario]]:
    """The first ``count`` distinct examples of one kind: block after block, each drawn from its own
    seed, so that what a block holds does not depend on how many are asked for."""
    out: dict[str, tuple[dict, Scenario]] = {}
    for block in range(MAX_BLOCKS):
        if len(out) >= count:
            break
        fresh = 0
        for example in _draw(space, kind, count=BLOCK, seed=_kind_seed(seed, kind, block)):
            if example[1].name not in out:
                out[example[1].name] = example
                fresh += 1
        if not fresh:
            break  # the kind's space is spent
    return list(out.values())[:count]


def _kind_seed(seed: int, kind: tuple[str, str], block: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{kind[0]}:{kind[1]}:{block}".encode()).digest()[:8], "big")


def _draw(space: Space, kind: tuple[str, str], *, count: int, seed: int) -> list[tuple[dict, Scenario]]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    out: dict[str, tuple[dict, Scenario]] = {}

    @fixed_seed(seed)
    @settings(
        # Hypothesis draws some examples twice: room for the distinct ones.
        max_examples=DRAWS_PER_EXAMPLE * count,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(scenarios(space, kind))
    def collect(example: tuple[dict, Scenario]) -> None:
        if len(out) < count:
            out.setdefault(example[1].name, example)

    from hypothesis.errors import Unsatisfiable

    try:
        collect()
    except Unsatisfiable:
        # Every draw refused (a kind whose scenarios cannot hold the --where pins): none here.
        pass
    return list(out.values())


def parse_pins(given: Any, *, option: str = "--where") -> tuple[tuple[tuple[str, ...], Any], ...]:
    """``KEY=VALUE`` items (a dotted key of the scenario schema, a YAML value) as the space's pins;
    ConfigError naming a key the schema lacks (with the nearest) or an item without ``=``."""
    import yaml

    out = []
    for item in given or ():
        key, eq, text = str(item).partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{option} {item}: give KEY=VALUE, e.g. {option} spec.topk=1")
        path = tuple(key.strip().split("."))
        model: Any = ScenarioNode
        for i, part in enumerate(path):
            fields = model.model_fields if model is not None else {}
            if part not in fields:
                known = [".".join((*path[:i], f)) for f in fields]
                raise ConfigError(
                    f"{option} {item}: the scenario schema has no key {'.'.join(path[: i + 1])}"
                    f"{nearest('.'.join(path[: i + 1]), known)}; sglfix schema scenario lists them"
                )
            model = model_in(fields[part].annotation) if i < len(path) - 1 else None
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{option} {item}: {text!r} is not a YAML value") from None
        out.append((path, value))
    return tuple(out)
