"""A profile's known divergences: a confirmed upstream bug on the real engine's baseline passes
the gate with its entry, is reported with the command that reproduces it, and fails without it."""

from __future__ import annotations

import json
import textwrap

import pytest

from sglfix.common.errors import ConfigError
from sglfix.execution.expectations import check_expectations, known_hits
from sglfix.execution.known import load_known
from sglfix.harness.cell import CellResult
from sglfix.toggling.profiles import PROFILES
from sglfix.toggling.registry import load_registry


def _cell(scenario: str, verdict: str, toggles=(), device: str = "cpu") -> CellResult:
    r = CellResult(scenario=scenario, toggles=list(toggles), device=device)
    if verdict != "PASS":
        r.add(verdict, f"{verdict.lower()} for the test")
    return r.finish()


def _entries(tmp_path, text: str):
    path = tmp_path / "divergences.yaml"
    path.write_text(textwrap.dedent(text))
    return load_known(str(path))


def test_a_known_baseline_divergence_is_no_stray_and_anything_else_still_is(tmp_path):
    known = _entries(
        tmp_path,
        """\
        known_divergences:
          - scenario: "probe-req-to-token-tree-ps*"
            verdict: [INVARIANT]
            reason: the headroom ignores tree drafting at page size 1
            reproduce: sglfix run --profile sglang-0.5.23 -s probe-req-to-token-tree-ps1 --device cpu
    """,
    )
    registry = load_registry(PROFILES["sglang-0.5.23"].toggles_dir)
    results = [
        _cell("probe-req-to-token-tree-ps1", "INVARIANT"),
        _cell("probe-req-to-token-tree-ps1", "INVARIANT", toggles=["26329"]),  # the bug stays
        _cell("probe-eagle-prefill-tail", "DIVERGE"),
    ]  # new: not on the list
    _, stray, _ = check_expectations(registry, results, device="cpu", known=known)
    assert [(s["toggles"], s["scenario"]) for s in stray] == [([], "probe-eagle-prefill-tail")]
    _, without, _ = check_expectations(registry, results, device="cpu")
    assert {s["scenario"] for s in without} == {"probe-req-to-token-tree-ps1", "probe-eagle-prefill-tail"}
    # Another verdict on the listed scenario is new too.
    _, other, _ = check_expectations(
        registry, [_cell("probe-req-to-token-tree-ps1", "CRASH")], device="cpu", known=known
    )
    assert [s["verdict"] for s in other] == ["CRASH"]
    hits = known_hits(known, results)
    assert hits[0]["seen_on"] == ["probe-req-to-token-tree-ps1"] and "reproduce" in hits[0]
    assert known_hits(known, [_cell("probe-req-to-token-tree-ps1", "PASS")])[0]["seen_on"] == []  # fixed?


def test_a_device_limited_entry_covers_that_device_only_and_a_toggle_that_leaves_the_bug_meets_pass(tmp_path):
    known = _entries(
        tmp_path,
        """\
        known_divergences:
          - scenario: "fimla-draft-topk1@*"
            verdict: [DIVERGE]
            reason: the MLA step wrappers are planned over the prefix only
            reproduce: sglfix run --profile sglang-0.5.23 -s fimla-draft-topk1 --device cuda
            device: cuda
    """,
    )
    registry = load_registry(PROFILES["sglang-0.5.23"].toggles_dir)
    on_gpu = [
        _cell("fimla-draft-topk1@cg=eager", "DIVERGE", device="cuda"),
        _cell("fimla-draft-topk1@cg=eager", "DIVERGE", toggles=["27460:sizing"], device="cuda"),
    ]
    checks, stray, _ = check_expectations(registry, on_gpu, device="cuda", known=known)
    assert stray == []
    wanted_pass = [c for c in checks if c.revert == ("27460:sizing",) and c.scenario.startswith("fimla-draft-topk1")]
    assert wanted_pass and all(c.met for c in wanted_pass)
    # A toggle whose expectation wants the known verdict itself still meets it with that cell.
    known_ps1 = load_known(PROFILES["sglang-0.5.23"].known_file)
    checks, _, _ = check_expectations(
        registry, [_cell("probe-req-to-token-tree-ps1", "INVARIANT", toggles=["26972"])], device="cpu", known=known_ps1
    )
    assert [c.met for c in checks if c.revert == ("26972",) and c.scenario.startswith("probe-req-to-token")] == [True]
    # The same verdict on the CPU is not covered: a host-only path that diverges is new.
    _, stray, _ = check_expectations(
        registry, [_cell("fimla-draft-topk1@cg=eager", "DIVERGE")], device="cpu", known=known
    )
    assert [s["scenario"] for s in stray] == ["fimla-draft-topk1@cg=eager"]
    assert known_hits(known, on_gpu)[0]["seen_on"] == ["fimla-draft-topk1@cg=eager"]
    assert known_hits(known, on_gpu)[0]["device"] == "cuda"
    with pytest.raises(ConfigError):
        _entries(
            tmp_path,
            "known_divergences:\n  - {scenario: x, verdict: [DIVERGE], reason: r, reproduce: c, device: tpu}\n",
        )


def test_a_bad_list_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _entries(
            tmp_path,
            """\
            known_divergences:
              - scenario: x
                verdict: [WRONG]
                reason: r
                reproduce: c
        """,
        )
    assert "\n" not in str(exc.value) and "divergences.yaml:" in str(exc.value)
    with pytest.raises(ConfigError):
        _entries(tmp_path, "known_divergences:\n  - {scenario: x, verdict: [DIVERGE], reason: r}\n")


def test_the_profiles_list_names_builtin_scenarios_and_the_command_that_reproduces_each():
    import fnmatch

    from sglfix.scenario import load_scenarios

    profile = PROFILES["sglang-0.5.23"]
    known = load_known(profile.known_file)
    names = [s.name for s in load_scenarios(builtin_dir=profile.scenarios_dir)]
    assert known
    for k in known:
        assert any(fnmatch.fnmatchcase(n, k.scenario) for n in names), k.scenario
        assert k.reproduce.startswith("sglfix run --profile sglang-0.5.23 -s ")
        import shlex

        argv = shlex.split(k.reproduce)
        glob = argv[argv.index("-s") + 1]
        assert any(fnmatch.fnmatchcase(n, glob) for n in names), k.reproduce  # the command runs something
        assert ("--device cuda" in k.reproduce) == (k.device == "cuda"), k.reproduce
        assert json.dumps(k.model_dump())  # reported as is in the JSON report
