"""Shrinking: the reductions of a node, and a shrink that ends on a node no single reduction of
which still fails, the same for the same start, asking about each distinct node once."""

from __future__ import annotations

import json

from sglfix.codebases import get_codebase
from sglfix.common.errors import ConfigError
from sglfix.search.shrink import reductions, shrink
from sglfix.search.space import to_scenario

CB = get_codebase("sglang-0.5.23")

NODE = {
    "backend": "triton",
    "mode": "TARGET_VERIFY",
    "page_size": 16,
    "spec": {"topk": 2, "num_steps": 3, "num_draft_tokens": 4},
    "model": {"dtype": "float16", "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "sliding_window": 17},
    "batch": {"prefix_lens": [33, 0, 48]},
    "cuda_graph": {"capture_bs": [2, 4, 5]},
    "max_context_len": 60,
}


def valid(node: dict) -> bool:
    try:
        to_scenario(node, codebase=CB)
    except ConfigError:
        return False
    return True


def test_every_reduction_changes_one_thing_and_lists_biggest_cuts_first():
    done = reductions(NODE)
    whats = [w for w, _ in done]
    assert whats[:3] == ["request 0 dropped", "request 1 dropped", "request 2 dropped"]
    assert "eager (no CUDA graph)" in whats
    assert (
        whats.index("batch.prefix_lens[0] 0")
        < whats.index("batch.prefix_lens[0] 16")
        < whats.index("batch.prefix_lens[0] 32")
    )
    assert {"page_size 8", "spec.topk 1", "the sliding window left out", "the context limit left out"} <= set(whats)
    for _, smaller in done:
        assert smaller != NODE
    assert NODE["batch"]["prefix_lens"] == [33, 0, 48]  # nothing edited in place


def _fails_when(pred):
    asked: list[dict] = []

    def still_fails(nodes):
        asked.extend(nodes)
        return [pred(n) for n in nodes]

    return still_fails, asked


def test_a_shrink_ends_where_no_single_reduction_still_fails():
    # A failure that needs a prefix past a page boundary under a graph, two requests and a window.
    def pred(n):
        return (
            "cuda_graph" in n
            and len(n["batch"]["prefix_lens"]) >= 2
            and max(n["batch"]["prefix_lens"]) > n.get("page_size", 1)
            and "sliding_window" in n.get("model", {})
        )

    still_fails, asked = _fails_when(pred)
    out = shrink(NODE, valid=valid, still_fails=still_fails)
    assert pred(out.node) and valid(out.node)
    assert all(not pred(smaller) for _, smaller in reductions(out.node) if valid(smaller))
    assert len(out.node["batch"]["prefix_lens"]) == 2
    assert out.node["spec"]["topk"] == 1 and "max_context_len" not in out.node
    keys = [json.dumps(n, sort_keys=True) for n in asked]
    assert len(keys) == len(set(keys)) == out.asked
    again = shrink(NODE, valid=valid, still_fails=_fails_when(pred)[0])
    assert again.node == out.node and again.steps == out.steps


def test_a_node_that_no_reduction_keeps_failing_is_its_own_shrink():
    still_fails, _ = _fails_when(lambda n: n == NODE)
    out = shrink(NODE, valid=valid, still_fails=still_fails)
    assert out.node == NODE and out.steps == [] and out.rounds == 1


def test_refused_reductions_are_never_asked_about():
    still_fails, asked = _fails_when(lambda n: True)
    out = shrink(NODE, valid=valid, still_fails=still_fails)
    assert out.refused > 0 and asked
    assert all(valid(n) for n in asked)
    assert valid(out.node)
    # Everything that can go went: one request, eager, empty prefix, smallest sizes.
    assert out.node["batch"]["prefix_lens"] == [0]
    assert "cuda_graph" not in out.node and "model" in out.node


def test_asked_a_chunk_at_a_time_a_shrink_takes_the_same_steps_and_asks_less():
    def pred(n):
        return "cuda_graph" in n and n["spec"]["num_draft_tokens"] >= 2 and sum(n["batch"]["prefix_lens"]) > 20

    whole = shrink(NODE, valid=valid, still_fails=_fails_when(pred)[0])
    rounds: list[int] = []
    still_fails, asked = _fails_when(pred)
    chunked = shrink(NODE, valid=valid, still_fails=still_fails, chunk=2, on_round=lambda s: rounds.append(s.rounds))
    assert chunked.node == whole.node and chunked.steps == whole.steps and chunked.minimal
    assert chunked.asked == len(asked) < whole.asked
    assert rounds == list(range(1, chunked.rounds + 1))
    # The last round asked about every valid reduction left: the minimal claim rests on all of them.
    assert all(not pred(s) for _, s in reductions(chunked.node) if valid(s))
    # A size that may drop to one does so in one step, not one less a round.
    assert chunked.node["spec"]["num_draft_tokens"] == 2
