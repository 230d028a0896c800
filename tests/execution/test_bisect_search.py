"""The culprit search over synthetic oracles: right answers, and the run budget."""

from __future__ import annotations

import math
import random

import pytest

from sglfix.execution.bisect import Oracle, ddmin, find_culprits, find_masking, one_culprit_search


def _ids(n: int) -> list[str]:
    return [f"t{i:02d}" for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 8, 16, 17, 32, 64])
def test_one_culprit_within_log2_plus_two_runs(n):
    ids = _ids(n)
    for culprit in random.Random(n).sample(ids, min(n, 6)):
        oracle = Oracle(lambda s, c=culprit: c in s)
        found = find_culprits(ids, oracle)
        assert found == [[culprit]]
        # ceil(log2 n) complement halvings, the culprit alone, at most one "all but the culprit":
        # every other candidate proven clean, the culprit seen failing alone.
        assert oracle.runs <= math.ceil(math.log2(n)) + 2, (n, oracle.runs)
        assert frozenset([culprit]) in oracle.asked


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_two_culprits_are_both_found(n):
    ids = _ids(n)
    a, b = random.Random(n).sample(ids, 2)
    oracle = Oracle(lambda s: a in s or b in s)
    found = find_culprits(ids, oracle)
    assert sorted(map(tuple, found)) == sorted([(a,), (b,)])
    assert oracle.runs <= 2 * (math.ceil(math.log2(n)) + 2) + 1


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_no_culprit_is_none(n):
    oracle = Oracle(lambda s: False)
    assert find_culprits(_ids(n), oracle) == []
    assert oracle.runs <= math.ceil(math.log2(max(n, 2))) + 2


def test_a_cause_that_needs_two_candidates_together_falls_back_to_ddmin():
    ids = _ids(16)
    oracle = Oracle(lambda s: "t03" in s and "t12" in s)
    assert sorted(one_culprit_search(ids, oracle)) == ["t03", "t12"]
    for a, b in random.Random(3).sample([(x, y) for x in ids for y in ids if x < y], 30):
        found = find_culprits(ids, Oracle(lambda s, a=a, b=b: a in s and b in s))
        assert [sorted(f) for f in found] == [[a, b]], (a, b, found)
    assert sorted(ddmin(ids, Oracle(lambda s: "t03" in s and "t12" in s))) == ["t03", "t12"]


def test_masking_pair_is_reported():
    # fixture and triton each fail alone; reverted together they agree and pass.
    def fails(s):
        s = set(s)
        return (bool(s & {"fixture", "triton"}) and not {"fixture", "triton"} <= s) or "other" in s

    oracle = Oracle(fails)
    culprits = [["fixture"], ["triton"]]
    masking = find_masking(culprits, lambda c: ["fixture", "triton", "clamp"], oracle)
    assert {"culprit": "fixture", "masked_by": "triton"} in masking
    assert {"culprit": "triton", "masked_by": "fixture"} in masking
    assert not any(m["masked_by"] == "clamp" for m in masking)


def test_sets_are_asked_once():
    calls = []
    oracle = Oracle(lambda s: calls.append(s) or "b" in s)
    oracle(["a", "b"])
    oracle(["b", "a"])
    assert len(calls) == 1 and oracle.runs == 1
