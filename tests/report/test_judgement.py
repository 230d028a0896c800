"""What a cell means is decided once (sglfix.report.outcome) and every consumer reads it: the
comparison, the gates, run's exit code, bisect, JUnit and Markdown agree, and none of them
blames a toggle for its baseline's own verdict, a known divergence, or a cell that could not run."""

from __future__ import annotations

import json
import shutil

from builders import ROOT
from clihelp import assert_one_line_error, run_cli

RESULTS = ROOT / "bench" / "results"
GLUE = "triton-draft-extend-v2@cg=eager,builder=glue,gpu_only=off"


def _cell(scenario, toggles=(), verdict="PASS", *, device="cpu", same_as=None, figure=""):
    findings = []
    if verdict == "NOT_REACHED":
        findings = [{"verdict": "NOT_REACHED", "message": "not reached", "same_as": same_as or "PASS"}]
    elif verdict != "PASS":
        findings = [{"verdict": verdict, "message": figure or f"{verdict.lower()} here"}]
    label = ",".join(toggles) or "baseline"
    return {
        "id": f"{label}::{scenario}",
        "scenario": scenario,
        "toggles": list(toggles),
        "device": device,
        "verdict": verdict,
        "findings": findings,
        "error": None,
        "timings_ms": {"total": 1.0},
    }


def _report(*cells, device="cpu", codebase=None, **extra):
    report = {
        "tool": "sglfix",
        "schema": 2,
        "command": "sglfix matrix",
        "device": device,
        "device_name": device,
        "env_revert": None,
        "wall_s": 1.0,
        "cells": list(cells),
        "expectations": [],
        "stray": [],
        "not_run": [],
        "known_divergences": [],
    }
    if codebase is not None:
        report["codebase"] = codebase
    report.update(extra)
    return report


def _write(tmp_path, name, report) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return str(path)


# -- report compare ---------------------------------------------------------------------------


def test_compare_reads_a_not_reached_cell_as_its_baselines_verdict(tmp_path):
    # The committed CPU matrix without reachability and the same matrix with it: every PASS ->
    # NOT_REACHED cell stands for its baseline's PASS, so nothing changed.
    r = run_cli("report", "compare", str(RESULTS / "matrix-cpu.json"), str(RESULTS / "matrix-cpu-reach.json"))
    assert r.code == 0, r.out[-3000:] + r.err
    assert "0 changed" in r.out
    # A run report against a matrix report of the same cells: the same rule.
    old = _report(_cell("s", ()), _cell("s", ("1",), "PASS"), _cell("t", ("1",), "DIVERGE"))
    new = _report(
        _cell("s", ("1",), "NOT_REACHED", same_as="PASS"), _cell("t", ("1",), "DIVERGE"), command="sglfix run"
    )
    assert run_cli("report", "compare", _write(tmp_path, "a.json", old), _write(tmp_path, "b.json", new)).code == 0
    # A cell that stands for another verdict now is a change, shown with what it stands for.
    new = _report(_cell("s", ("1",), "NOT_REACHED", same_as="CRASH"), _cell("t", ("1",), "DIVERGE"))
    r = run_cli("report", "compare", str(tmp_path / "a.json"), _write(tmp_path, "c.json", new))
    assert r.code == 1 and "1 changed" in r.out and "NOT_REACHED (= CRASH)" in r.out, r.out


def test_compare_counts_a_cell_skipped_on_one_side_apart(tmp_path):
    # The TRTLLM-MLA cells SKIP on CPU and run on a GPU: not a changed verdict, named apart.
    cpu = _report(_cell("g", (), "SKIP"), _cell("g", ("1",), "NOT_REACHED", same_as="SKIP"), _cell("s"))
    gpu = _report(_cell("g"), _cell("g", ("1",), "DIVERGE"), _cell("s"), device="cuda")
    a, b = _write(tmp_path, "cpu.json", cpu), _write(tmp_path, "gpu.json", gpu)
    r = run_cli("report", "compare", a, b, "--json", str(tmp_path / "c.json"))
    assert r.code == 0, r.out
    assert "1 same verdict, 0 changed, 2 skipped on one side only" in r.out, r.out
    data = json.loads((tmp_path / "c.json").read_text())
    assert [c["id"] for c in data["skipped_on_one_side"]] == ["baseline::g", "1::g"]
    assert run_cli("report", "compare", a, b, "--strict").code == 1


def test_compare_refuses_reports_of_two_code_bases_unless_asked(tmp_path):
    repro = {"name": "reproduction", "distribution": None, "version": "0.1.0", "path": "/x/backends"}
    real = {"name": "sglang-0.5.23", "distribution": "sglang", "version": "0.5.23", "path": "/x/sglang"}
    older = {**real, "name": "sglang-0.5.21", "version": "0.5.21"}
    a = _write(tmp_path, "a.json", _report(_cell("s"), codebase=repro))
    b = _write(tmp_path, "b.json", _report(_cell("s"), codebase=real))
    c = _write(tmp_path, "c.json", _report(_cell("s"), codebase=older))
    assert_one_line_error(run_cli("report", "compare", a, b), "different code bases", "--across-codebases")
    assert_one_line_error(run_cli("report", "compare", c, b), "sglang 0.5.21", "sglang 0.5.23")
    r = run_cli("report", "compare", a, b, "--across-codebases")
    assert r.code == 0 and "across code bases, as asked: built-in reproduction vs sglang 0.5.23" in r.out, r.out
    assert run_cli("report", "compare", b, b).code == 0


# -- the judgement itself ---------------------------------------------------------------------


def test_a_toggle_cell_showing_its_baselines_verdict_is_never_its_finding_nor_meets_an_expectation():
    from sglfix.report.outcome import Expect, Meaning, judge

    e = Expect(toggle="1", revert=("1",), scenario="s*", wanted=("DIVERGE",))
    j = judge(
        _report(_cell("s1", (), "DIVERGE"), _cell("s1", ("1",), "DIVERGE"), _cell("s2"), _cell("s2", ("1",))),
        mode="gate",
        expects=[e],
    )
    meanings = {c.id: c.meaning for c in j.cells}
    assert meanings["baseline::s1"] is Meaning.UNEXPECTED  # the baseline must pass
    assert [c.met for c in j.checks] == [False]  # failing both ways proves nothing
    assert meanings["1::s1"] is Meaning.UNMET  # the unmet expectation's cell
    cells = [_cell("s1", (), "DIVERGE"), _cell("s1", ("1",), "DIVERGE"), _cell("t", ("1",), "CRASH")]
    for mode in ("gate", "findings"):
        alone = {c.id: c.meaning for c in judge(_report(*cells), mode=mode).cells}
        assert alone["1::s1"] is Meaning.SAME_AS_BASELINE, mode
        assert alone["1::t"] is (Meaning.UNEXPECTED if mode == "gate" else Meaning.FAILED)
    assert j.failed and "1 expectation(s) unmet" in j.outcome()
    # Caught: passes at baseline, diverges reverted.
    j = judge(_report(_cell("s1"), _cell("s1", ("1",), "DIVERGE")), mode="gate", expects=[e])
    assert [c.met for c in j.checks] == [True] and not j.failed and j.cells[1].meaning is Meaning.EXPECTED


def test_expectations_not_checked_are_counted_with_their_reason():
    from sglfix.report.outcome import Expect, judge

    rows = [
        Expect(toggle="1", revert=("1",), scenario="g*", wanted=("DIVERGE",), device="cuda"),
        Expect(toggle="1", revert=("1:a",), scenario="s*", wanted=("DIVERGE",)),
        Expect(toggle="1", revert=("1",), scenario="nothing*", wanted=("DIVERGE",)),
        Expect(toggle="1", revert=("1",), scenario="k*", wanted=("DIVERGE",)),
        Expect(toggle="1", revert=("1",), scenario="s*", wanted=("DIVERGE",)),
    ]
    cells = [_cell("s1"), _cell("s1", ("1",), "DIVERGE"), _cell("k1", (), "SKIP"), _cell("k1", ("1",), "SKIP")]
    j = judge(_report(*cells), mode="gate", expects=rows)
    reasons = [n.reason for n in j.not_checked]
    assert reasons == [
        "cuda only",
        "part-level: run with --parts",
        "none of the selected scenarios matches",
        "every scenario it names SKIPs here",
    ]
    assert len(j.checks) == 1 and j.checks[0].met and not j.failed
    assert "4 not checked" in j.outcome() and "1 cuda only" in j.outcome()
    # With the environment's set as the baseline, no expectation is checked, each counted.
    env = judge(
        _report(*[{**c, "toggles": ["9", *c["toggles"]]} for c in cells]), mode="gate", expects=rows, base=("9",)
    )
    assert len(env.not_checked) == len(rows) and not env.checks
    assert env.outcome().startswith("baseline SGLANG_DEBUG_REVERT_PR=9 (not the code as installed): ")


def test_one_gate_rule_for_the_exit_code_junit_markdown_and_merge(tmp_path):
    """The matrix's gate (exit code), JUnit's failures, the Markdown's gate line and `report
    merge --gate` all say what the one judgement says, on reports that pass and that fail."""
    from sglfix.report.junit import build_junit
    from sglfix.report.markdown import render_markdown
    from sglfix.report.outcome import Expect, Known, judge

    e = Expect(toggle="1", revert=("1",), scenario="s*", wanted=("DIVERGE",))
    known = Known(scenario="k", verdict=("INVARIANT",), reason="upstream", reproduce="sglfix run -s k")
    cases = {
        "passing": [
            _cell("s"),
            _cell("s", ("1",), "DIVERGE"),
            _cell("k", (), "INVARIANT"),
            _cell("k", ("1",), "INVARIANT"),
        ],
        "unmet": [_cell("s"), _cell("s", ("1",))],
        "stray": [_cell("s"), _cell("s", ("1",), "DIVERGE"), _cell("t"), _cell("t", ("1",), "CRASH")],
        "baseline": [_cell("s", (), "CRASH"), _cell("s", ("1",), "CRASH")],
        "error": [_cell("s"), _cell("s", ("1",), "ERROR")],
    }
    for name, cells in cases.items():
        report = _report(*cells)
        j = judge(report, mode="gate", expects=[e], known=[known])
        j.annotate(report)
        failing_cases = sum(1 for suite in build_junit(report) for case in suite if case.result and not case.is_skipped)
        assert bool(failing_cases) == j.failed, name
        md = render_markdown(report)
        assert ("**Gate: FAILED**" in md) == j.failed, name
        path = _write(tmp_path, f"{name}.json", report)
        r = run_cli("report", "merge", path, "-o", str(tmp_path / f"{name}-m.json"), "--gate")
        assert r.code == (1 if j.failed else 0), (name, r.out, r.err)
        assert json.loads((tmp_path / f"{name}-m.json").read_text())["judged"]["passed"] == (not j.failed)
    passing = judge(_report(*cases["passing"]), mode="gate", expects=[e], known=[known])
    assert {c.id: c.meaning.value for c in passing.cells}["1::k"] == "known"
    assert [h.status for h in passing.known] == ["seen"]


# -- matrix and run on the command line -------------------------------------------------------


def test_a_baseline_from_the_environment_is_refused_or_named_and_judged(tmp_path):
    from sglfix.report.outcome import Expect

    env = {"SGLANG_DEBUG_REVERT_PR": "26738:overlap-guard"}
    assert_one_line_error(
        run_cli("matrix", "-s", GLUE, "--device", "cpu", env=env),
        "SGLANG_DEBUG_REVERT_PR=26738:overlap-guard",
        "--env-baseline",
    )
    assert_one_line_error(
        run_cli("bisect", "-s", GLUE, "--device", "cpu", env=env), "SGLANG_DEBUG_REVERT_PR", "--env-baseline"
    )
    out = tmp_path / "m.json"
    r = run_cli(
        "matrix",
        "-s",
        GLUE,
        "--device",
        "cpu",
        "--env-baseline",
        "--json",
        str(out),
        env=env,
        timeout=300,
        subprocess=True,
    )
    # Its baseline crashes: the gate tested that and fails; it never passes on "0 of 0".
    assert r.code == 1, r.out[-3000:] + r.err[-3000:]
    last = r.out.strip().splitlines()[-1]
    assert "baseline SGLANG_DEBUG_REVERT_PR=26738:overlap-guard (not the code as installed)" in last, last
    assert "gate failed" in last and "unexpected verdict" in last, last
    from sglfix.toggling.profiles import get_profile
    from sglfix.toggling.registry import load_registry

    rows = Expect.of_registry(load_registry(get_profile("reproduction").toggles_dir))
    data = json.loads(out.read_text())
    assert len(data["not_checked"]) == len(rows) > 60
    assert data["judged"]["baseline"] == ["26738:overlap-guard"]


def test_bisect_checks_every_revert_applies_before_any_worker(tmp_path):
    from sglfix.toggling.profiles import get_profile

    toggles = tmp_path / "toggles"
    shutil.copytree(get_profile("reproduction").toggles_dir, toggles)
    f = toggles / "26738.yaml"
    text = f.read_text()
    assert "getattr(b, " in text
    f.write_text(text.replace("getattr(b, ", "getattr(bb, ", 1))
    r = run_cli("--toggles", str(toggles), "bisect", "-r", "26738", "-s", GLUE, "--device", "cpu")
    assert_one_line_error(r, "26738")
    assert "bisect [" not in r.err  # no cell ran


def test_a_bisect_culprits_figure_is_that_of_a_cell_with_its_verdict(tmp_path):
    out = tmp_path / "b.json"
    r = run_cli(
        "bisect", "-r", "21987:no-cpu-fast-path", "-s", "trtllm-draft-extend-gpu-only@*", "--device", "cpu",
        "--json", str(out), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 1, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    (culprit,) = data["culprits"]
    assert culprit["verdict"] == "INVARIANT" and culprit["key_scenario"] in culprit["scenarios"], culprit
    # The same cell run alone: its INVARIANT finding is the figure the culprit shows, and the
    # culprit's scenarios also hold a DIVERGE cell, whose figure it must not borrow.
    run = tmp_path / "r.json"
    r = run_cli(
        "run", "-r", "21987:no-cpu-fast-path", "-s", "trtllm-draft-extend-gpu-only@*", "--device", "cpu",
        "--json", str(run), timeout=600, subprocess=True,
    )  # fmt: skip
    cells = {c["scenario"]: c for c in json.loads(run.read_text())["cells"]}
    assert "DIVERGE" in {c["verdict"] for c in cells.values()}
    shown = cells[culprit["key_scenario"]]
    assert shown["verdict"] == "INVARIANT"
    assert culprit["key_figure"] == next(f["message"] for f in shown["findings"] if f["verdict"] == "INVARIANT")


def test_run_applies_the_profiles_known_divergences_as_the_matrix_does(tmp_path):
    from real_sglang import clean_env, require_sglang

    require_sglang()
    out = tmp_path / "r.json"
    r = run_cli(
        "--profile", "sglang-0.5.23", "run", "--revert", "26738", "-s", "probe-req-to-token-tree-ps1",
        "--device", "cpu", "--json", str(out), env=clean_env(), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    (cell,) = data["cells"]
    assert cell["verdict"] == "INVARIANT" and cell["meaning"] == "known", cell.get("why")
    assert [k["scenario"] for k in data["known_divergences"]][:1] == ["probe-req-to-token-tree-ps1"]
    assert "INVARIANT (known)" in r.out and "known probe-req-to-token-tree-ps1" in r.out
    assert "1 known divergence" in r.out.strip().splitlines()[-1]


def test_the_meaning_of_a_cell_is_decided_in_one_module():
    """No other module of sglfix reads what a verdict stands for or matches expectations and known
    divergences itself: they read sglfix.report.outcome (a second matcher is how the gate, the
    comparison and the merge came to disagree)."""
    import ast

    pkg = ROOT / "sglfix"
    home = pkg / "report" / "outcome.py"
    rules = {"stands_for", "match_known", "check_expectations", "gate_failures", "known_hits"}
    offenders = []
    for path in pkg.rglob("*.py"):
        if path == home or path == pkg / "common" / "verdicts.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            elif isinstance(node, ast.FunctionDef | ast.ImportFrom):
                names = [node.name] if isinstance(node, ast.FunctionDef) else [a.name for a in node.names]
                name = next((n for n in names if n in rules), None)
            if name in rules:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not offenders, offenders
    # And the judgement is a leaf: outcome.py and the parts it is made of import nothing of sglfix
    # but sglfix.common and each other (absolute imports only: a relative one would hide an arrow).
    parts = {"outcome", "claim", "meaning", "expectations", "context", "codebase"}
    allowed = ("sglfix.common",) + tuple(f"sglfix.report.{p}" for p in parts)
    for part in sorted(parts):
        imports = [
            "." * n.level + (n.module or "")
            for n in ast.walk(ast.parse((pkg / "report" / f"{part}.py").read_text()))
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("sglfix"))
        ]
        assert all(m.startswith(allowed) for m in imports), (part, imports)


def test_a_candidate_fix_is_judged_cell_by_cell_against_the_same_cell_without_it():
    from sglfix.report.outcome import Known, Meaning, judge

    report = _report(
        _cell("ps1", (), "INVARIANT"),
        _cell("ps1", ("+fix",), "PASS"),
        _cell("other", (), "PASS"),
        _cell("other", ("+fix",), "DIVERGE"),
        _cell("wide", (), "PASS"),
        _cell("wide", ("27545",), "DIVERGE"),
        _cell("wide", ("+fix", "27545"), "NAN"),
        _cell("new", (), "DIVERGE"),
        _cell("new", ("+fix",), "PASS"),
    )
    known = [Known("ps1", ("INVARIANT",))]
    j = judge(report, mode="findings", known=known, fixes=["+fix"], expect_fixes=["ps1", "other"])
    m = {c.id: c for c in j.cells}
    assert m["+fix::ps1"].meaning is Meaning.FIXED and "fixes known divergence ps1" in m["+fix::ps1"].why
    assert m["baseline::ps1"].meaning is Meaning.KNOWN
    # What the fix breaks fails; a cell failing either way (garbage read) fails nothing.
    assert m["+fix::other"].meaning is Meaning.BROKEN and "changes PASS to DIVERGE" in m["+fix::other"].why
    assert m["+fix,27545::wide"].meaning is Meaning.CHANGED and not m["+fix,27545::wide"].meaning.fails
    # A failure of the code without the fix that the fix clears is what the fix is for.
    assert m["baseline::new"].meaning is Meaning.CLEARED and m["+fix::new"].meaning is Meaning.FIXED
    checks = {c.pattern: c for c in j.fix_checks}
    assert checks["ps1"].met and not checks["other"].met
    assert j.failed and j.exit_code == 1
    assert "1 cell(s) broken by +fix" in j.outcome() and "--expect-fixes other" in j.outcome()
    # Without the breaking cell, the unmet pattern and the run's own reverted cell (a run fails on
    # the revert it was asked for), the same judgement passes.
    ok = judge(
        _report(*[c for c in report["cells"] if c["scenario"] != "other" and "27545" not in c["toggles"]]),
        mode="findings",
        known=known,
        fixes=["+fix"],
        expect_fixes=["ps1"],
    )
    assert not ok.failed, ok.outcome()


def test_a_divergence_moved_to_other_rows_is_a_change_the_same_rows_are_not():
    from sglfix.report.outcome import Known, Meaning, divergence_moved, judge

    def diverging(scenario, toggles, at):
        cell = _cell(scenario, toggles, "DIVERGE")
        cell["findings"][0]["bad_at"] = at
        return cell

    report = _report(
        diverging("swa", (), "1-2"),
        diverging("swa", ("+m-moved",), "0-2"),
        diverging("swa", ("+m-same",), "1-2"),
        _cell("swa", ("+m-norows",), "DIVERGE"),  # an older report: no rows recorded
    )
    j = judge(report, mode="findings", known=[Known("swa", ("DIVERGE",))], fixes=["+m-moved", "+m-same", "+m-norows"])
    m = {c.id: c for c in j.cells}
    assert m["+m-moved::swa"].meaning is Meaning.CHANGED
    assert "rows 1-2 without, rows 0-2 with" in m["+m-moved::swa"].why
    assert m["+m-same::swa"].meaning is Meaning.KNOWN
    assert m["+m-norows::swa"].meaning is Meaning.KNOWN
    assert divergence_moved(report["cells"][1], report["cells"][0]) == "rows 1-2 without, rows 0-2 with"
    assert divergence_moved(report["cells"][2], report["cells"][0]) is None


def test_a_known_failure_that_fails_another_check_is_a_change_other_figures_are_not():
    from sglfix.report.outcome import Known, Meaning, fails_otherwise, judge

    past_row = "1/3 requests need KV positions past their req_to_token row: request 0 needs up to 277"
    base = _cell("tree", (), "INVARIANT", figure=past_row)
    more = _cell("tree", ("+m-short",), "INVARIANT", figure=past_row.replace("277", "265"))
    more["findings"].append({"verdict": "INVARIANT", "message": "request 0's allocation ends at 265, short of 277"})
    figures = _cell("tree", ("+m-figures",), "INVARIANT", figure=past_row.replace("277", "281"))
    fewer = _cell("tree", ("+m-fewer",), "INVARIANT", figure="the decode write spilled past a row")
    report = _report(base, more, figures, fewer)
    j = judge(
        report, mode="findings", known=[Known("tree", ("INVARIANT",))], fixes=["+m-short", "+m-figures", "+m-fewer"]
    )
    m = {c.id: c for c in j.cells}
    assert m["+m-short::tree"].meaning is Meaning.CHANGED
    assert "another check fails: INVARIANT: request N's allocation ends at N, short of N" in m["+m-short::tree"].why
    # The same check at other figures is the same failure: the bug's cell, not the change's.
    assert m["+m-figures::tree"].meaning is Meaning.KNOWN
    assert m["+m-fewer::tree"].meaning is Meaning.CHANGED
    assert fails_otherwise(figures, base) is None
    assert fails_otherwise(base, more).startswith("a check no longer fails")
    # Not reached: the cell is its baseline, whatever checks it did not record.
    assert fails_otherwise(_cell("tree", ("+m-away",), "NOT_REACHED", same_as="INVARIANT"), base) is None


def test_the_comparison_names_the_rows_it_found_wrong():
    import torch

    from sglfix.harness.reference import compare_outputs, row_ranges

    assert row_ranges([]) == "" and row_ranges([0, 1, 2, 5]) == "0-2,5" and row_ranges([0, 2, 3, 4, 9]) == "0,2-4,9"
    ref = torch.zeros(2, 3, 1, 4)
    q_valid = torch.tensor([[True, True, True], [True, True, False]])
    out = torch.zeros(5, 1, 4)
    out[1] += 1.0
    out[3:] += 1.0
    cmp = compare_outputs(out=out, ref=ref, q_valid=q_valid, tolerance=1e-3)
    assert cmp.bad_rows == 3 and cmp.to_json()["bad_at"] == "1,3-4"
