"""The rules that tie several keys of a scenario together, driven by the mode table.

Which batch keys a mode takes, whether it can be captured or run gpu_only, its topk limit, its
builders, and the token totals. ``ScenarioNode`` runs ``check_node`` as its last validator; each
refusal is a ``NodeError`` naming the key whose line the message cites.
"""

from __future__ import annotations

from typing import Any

from sglfix.common.schema import NodeError
from sglfix.scenario.limits import LIMITS_HINT, MAX_TOKENS_PER_BATCH, MAX_TOKENS_PER_REQUEST
from sglfix.scenario.modes import MODE_RULES, ModeRule, rule_for

__all__ = ["check_node", "draft_tree_capacity", "new_token_counts"]


def draft_tree_capacity(*, topk: int, num_steps: int) -> int:
    """Nodes of the largest draft tree: the verified token plus topk children per node, num_steps deep."""
    return sum(topk**d for d in range(num_steps + 1))


def _modes_where(test: Any) -> str:
    return ", ".join(r.name for r in MODE_RULES.values() if test(r))


def new_token_counts(node: Any) -> tuple[int, ...]:
    """New tokens per request of a checked node (``extend_lens`` may be one integer for all)."""
    batch, rule = node.batch, rule_for(node.mode)
    given = batch.extend_lens
    if isinstance(given, int):
        given = (given,) * len(batch.prefix_lens)
    return rule.new_token_counts(batch_size=len(batch.prefix_lens), extend_lens=given,
                                 accept_lens=batch.accept_lens, num_draft_tokens=node.spec.num_draft_tokens)


def check_node(node: Any) -> None:
    """Raise NodeError for the first rule ``node`` (a validated ScenarioNode) breaks."""
    rule = rule_for(node.mode)
    if node.builder not in rule.builders:
        raise NodeError(f"uses builder {node.builder}, which applies to "
                        f"{_modes_where(lambda r: node.builder in r.builders)} only; drop it (or set builder: kit)",
                        at="builder")
    _check_accept_lens(node, rule)
    _check_extend_lens(node, rule)
    _check_totals(node)
    bs = len(node.batch.prefix_lens)
    if node.cuda_graph is not None:
        if not rule.graph:
            raise NodeError(f"is {rule.name}, which is not captured in CUDA graphs; set cuda_graph: false",
                            at="cuda_graph")
        sizes = sorted(set(node.cuda_graph.capture_bs))
        if sizes[-1] < bs:
            raise NodeError(f"has a batch of {bs} that fits no captured size {sizes}; add one >= {bs}",
                            at=("cuda_graph", "capture_bs"))
    if node.gpu_only and not rule.gpu_only:
        raise NodeError(f"is {rule.name}; gpu_only applies to {_modes_where(lambda r: r.gpu_only)} only",
                        at="gpu_only")
    spec = node.spec
    if spec.topk > rule.max_topk:
        raise NodeError(f"is {rule.name}, whose Triton reproduction supports spec.topk {rule.max_topk} only",
                        at=("spec", "topk"))
    if rule.draft_tree:
        room = draft_tree_capacity(topk=spec.topk, num_steps=spec.num_steps)
        if spec.num_draft_tokens > room:
            raise NodeError(f"has spec.num_draft_tokens {spec.num_draft_tokens}, which does not fit a draft tree "
                            f"of topk {spec.topk} and num_steps {spec.num_steps} (at most {room} tokens); lower it "
                            f"or raise num_steps", at=("spec", "num_draft_tokens"))


def _check_accept_lens(node: Any, rule: ModeRule) -> None:
    accept, bs, spec = node.batch.accept_lens, len(node.batch.prefix_lens), node.spec
    if not rule.takes_accept_lens:
        if accept is not None:
            raise NodeError(f"is {rule.name}, which takes no batch.accept_lens (DRAFT_EXTEND does: it extends "
                            f"accept_len + 1 tokens); drop it", at=("batch", "accept_lens"))
        return
    if accept is None:
        raise NodeError(f"is {rule.name}, which needs batch.accept_lens (it extends accept_len + 1 tokens)",
                        at="batch")
    if len(accept) != bs:
        raise NodeError(f"has {len(accept)} batch.accept_lens for {bs} requests", at=("batch", "accept_lens"))
    # The draft wrote num_steps tokens after the verified one; graphs lay out num_steps + 1 rows.
    top = min(spec.num_steps, spec.num_draft_tokens - 1)
    worst = max(range(bs), key=lambda i: accept[i])
    if accept[worst] > top:
        raise NodeError(f"has batch.accept_lens[{worst}] = {accept[worst]}; accept lengths must be "
                        f"< spec.num_draft_tokens ({spec.num_draft_tokens}) and <= spec.num_steps ({spec.num_steps})",
                        at=("batch", "accept_lens", worst))


def _check_extend_lens(node: Any, rule: ModeRule) -> None:
    given, bs = node.batch.extend_lens, len(node.batch.prefix_lens)
    if rule.takes_extend_lens:
        if given is None:
            raise NodeError(f"is {rule.name}, which needs batch.extend_lens (an integer or one per request)",
                            at="batch")
        if not isinstance(given, int) and len(given) != bs:
            raise NodeError(f"has {len(given)} batch.extend_lens for {bs} requests", at=("batch", "extend_lens"))
        return
    if given is not None:
        as_list = (given,) * bs if isinstance(given, int) else tuple(given)
        derived = new_token_counts(node)
        if as_list != derived:
            raise NodeError(f"has batch.extend_lens {list(as_list)}, which contradicts mode {rule.name} (it extends "
                            f"{list(derived)}); drop it", at=("batch", "extend_lens"))


def _check_totals(node: Any) -> None:
    prefix, extend = node.batch.prefix_lens, new_token_counts(node)
    for i, (p, e) in enumerate(zip(prefix, extend)):
        if p + e > MAX_TOKENS_PER_REQUEST:
            raise NodeError(f"has a request of {p + e} tokens (prefix {p} + new {e}), over the limit of "
                            f"{MAX_TOKENS_PER_REQUEST} tokens per request ({LIMITS_HINT})",
                            at=("batch", "prefix_lens", i))
    total = sum(prefix) + sum(extend)
    if total > MAX_TOKENS_PER_BATCH:
        raise NodeError(f"has {total} tokens in its batch, over the limit of {MAX_TOKENS_PER_BATCH} tokens per "
                        f"batch ({LIMITS_HINT})", at=("batch", "prefix_lens"))
