"""``sglfix bisect`` on real cells: the parts that fail alone, and 26651's masking pair."""

from __future__ import annotations

import json

from clihelp import assert_one_line_error, run_cli

SCENARIOS = "triton-draft-extend-v2@cg=graph,builder=*,gpu_only=off"


def test_bisect_names_culprits_and_the_masking_pair(tmp_path):
    out = tmp_path / "b.json"
    r = run_cli("bisect", "-s", SCENARIOS, "-r", "26651:fixture,26651:triton-kv-lens,26651:clamp,26738:glue-constant",
                "--device", "cpu", "--json", str(out), timeout=900)
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]  # culprits found: a failure for CI and git bisect
    data = json.loads(out.read_text())
    assert data["candidates"] == 4
    found = {tuple(c["ids"]): c for c in data["culprits"]}
    assert set(found) == {("26651:fixture",), ("26651:triton-kv-lens",), ("26651:clamp",)}, found
    assert found[("26651:fixture",)]["scenarios"] == ["triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off"]
    assert found[("26651:clamp",)]["verdict"] == "INVARIANT"
    pairs = {(m["culprit"], m["masked_by"], m["all"]) for m in data["masking"]}
    assert ("26651:fixture", "26651:triton-kv-lens", True) in pairs
    assert ("26651:triton-kv-lens", "26651:fixture", False) in pairs  # the glue-built batch still shows it
    assert data["runs"] <= 12, data["runs"]
    assert "masking in triton-draft-extend-v2" in r.out


def test_bisect_refuses_unknown_ids_and_a_failing_baseline():
    assert_one_line_error(run_cli("bisect", "-r", "99999", "-s", SCENARIOS, "--device", "cpu"), "99999")
    # What SGLANG_DEBUG_REVERT_PR selects is part of every set, the baseline included.
    r = run_cli("bisect", "-r", "26738:glue-constant", "-s", SCENARIOS, "--device", "cpu",
                env={"SGLANG_DEBUG_REVERT_PR": "26651:clamp"}, timeout=600)
    assert r.code == 1 and "the baseline (nothing reverted) fails 2 scenario(s)" in r.err, r.err[-2000:]
