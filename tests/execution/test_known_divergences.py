"""A profile's known divergences: a confirmed upstream bug on the real engine's baseline passes
the gate with its entry, is reported with the command that reproduces it, and fails without it."""

from __future__ import annotations

import json
import textwrap

import pytest

from sglfix.common.errors import ConfigError
from sglfix.execution.known import load_known
from sglfix.harness.result import CellResult
from sglfix.report.outcome import Expect, Meaning, judge
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


def _judge(results, *, device: str, known=()):
    registry = load_registry(PROFILES["sglang-0.5.23"].toggles_dir)
    report = {"cells": [r.to_json() for r in results], "device": device}
    return judge(report, mode="gate", expects=Expect.of_registry(registry), known=known)


def _stray(j):
    return [(list(c.toggles), c.scenario, c.verdict) for c in j.cells if c.meaning is Meaning.UNEXPECTED]


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
    results = [
        _cell("probe-req-to-token-tree-ps1", "INVARIANT"),
        _cell("probe-req-to-token-tree-ps1", "INVARIANT", toggles=["26329"]),  # the bug stays
        _cell("probe-eagle-prefill-tail", "DIVERGE"),
    ]  # new: not on the list
    j = _judge(results, device="cpu", known=known)
    assert _stray(j) == [([], "probe-eagle-prefill-tail", "DIVERGE")]
    assert [c.meaning for c in j.cells[:2]] == [Meaning.KNOWN, Meaning.KNOWN]
    without = _judge(results, device="cpu")
    assert {s for _, s, _ in _stray(without) if True} == {"probe-req-to-token-tree-ps1", "probe-eagle-prefill-tail"}
    # ... and without the entry, the toggle cell shows its baseline's own verdict: not the toggle's.
    assert without.cells[1].meaning is Meaning.SAME_AS_BASELINE
    # Another verdict on the listed scenario is new too.
    other = _judge([_cell("probe-req-to-token-tree-ps1", "CRASH")], device="cpu", known=known)
    assert [v for _, _, v in _stray(other)] == ["CRASH"]
    hit = j.known[0]
    assert hit.seen_on == ["probe-req-to-token-tree-ps1"] and hit.known.reproduce and hit.status == "seen"
    fixed = _judge([_cell("probe-req-to-token-tree-ps1", "PASS")], device="cpu", known=known).known[0]
    assert fixed.seen_on == [] and "fixed?" in fixed.status


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
    on_gpu = [
        _cell("fimla-draft-topk1@cg=eager", "DIVERGE", device="cuda"),
        _cell("fimla-draft-topk1@cg=eager", "DIVERGE", toggles=["27460:sizing"], device="cuda"),
    ]
    j = _judge(on_gpu, device="cuda", known=known)
    assert _stray(j) == []
    wanted_pass = [
        c
        for c in j.checks
        if c.expect.revert == ("27460:sizing",) and c.expect.scenario.startswith("fimla-draft-topk1")
    ]
    assert wanted_pass and all(c.met for c in wanted_pass)
    # A known divergence the toggle leaves in place is no catch: an expectation that wants the
    # known verdict itself is not met by that cell alone (its baseline fails the same way) ...
    known_ps1 = load_known(PROFILES["sglang-0.5.23"].known_file)
    alone = _judge(
        [_cell("probe-req-to-token-tree-ps1", "INVARIANT", toggles=["26972"])], device="cpu", known=known_ps1
    )
    checks = [c for c in alone.checks if c.expect.revert == ("26972",) and c.expect.scenario.startswith("probe-req")]
    assert [c.met for c in checks] == [False]
    # ... but by a scenario whose baseline passes and whose revert shows it.
    both = _judge(
        [
            _cell("probe-req-to-token-tree-ps1", "INVARIANT", toggles=["26972"]),
            _cell("probe-req-to-token-tree-paged", "PASS"),
            _cell("probe-req-to-token-tree-paged", "INVARIANT", toggles=["26972"]),
        ],
        device="cpu",
        known=known_ps1,
    )
    checks = [c for c in both.checks if c.expect.revert == ("26972",) and c.expect.scenario.startswith("probe-req")]
    assert [c.met for c in checks] == [True]
    # The same verdict on the CPU is not covered: a host-only path that diverges is new.
    cpu = _judge([_cell("fimla-draft-topk1@cg=eager", "DIVERGE")], device="cpu", known=known)
    assert [s for _, s, _ in _stray(cpu)] == ["fimla-draft-topk1@cg=eager"]
    assert j.known[0].seen_on == ["fimla-draft-topk1@cg=eager"]
    assert j.known[0].known.device == "cuda"
    assert "cuda only" in cpu.known[0].status
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
        import shlex

        argv = shlex.split(k.reproduce)
        if k.versions:  # a bug of older releases: the command names one that has it
            assert argv[1] == "--release" and k.holds_for(argv[2]), k.reproduce
            argv = [argv[0], *argv[3:]]
        assert shlex.join(argv).startswith("sglfix run --profile sglang-0.5.23 -s "), k.reproduce
        glob = argv[argv.index("-s") + 1]
        assert any(fnmatch.fnmatchcase(n, glob) for n in names), k.reproduce  # the command runs something
        assert ("--device cuda" in k.reproduce) == (k.device == "cuda"), k.reproduce
        assert json.dumps(k.model_dump())  # reported as is in the JSON report


def test_an_entry_holds_for_the_versions_that_have_the_bug(tmp_path):
    entries = _entries(
        tmp_path,
        """\
        known_divergences:
          - scenario: probe-req-to-token-chain-paged
            verdict: [INVARIANT]
            versions: "<0.5.16"
            reason: fixed in 0.5.16
            reproduce: sglfix --release 0.5.15 run --profile sglang -s probe-req-to-token-chain-paged --device cpu
    """,
    )
    (entry,) = entries
    assert entry.holds_for("0.5.13") and entry.holds_for("0.5.15.post1")
    assert not entry.holds_for("0.5.16") and not entry.holds_for("0.5.23")
    assert entry.holds_for(None)  # an engine whose version is unknown: every entry
    # Judged where it does not hold, the same baseline is unexpected again.
    cells = [_cell("probe-req-to-token-chain-paged", "INVARIANT")]
    assert _stray(_judge(cells, device="cpu", known=[entry])) == []
    assert _stray(_judge(cells, device="cpu", known=[k for k in entries if k.holds_for("0.5.16")])) == [
        ([], "probe-req-to-token-chain-paged", "INVARIANT")
    ]


def test_a_bad_versions_range_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        _entries(
            tmp_path,
            """\
            known_divergences:
              - scenario: probe-x
                verdict: [INVARIANT]
                versions: "before 0.5.16"
                reason: r
                reproduce: sglfix run -s probe-x
        """,
        )
    assert "versions" in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize("verdict", ["ERROR", "FAULT", "TIMEOUT"])
def test_a_known_divergence_is_not_seen_only_when_its_cell_ran_to_a_verdict(tmp_path, verdict):
    """A baseline cell sglfix could not judge (its probe does not fit the tree, the worker died,
    time ran out) says nothing of the bug: "not judged", never "not seen (fixed?)"."""
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
    hit = _judge([_cell("probe-req-to-token-tree-ps1", verdict)], device="cpu", known=known).known[0]
    assert hit.status == f"not judged: 1 of its 1 cell(s) ran to no verdict ({verdict})", hit.status
    # One cell of the entry's scenarios judged, another not: still not judged.
    both = [_cell("probe-req-to-token-tree-ps1", "PASS"), _cell("probe-req-to-token-tree-ps2", verdict)]
    assert _judge(both, device="cpu", known=known).known[0].status.startswith("not judged: 1 of its 2")


def test_a_versions_range_whose_bounds_cross_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        _entries(
            tmp_path,
            """\
            known_divergences:
              - scenario: probe-x
                verdict: [INVARIANT]
                versions: ">=0.5.16,<0.5.13"
                reason: r
                reproduce: sglfix run -s probe-x
        """,
        )
    assert "no version is in" in str(err.value) and len(str(err.value).splitlines()) == 1
