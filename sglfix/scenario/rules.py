"""The rules that tie several keys of a scenario together, driven by the mode table.

Which batch keys a mode takes, whether it can be captured or run gpu_only, its topk limit, its
builders, and the token totals. ``ScenarioNode`` runs ``check_node`` as its last validator; each
refusal is a ``NodeError`` naming the key whose line the message cites.
"""

from __future__ import annotations

from typing import Any

from sglfix.common.schema import NodeError
from sglfix.scenario.limits import LIMITS_HINT, MAX_TOKENS_PER_BATCH, MAX_TOKENS_PER_REQUEST
from sglfix.scenario.modes import (
    BACKEND_RULES,
    MODE_RULES,
    PROBE_COMMON_KEYS,
    PROBE_RULES,
    ModeRule,
    backend_rule,
    probe_rule,
    rule_for,
)

__all__ = ["FULL_LAYER_MODES", "check_node", "draft_tree_capacity", "new_token_counts"]


def draft_tree_capacity(*, topk: int, num_steps: int) -> int:
    """Nodes of the largest draft tree: the verified token plus topk children per node, num_steps deep."""
    return sum(topk**d for d in range(num_steps + 1))


def _modes_where(test: Any) -> str:
    return ", ".join(r.name for r in MODE_RULES.values() if test(r))


def new_token_counts(node: Any) -> tuple[int, ...]:
    """New tokens per request of a checked node (``extend_lens`` may be one integer for all)."""
    batch, rule = node.batch, rule_for(node.mode, node.backend)
    given = batch.extend_lens
    if isinstance(given, int):
        given = (given,) * len(batch.prefix_lens)
    return rule.new_token_counts(
        batch_size=len(batch.prefix_lens),
        extend_lens=given,
        accept_lens=batch.accept_lens,
        num_draft_tokens=node.spec.num_draft_tokens,
        topk=node.spec.topk,
        num_steps=node.spec.num_steps,
    )


def _backends_where(test: Any) -> str:
    return ", ".join(r.name for r in BACKEND_RULES.values() if test(r))


def _check_backend(node: Any) -> None:
    """The backend runs the mode, dtype, page size and model shape the scenario asks for."""
    brule, model = backend_rule(node.backend), node.model
    given = model.model_fields_set
    if node.mode not in brule.modes:
        raise NodeError(
            f"uses backend {brule.name}, which runs {', '.join(brule.modes)}; mode {node.mode} runs on "
            f"{_backends_where(lambda r: node.mode in r.modes)}",
            at="mode",
        )
    if model.dtype not in brule.dtypes:
        raise NodeError(
            f"uses backend {brule.name}, whose kernels take dtype {' or '.join(brule.dtypes)}",
            at=("model", "dtype") if "dtype" in given else "backend",
        )
    if brule.page_sizes is not None and node.effective_page_size not in brule.page_sizes:
        raise NodeError(
            f"uses backend {brule.name}, which takes page_size {' or '.join(map(str, brule.page_sizes))}",
            at="page_size" if node.page_size is not None else "backend",
        )
    if node.gpu_only and not brule.gpu_only:
        raise NodeError(
            f"uses backend {brule.name}; gpu_only applies to {_backends_where(lambda r: r.gpu_only)} only",
            at="gpu_only",
        )
    if brule.num_heads is not None and model.num_heads not in brule.num_heads:
        raise NodeError(
            f"uses backend {brule.name}, whose GPU kernels take model.num_heads {', '.join(map(str, brule.num_heads))}",
            at=("model", "num_heads"),
        )
    child = _mla_child(node, brule)
    _check_window(node, brule)
    _check_encoder(node, brule)
    _check_mha(node, brule if child is None else child)
    if brule.mla or child is not None:
        for key in ("num_kv_heads", "head_dim"):
            if key in given:
                raise NodeError(
                    f"uses the MLA backend {brule.name}: one latent KV head of kv_lora_rank + "
                    f"qk_rope_head_dim values; drop model.{key}",
                    at=("model", key),
                )
        for key, only in (("kv_lora_rank", 512), ("qk_rope_head_dim", 64)):
            value = getattr(model, key)
            if value is not None and value != only:
                raise NodeError(
                    f"has model.{key} {value}; FlashInfer's MLA kernels take {only} only", at=("model", key)
                )
        return
    for key in ("kv_lora_rank", "qk_rope_head_dim"):
        if getattr(model, key) is not None:
            raise NodeError(
                f"sets model.{key}, which applies to the MLA backends "
                f"{_backends_where(lambda r: r.mla)} (and the hybrids over one: "
                f"{_backends_where(lambda r: r.mla_child)}) only; drop it (or set backend)",
                at=("model", key),
            )
    if brule.head_dims is not None and model.head_dim not in brule.head_dims:
        raise NodeError(
            f"uses backend {brule.name}, whose kernels take model.head_dim {', '.join(map(str, brule.head_dims))}",
            at=("model", "head_dim"),
        )
    if brule.max_group is not None and model.num_heads // model.num_kv_heads > brule.max_group:
        raise NodeError(
            f"has {model.num_heads // model.num_kv_heads} query heads per KV head; backend {brule.name} "
            f"runs its decode kernel up to {brule.max_group} (more selects the prefill kernel)",
            at=("model", "num_heads"),
        )


def _mla_child(node: Any, brule: Any) -> Any:
    """The rule of the MLA backend a hybrid builds for its full-attention layers, where the scenario
    gives an MLA model (model.kv_lora_rank or qk_rope_head_dim) and the backend builds one, its heads
    and mixer checked (Kimi-Linear's: delta attention beside the MLA layers); else None."""
    model = node.model
    if not brule.has_mla_child(model):
        return None
    child = backend_rule(brule.mla_child)
    if child.num_heads is not None and model.num_heads not in child.num_heads:
        raise NodeError(
            f"has an MLA full-attention layer set ({child.name} under the hybrid), whose GPU kernels take "
            f"model.num_heads {', '.join(map(str, child.num_heads))}",
            at=("model", "num_heads"),
        )
    if model.linear_attention != "kda":
        raise NodeError(
            "has an MLA full-attention layer set (model.kv_lora_rank under backend hybrid_linear), Kimi-Linear's, "
            "whose linear layers are delta attention: give model.linear_attention kda",
            at=("model", "linear_attention"),
        )
    return child


def _refuse_mode(node: Any, brule: Any, *, modes: str, at: tuple[str, str], what: str, tail: str = "") -> None:
    """One line where ``node``'s mode is not among ``brule``'s ``modes`` (a BackendRule field):
    which backends run ``what`` in which modes."""
    if node.mode in getattr(brule, modes):
        return
    where = "; ".join(
        f"{r.name} in {', '.join(getattr(r, modes))}" for r in BACKEND_RULES.values() if getattr(r, modes)
    )
    raise NodeError(
        f"sets {'.'.join(at)} with backend {brule.name} in mode {node.mode}; {what} runs on {where}{tail}", at=at
    )


_PICK = " only: drop the key or pick one of those"


# Modes whose cell runs the scenario's own layer (a draft's runs the draft model's window layer).
FULL_LAYER_MODES = ("DECODE", "EXTEND", "TARGET_VERIFY")


def _check_window(node: Any, brule: Any) -> None:
    if node.model.sliding_window is not None:
        _refuse_mode(
            node, brule, modes="sliding_window_modes", at=("model", "sliding_window"), what="a sliding-window layer"
        )
    if node.model.full_layer and node.model.sliding_window is None:
        raise NodeError(
            "sets model.full_layer (a window model's full-attention layer) without model.sliding_window; "
            "give the model's window, or drop model.full_layer (a model without one has only full layers)",
            at=("model", "full_layer"),
        )
    if node.model.full_layer and node.mode not in FULL_LAYER_MODES:
        raise NodeError(
            f"sets model.full_layer in mode {node.mode}, whose cell runs the draft's own layer; "
            f"give one of {', '.join(FULL_LAYER_MODES)} or drop model.full_layer",
            at=("model", "full_layer"),
        )


def _check_encoder(node: Any, brule: Any) -> None:
    """An encoder-decoder batch (batch.encoder_lens; model.cross_attention needs one) on a backend
    and mode that run one, one encoder length per request, no sliding window beside it."""
    enc, model = node.batch.encoder_lens, node.model
    if enc is None:
        if model.cross_attention:
            raise NodeError(
                "sets model.cross_attention (an encoder-decoder model's cross layer) without batch.encoder_lens; "
                "give the encoder tokens cached per request, batch.encoder_lens: [...]",
                at=("model", "cross_attention"),
            )
        return
    _refuse_mode(
        node,
        brule,
        modes="encoder_decoder_modes",
        at=("batch", "encoder_lens"),
        what="an encoder-decoder batch",
        tail=_PICK,
    )
    bs = len(node.batch.prefix_lens)
    if len(enc) != bs:
        raise NodeError(f"has {len(enc)} batch.encoder_lens for {bs} requests", at=("batch", "encoder_lens"))
    if model.sliding_window is not None:
        raise NodeError(
            "sets batch.encoder_lens and model.sliding_window; sglang runs no sliding window in an "
            "encoder-decoder model (its FlashInfer backend asserts so): drop one",
            at=("model", "sliding_window"),
        )


def _check_mha(node: Any, brule: Any) -> None:
    """An MLA model's multi-head prefill (model.mha_chunk) on a backend and mode that run it,
    eagerly (sglang captures no MHA prefill: its shapes follow the prefix)."""
    if node.model.mha_chunk is None:
        return
    _refuse_mode(
        node,
        brule,
        modes="mha_prefill_modes",
        at=("model", "mha_chunk"),
        what="an MLA model's multi-head prefill",
        tail=_PICK,
    )
    if node.cuda_graph is not None:
        raise NodeError(
            "sets model.mha_chunk and cuda_graph; sglang runs the MLA model's multi-head prefill eagerly "
            "(a captured prefill pins the absorbed path): drop cuda_graph",
            at="cuda_graph",
        )


def _encoder_lens(node: Any) -> list[int]:
    """Encoder tokens cached per request ahead of its decoder tokens (0 for a decoder-only model)."""
    enc = node.batch.encoder_lens
    return list(enc) if enc is not None else [0] * len(node.batch.prefix_lens)


def _check_probe(node: Any) -> None:
    """A probe scenario names no backend, uses one of the probe's modes and only keys it reads."""
    prule, given = probe_rule(node.probe), node.model_fields_set
    if "backend" in given:
        raise NodeError(
            f"names backend {node.backend} and probe {prule.name}; a probe runs instead of a backend, give exactly one",
            at="backend",
        )
    if node.mode not in prule.modes:
        raise NodeError(f"uses probe {prule.name}, which takes mode {' or '.join(prule.modes)}", at="mode")
    allowed = PROBE_COMMON_KEYS + prule.reads
    for key in (k for k in type(node).model_fields if k in given and k not in allowed):
        reads = f" (it reads {', '.join(prule.reads)})" if prule.reads else ""
        raise NodeError(f"uses probe {prule.name}, which does not read {key}{reads}; drop it", at=key)
    if prule.needs_graph and node.cuda_graph is None:
        raise NodeError(
            f"uses probe {prule.name}, which replays a CUDA graph: give cuda_graph: {{capture_bs: [...]}}",
            at="probe",
        )
    if "model" in given and node.model.sliding_window is not None:
        raise NodeError(
            f"uses probe {prule.name}, which builds no sliding-window layer; drop model.sliding_window",
            at=("model", "sliding_window"),
        )
    if "model" in given and node.model.cross_attention:
        raise NodeError(
            f"uses probe {prule.name}, which builds no cross-attention layer; drop model.cross_attention",
            at=("model", "cross_attention"),
        )
    if node.batch.encoder_lens is not None:
        raise NodeError(
            f"uses probe {prule.name}, which builds no encoder-decoder batch; drop batch.encoder_lens",
            at=("batch", "encoder_lens"),
        )
    if node.batch.items is not None:
        raise NodeError(
            f"uses probe {prule.name}, which builds no multi-item scoring batch; drop batch.items",
            at=("batch", "items"),
        )
    if prule.page_sizes is not None and node.effective_page_size not in prule.page_sizes:
        raise NodeError(
            f"uses probe {prule.name}, which takes page_size {' or '.join(map(str, prule.page_sizes))}", at="page_size"
        )
    if prule.prefix_margin is not None and node.max_context_len is not None:
        top = node.max_context_len - prule.prefix_margin
        for i, p in enumerate(node.batch.prefix_lens):
            if p > top:
                raise NodeError(
                    f"has batch.prefix_lens[{i}] = {p}, a state the engine never reaches with max_context_len "
                    f"{node.max_context_len} (probe {prule.name} judges prefixes up to max_context_len - "
                    f"{prule.prefix_margin} = {top}); lower it or raise max_context_len",
                    at=("batch", "prefix_lens", i),
                )


def check_node(node: Any) -> None:
    """Raise NodeError for the first rule ``node`` (a validated ScenarioNode) breaks."""
    if node.probe is not None:
        _check_probe(node)
    else:
        _check_backend(node)
        _check_dcp(node)
        _check_ple(node)
        _check_replayssm(node)
    rule = rule_for(node.mode, node.backend)
    if node.builder not in rule.builders:
        raise NodeError(
            f"uses builder {node.builder}, which applies to "
            f"{_modes_where(lambda r: node.builder in r.builders)} only; drop it (or set builder: kit)",
            at="builder",
        )
    _check_accept_lens(node, rule)
    _check_extend_lens(node, rule)
    _check_mamba_track(node, rule)
    if node.probe is None:
        _check_items(node)
    _check_totals(node)
    bs = len(node.batch.prefix_lens)
    if node.cuda_graph is not None:
        if not rule.graph:
            raise NodeError(
                f"is {rule.name}, which is not captured in CUDA graphs; set cuda_graph: false", at="cuda_graph"
            )
        if rule.name == "EXTEND":
            _check_prefill_graph(node)
        else:
            _check_batch_graph(node, rule, bs)
    if node.gpu_only and not rule.gpu_only:
        raise NodeError(f"is {rule.name}; gpu_only applies to {_modes_where(lambda r: r.gpu_only)} only", at="gpu_only")
    spec = node.spec
    if spec.topk > rule.max_topk:
        raise NodeError(
            f"is {rule.name}, whose reproduction supports spec.topk {rule.max_topk} only", at=("spec", "topk")
        )
    if rule.new_tokens == "draft_steps" and spec.num_steps < 2:
        raise NodeError(
            f"is {rule.name}: the draft runs num_steps - 1 attention steps; set spec.num_steps >= 2",
            at=("spec", "num_steps"),
        )
    _check_context(node)
    if rule.draft_tree:
        room = draft_tree_capacity(topk=spec.topk, num_steps=spec.num_steps)
        if spec.num_draft_tokens > room:
            raise NodeError(
                f"has spec.num_draft_tokens {spec.num_draft_tokens}, which does not fit a draft tree "
                f"of topk {spec.topk} and num_steps {spec.num_steps} (at most {room} tokens); lower it "
                f"or raise num_steps",
                at=("spec", "num_draft_tokens"),
            )


# sglang's prefill runner replays a batch only where its bucket is at most this many times its
# tokens (_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR); a batch padded more runs eagerly.
PREFILL_GRAPH_PADDING_FACTOR = 2


def _check_batch_graph(node: Any, rule: Any, bs: int) -> None:
    """A graph of every mode but EXTEND: captured per batch size, none of the prefill graph's keys."""
    graph = node.cuda_graph
    if graph.cpu:
        _check_cpu_graph(node)
    for key, given in (
        ("breakable", graph.breakable),
        ("full_prefill_max_req", graph.full_prefill_max_req is not None),
    ):
        if given:
            raise NodeError(
                f"is {rule.name}; cuda_graph.{key} applies to an EXTEND graph (sglang's prefill graph) only: drop it",
                at=("cuda_graph", key),
            )
    sizes = sorted(set(graph.capture_bs))
    if sizes[-1] < bs:
        raise NodeError(
            f"has a batch of {bs} that fits no captured size {sizes}; add one >= {bs}", at=("cuda_graph", "capture_bs")
        )


def _check_cpu_graph(node: Any) -> None:
    """sglang's CPU graph runner captures decode only, without speculation, and sglfix models it
    over a hybrid's CPU attention backend (IntelAMXAttnBackend for the full-attention layers)."""
    if node.mode != "DECODE" or node.backend != "hybrid_linear":
        raise NodeError(
            f"sets cuda_graph.cpu with backend {node.backend} in mode {node.mode}; sglang's CPU graph runner captures "
            "DECODE only, which sglfix models for backend hybrid_linear (IntelAMXAttnBackend beside the linear "
            "layers): drop it, or give that backend and mode",
            at=("cuda_graph", "cpu"),
        )
    for key, given in (
        ("model.kv_lora_rank", node.model.kv_lora_rank is not None),
        ("batch.mamba_track", node.batch.mamba_track is not None),
        ("model.replayssm_ring", node.model.replayssm_ring is not None),
        ("model.sliding_window", node.model.sliding_window is not None),
    ):
        if given:
            raise NodeError(
                f"sets {key} with cuda_graph.cpu; sglfix's CPU graph cells model a plain decode over the CPU "
                "attention backend: drop one",
                at=tuple(key.split(".")),
            )


def _check_breakable_prefill(node: Any) -> None:
    """A breakable prefill graph is modelled where a backend keeps the tables it captured (the
    runner's captured-metadata contract): a Kimi-Linear hybrid's delta-attention extend. It has no
    request slots."""
    if node.backend != "hybrid_linear" or node.model.linear_attention != "kda":
        raise NodeError(
            "sets cuda_graph.breakable, which sglfix models where the backend keeps the tables it captured "
            "(backend hybrid_linear with model.linear_attention kda); drop it, or give that backend and mixer",
            at=("cuda_graph", "breakable"),
        )
    if node.cuda_graph.full_prefill_max_req is not None:
        raise NodeError(
            "sets cuda_graph.full_prefill_max_req with cuda_graph.breakable: a breakable prefill graph is captured "
            "over the batch's own requests, not request slots; drop it",
            at=("cuda_graph", "full_prefill_max_req"),
        )


def _check_prefill_graph(node: Any) -> None:
    """An EXTEND graph is sglang's prefill runner under its full backend: capture_bs are token
    buckets, full_prefill_max_req the request slots of each; the batch must be one it replays
    (sglang runs any other eagerly), on a layer it captures."""
    graph, bs = node.cuda_graph, len(node.batch.prefix_lens)
    slots = graph.full_prefill_max_req
    if graph.cpu:
        _check_cpu_graph(node)
    if graph.breakable:
        _check_breakable_prefill(node)
    elif node.backend == "hybrid_linear":
        raise NodeError(
            "is an EXTEND graph of the hybrid backend, which sglang captures under breakable prefill graphs only "
            "(a Kimi-Linear hybrid's): set cuda_graph.breakable with model.linear_attention kda, or cuda_graph: false",
            at="cuda_graph",
        )
    elif slots is None:
        raise NodeError(
            "is an EXTEND graph (sglang's full prefill graph, capture_bs its token buckets), which needs the "
            "request slots each graph is captured with: give cuda_graph.full_prefill_max_req",
            at="cuda_graph",
        )
    if slots is not None and slots < bs:
        raise NodeError(
            f"has a batch of {bs} requests, more than cuda_graph.full_prefill_max_req {slots}: sglang runs it "
            f"eagerly; raise it to at least {bs}",
            at=("cuda_graph", "full_prefill_max_req"),
        )
    tokens = sum(new_token_counts(node))
    buckets = sorted(set(graph.capture_bs))
    fits = [n for n in buckets if n >= tokens]
    if not fits:
        raise NodeError(
            f"has {tokens} new tokens, which fit no captured token bucket {buckets}; add one >= {tokens}",
            at=("cuda_graph", "capture_bs"),
        )
    if fits[0] > PREFILL_GRAPH_PADDING_FACTOR * tokens:
        raise NodeError(
            f"pads its {tokens} new tokens to the bucket {fits[0]}, more than {PREFILL_GRAPH_PADDING_FACTOR}x: sglang "
            f"runs it eagerly; add a bucket of {tokens} .. {PREFILL_GRAPH_PADDING_FACTOR * tokens}",
            at=("cuda_graph", "capture_bs"),
        )
    for key, given, why in (
        (
            "batch.encoder_lens",
            node.batch.encoder_lens is not None,
            "its capture batch carries no encoder (sglang's prefill runner builds none)",
        ),
        (
            "model.sliding_window",
            node.model.sliding_window is not None,
            "the backend's sliding-window write buffer is the decode graph runner's, which sglfix's prefill "
            "runner does not build",
        ),
    ):
        if given:
            raise NodeError(f"sets {key} in an EXTEND graph; {why}: drop one", at=tuple(key.split(".")))


def _check_accept_lens(node: Any, rule: ModeRule) -> None:
    accept, bs, spec = node.batch.accept_lens, len(node.batch.prefix_lens), node.spec
    if rule.name == "TARGET_VERIFY" and accept is not None and node.backend is not None:
        _check_verify_commit(node, accept, bs)
        return
    if not rule.takes_accept_lens:
        if accept is not None:
            raise NodeError(
                f"is {rule.name}, which takes no batch.accept_lens (DRAFT_EXTEND does: it extends "
                f"accept_len + 1 tokens); drop it",
                at=("batch", "accept_lens"),
            )
        return
    if accept is None:
        raise NodeError(f"is {rule.name}, which needs batch.accept_lens (it extends accept_len + 1 tokens)", at="batch")
    if len(accept) != bs:
        raise NodeError(f"has {len(accept)} batch.accept_lens for {bs} requests", at=("batch", "accept_lens"))
    worst = max(range(bs), key=lambda i: accept[i])
    if rule.new_tokens == "draft":
        # A window of num_draft_tokens rows per request, of which accept_len + 1 are accepted.
        if accept[worst] > spec.num_draft_tokens - 1:
            raise NodeError(
                f"has batch.accept_lens[{worst}] = {accept[worst]}; accept lengths must be "
                f"< spec.num_draft_tokens ({spec.num_draft_tokens})",
                at=("batch", "accept_lens", worst),
            )
        return
    # The draft wrote num_steps tokens after the verified one; graphs lay out num_steps + 1 rows.
    top = min(spec.num_steps, spec.num_draft_tokens - 1)
    if accept[worst] > top:
        raise NodeError(
            f"has batch.accept_lens[{worst}] = {accept[worst]}; accept lengths must be "
            f"< spec.num_draft_tokens ({spec.num_draft_tokens}) and <= spec.num_steps ({spec.num_steps})",
            at=("batch", "accept_lens", worst),
        )


# The granularity a prefill's Mamba state is snapshotted at (sglang's mamba_cache_chunk_size: the
# gated-delta-net chunk, 64, or the page where that is larger).
MAMBA_TRACK_CHUNK = 64


def _check_mamba_track(node: Any, rule: ModeRule) -> None:
    track, host = node.batch.mamba_track, node.batch.mamba_track_host
    if track is None:
        if host is not None:
            raise NodeError(
                "has batch.mamba_track_host without batch.mamba_track; drop it", at=("batch", "mamba_track_host")
            )
        return
    if rule.name not in ("EXTEND", "DECODE"):
        raise NodeError(
            f"is {rule.name}; batch.mamba_track applies to EXTEND (a prefill's state snapshot) and DECODE "
            "(a decode step's) only; drop it",
            at=("batch", "mamba_track"),
        )
    bs = len(node.batch.prefix_lens)
    if len(track) != bs:
        raise NodeError(f"has {len(track)} batch.mamba_track for {bs} requests", at=("batch", "mamba_track"))
    if not any(track):
        raise NodeError("tracks no request (every batch.mamba_track is 0); drop the key", at=("batch", "mamba_track"))
    if rule.name == "DECODE":
        if host is not None:
            raise NodeError(
                "is DECODE, whose track has no host plan (batch.mamba_track_host is EXTEND's); drop it",
                at=("batch", "mamba_track_host"),
            )
        for i, n in enumerate(track):
            if n not in (0, 1):
                raise NodeError(
                    f"has batch.mamba_track[{i}] = {n}; in DECODE each request's entry is 1 (this step's "
                    "state is snapshotted) or 0",
                    at=("batch", "mamba_track", i),
                )
        return
    chunk = max(MAMBA_TRACK_CHUNK, node.effective_page_size)
    extend = new_token_counts(node)
    for i, n in enumerate(track):
        if not n:
            continue
        at = ("batch", "mamba_track", i)
        if n > extend[i]:
            raise NodeError(f"has batch.mamba_track[{i}] = {n}, past its extend of {extend[i]} tokens", at=at)
        if n < chunk:
            raise NodeError(
                f"has batch.mamba_track[{i}] = {n}; a tracked state covers at least one {chunk}-token chunk "
                "(the scheduler tracks no shorter extend); raise it or write 0",
                at=at,
            )
        if n % chunk == 0 and n < extend[i]:
            # The state at an aligned boundary short of the end is in the chunk states, which the
            # scheduler asks for by adding 1 (an aligned length means the extend's final state).
            raise NodeError(
                f"has batch.mamba_track[{i}] = {n}: an aligned length short of the extend's end is never "
                f"scheduled (the scheduler adds 1 to reach that boundary's state); write {n + 1} or {extend[i]}",
                at=at,
            )


def _check_items(node: Any) -> None:
    """A multi-item scoring batch (batch.items) where sglang runs one: a backend and mode that
    take it, eager (--enable-mis disables CUDA graphs), a plain self-attention layer, and room in
    every request's new tokens for its query (at least one token), a delimiter before each item,
    the items and the closing delimiter."""
    items, brule = node.batch.items, backend_rule(node.backend)
    if items is None:
        return
    at = ("batch", "items")
    _refuse_mode(node, brule, modes="multi_item_modes", at=at, what="a multi-item scoring batch", tail=_PICK)
    bs = len(node.batch.prefix_lens)
    if len(items) != bs:
        raise NodeError(f"has {len(items)} batch.items entries for {bs} requests", at=at)
    for key, given, why in (
        ("cuda_graph", node.cuda_graph is not None, "sglang disables CUDA graphs under --enable-mis"),
        (
            "batch.encoder_lens",
            node.batch.encoder_lens is not None,
            "sglang scores items with a decoder-only model's prompts",
        ),
        (
            "model.sliding_window",
            node.model.sliding_window is not None,
            "sglang drops a window layer's window under multi-item scoring (window_left -1)",
        ),
    ):
        if given:
            raise NodeError(f"sets batch.items and {key}; {why}: drop one", at=tuple(key.split(".")))
    if node.backend == "hybrid_linear":
        _check_hybrid_items(node)
    for i, (request, new) in enumerate(zip(items, new_token_counts(node))):
        if request is None:
            continue
        packed = sum(request) + len(request) + 1
        if new - packed < 1:
            raise NodeError(
                f"has batch.items[{i}] = {list(request)}: {sum(request)} item tokens and {len(request) + 1} "
                f"delimiters need {packed + 1} new tokens with a query of one, request {i} has {new}; raise "
                f"batch.extend_lens[{i}] or shorten its items",
                at=("batch", "items", i),
            )


def _check_dcp(node: Any) -> None:
    """Decode context parallelism (dcp_size > 1) where a backend builds every rank's metadata: its
    modes, eager for a prefill (the prefill runner captures no DCP batch), and none of what sglang's
    DCP paths refuse or the one-process cell cannot split by rank."""
    if node.dcp_size == 1:
        return
    brule = backend_rule(node.backend)
    if not brule.dcp_modes:
        probes = " or ".join(r.name for r in PROBE_RULES.values() if "dcp_size" in r.reads)
        raise NodeError(
            f"uses backend {node.backend}; dcp_size applies to "
            f"{_backends_where(lambda r: bool(r.dcp_modes))} and probe {probes} only; drop it",
            at="dcp_size",
        )
    _refuse_mode(node, brule, modes="dcp_modes", at=("dcp_size",), what="decode context parallelism", tail=_PICK)
    for given, key, why in (
        (node.mode == "EXTEND" and node.cuda_graph is not None, "cuda_graph", "no prefill graph captures a DCP batch"),
        (node.model.sliding_window is not None, "model.sliding_window", "sglang's DCP Triton paths take no window"),
        (node.batch.encoder_lens is not None, "batch.encoder_lens", "sglang's DCP paths build no encoder offset"),
        (node.batch.items is not None, "batch.items", "a scored batch runs on FlashInfer"),
        (node.builder != "kit", "builder", "the glue's batch is a spec-v2 draft extend"),
    ):
        if given:
            raise NodeError(f"sets dcp_size {node.dcp_size} and {key}; {why}: drop one", at="dcp_size")


def _check_ple(node: Any) -> None:
    """Per-layer-embedding side states: sglang's hybrid backend touches them in the commit after a
    verify only, so a scenario asks for them where it runs that commit."""
    if not node.model.ple_states:
        return
    commits = node.mode == "TARGET_VERIFY" and node.batch.accept_lens is not None
    if not commits or not backend_rule(node.backend).verify_commit:
        where = ", ".join(r.name for r in BACKEND_RULES.values() if r.verify_commit)
        raise NodeError(
            "sets model.ple_states; the side states are rolled forward by the commit after a verify only: "
            f"give mode TARGET_VERIFY with batch.accept_lens on {where}, or drop it",
            at=("model", "ple_states"),
        )


def _check_replayssm(node: Any) -> None:
    """A ReplaySSM ring: the decode ring of a hybrid model's gated-delta-net layers."""
    if node.model.replayssm_ring is None:
        return
    if node.backend != "hybrid_linear" or node.model.linear_attention not in (None, "gdn") or node.mode != "DECODE":
        raise NodeError(
            "sets model.replayssm_ring; ReplaySSM is the decode ring of a hybrid model's gated delta net: "
            "give backend hybrid_linear (linear_attention gdn) in mode DECODE, or drop it",
            at=("model", "replayssm_ring"),
        )


def _check_verify_commit(node: Any, accept: Any, bs: int) -> None:
    """A verify's accept lengths: the worker's commit after it, where the backend has one (a
    hybrid model's linear states); a tree accepts along its first children, at most its depth."""
    at, spec = ("batch", "accept_lens"), node.spec
    if not backend_rule(node.backend).verify_commit:
        where = ", ".join(r.name for r in BACKEND_RULES.values() if r.verify_commit)
        raise NodeError(
            f"sets batch.accept_lens in TARGET_VERIFY with backend {node.backend}; the commit after a verify "
            f"runs on {where} only (a hybrid model's linear states): drop it or pick that backend",
            at=at,
        )
    if len(accept) != bs:
        raise NodeError(f"has {len(accept)} batch.accept_lens for {bs} requests", at=at)
    top = spec.num_draft_tokens - 1 if spec.topk <= 1 else min(spec.num_steps, spec.num_draft_tokens - 1)
    worst = max(range(bs), key=lambda i: accept[i])
    if accept[worst] > top:
        raise NodeError(
            f"has batch.accept_lens[{worst}] = {accept[worst]}; a verify of {spec.num_draft_tokens} draft tokens "
            f"(topk {spec.topk}, {spec.num_steps} steps) accepts at most {top}",
            at=("batch", "accept_lens", worst),
        )


def _check_hybrid_items(node: Any) -> None:
    """A hybrid model scores items with its full-attention layers on FlashInfer (sglang refuses
    --enable-mis with another attention backend) and its linear layers on GDN, the one linear
    backend that declares multi-item support; GDN splits each request at its delimiters."""
    fi, model, at = BACKEND_RULES["flashinfer"], node.model, ("batch", "items")
    why = "a hybrid model scores items over FlashInfer (sglang's --enable-mis takes no other attention backend)"
    if node.model.linear_attention not in (None, "gdn"):
        raise NodeError(
            f"sets batch.items with model.linear_attention {node.model.linear_attention}; only the gated delta "
            "net (gdn) declares multi-item support in sglang: drop one",
            at=("model", "linear_attention"),
        )
    if node.effective_page_size not in fi.page_sizes:
        raise NodeError(f"sets batch.items with page_size {node.effective_page_size}; {why}, page_size 1", at=at)
    if model.head_dim not in fi.head_dims or model.num_heads // model.num_kv_heads > fi.max_group:
        raise NodeError(
            f"sets batch.items with model.head_dim {model.head_dim} and {model.num_heads // model.num_kv_heads} "
            f"query heads per KV head; {why}: head_dim {', '.join(map(str, fi.head_dims))}, at most "
            f"{fi.max_group} per KV head",
            at=("model", "head_dim"),
        )
    # GDN builds its segments only for a prefill-only batch (build_gdn_mis_metadata raises
    # otherwise), and a request without items is a generate one (sglang's ForwardBatch asserts
    # that every request of a multi-item batch carries delimiters).
    scored = [i for i, request in enumerate(node.batch.items) if request is not None]
    generating = [i for i, request in enumerate(node.batch.items) if request is None]
    if scored and generating:
        raise NodeError(
            f"has batch.items[{generating[0]}] = null beside scored requests; GDN's multi-item scoring runs a "
            "prefill-only batch only (a request without items generates): give it items or drop the other "
            "requests' items",
            at=("batch", "items", generating[0]),
        )
    for i, (request, prefix) in enumerate(zip(node.batch.items, node.batch.prefix_lens)):
        if request is not None and prefix:
            raise NodeError(
                f"has batch.prefix_lens[{i}] = {prefix} for a scored request; GDN's multi-item scoring takes no "
                "cached prefix (--enable-mis disables the radix cache and chunked prefill): set it to 0",
                at=("batch", "prefix_lens", i),
            )
        if request is not None and not request:
            raise NodeError(
                f"has batch.items[{i}] = []; GDN's multi-item scoring needs at least one item per scored request "
                "(two delimiters): add an item",
                at=("batch", "items", i),
            )


def _check_extend_lens(node: Any, rule: ModeRule) -> None:
    given, bs = node.batch.extend_lens, len(node.batch.prefix_lens)
    if rule.takes_extend_lens:
        if given is None:
            raise NodeError(
                f"is {rule.name}, which needs batch.extend_lens (an integer or one per request)", at="batch"
            )
        if not isinstance(given, int) and len(given) != bs:
            raise NodeError(f"has {len(given)} batch.extend_lens for {bs} requests", at=("batch", "extend_lens"))
        if rule.canvas:
            _check_canvas(node, rule)
        return
    if given is not None:
        as_list = (given,) * bs if isinstance(given, int) else tuple(given)
        derived = new_token_counts(node)
        if as_list != derived:
            raise NodeError(
                f"has batch.extend_lens {list(as_list)}, which contradicts mode {rule.name} (it extends "
                f"{list(derived)}); drop it",
                at=("batch", "extend_lens"),
            )


def _check_canvas(node: Any, rule: ModeRule) -> None:
    """A diffusion LM's block extend: every request denoises one canvas of the model's block size,
    attended both ways, which sglang's deterministic (causal) extend kernel does not serve."""
    given = node.batch.extend_lens
    if not isinstance(given, int) and len(set(given)) > 1:
        raise NodeError(
            f"is {rule.name} with batch.extend_lens {list(given)}; every request denoises one canvas of the model's "
            "block size: give one integer",
            at=("batch", "extend_lens"),
        )
    if node.deterministic:
        raise NodeError(
            f"is {rule.name} and sets deterministic; the unified deterministic extend is causal: drop it",
            at="deterministic",
        )


def _check_context(node: Any) -> None:
    """A given max_context_len must hold every request's encoder tokens, prefix and new tokens."""
    if node.max_context_len is None:
        return
    enc = _encoder_lens(node)
    need = [n + p + e for n, p, e in zip(enc, node.batch.prefix_lens, new_token_counts(node))]
    worst = max(range(len(need)), key=lambda i: need[i])
    if need[worst] > node.max_context_len:
        prefix = node.batch.prefix_lens[worst]
        encoder = f"encoder {enc[worst]} + " if enc[worst] else ""
        raise NodeError(
            f"has max_context_len {node.max_context_len}, but request {worst} needs {need[worst]} "
            f"positions ({encoder}prefix {prefix} + new {need[worst] - prefix - enc[worst]}); "
            f"raise it to at least {max(need)}",
            at="max_context_len",
        )


def _check_totals(node: Any) -> None:
    prefix, extend, enc = node.batch.prefix_lens, new_token_counts(node), _encoder_lens(node)
    for i, (n, p, e) in enumerate(zip(enc, prefix, extend)):
        if n + p + e > MAX_TOKENS_PER_REQUEST:
            encoder = f"encoder {n} + " if n else ""
            raise NodeError(
                f"has a request of {n + p + e} tokens ({encoder}prefix {p} + new {e}), over the limit of "
                f"{MAX_TOKENS_PER_REQUEST} tokens per request ({LIMITS_HINT})",
                at=("batch", "prefix_lens", i),
            )
    total = sum(enc) + sum(prefix) + sum(extend)
    if total > MAX_TOKENS_PER_BATCH:
        raise NodeError(
            f"has {total} tokens in its batch, over the limit of {MAX_TOKENS_PER_BATCH} tokens per "
            f"batch ({LIMITS_HINT})",
            at=("batch", "prefix_lens"),
        )
