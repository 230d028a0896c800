"""``sglfix search`` end to end on the reproduction: a revert found from the generic space and
shrunk to a scenario file the matrix runs (failing with the revert, passing without), the same for
the same seed; a budget that finds nothing says so; bad input is one line before any cell."""

from __future__ import annotations

import json

import pytest
import yaml
from clihelp import assert_one_line_error, run_cli

from sglfix.report.search import SearchReport
from sglfix.search.shrink import reductions
from sglfix.search.space import to_scenario

FIND = ["search", "-r", "27460", "--family", "flashinfer_mla", "--mode", "DRAFT_DECODE", "--device", "cpu"]
FIND += ["--examples", "40"]


def test_a_revert_is_found_and_shrunk_to_a_scenario_file_that_shows_it(tmp_path):
    out, report, store = tmp_path / "found.yaml", tmp_path / "search.json", str(tmp_path / "store")
    result = run_cli(*FIND, "--cache", store, "-o", str(out), "--json", str(report), subprocess=True, timeout=300)
    assert result.code == 1, (result.out, result.err)
    data = SearchReport.model_validate(json.loads(report.read_text()))
    assert data.target == "revert" and data.revert == ["27460"] and data.found is not None
    assert data.shrink is not None and data.shrink.minimal
    assert data.shrunk is not None and data.shrunk.verdict == data.found.verdict
    assert data.shrunk.check == data.found.check
    assert 0 < data.tried <= 40 and data.examples_per_s > 0
    assert "smallest: " + data.shrunk.name in result.out
    # The file is a scenario the matrix runs: it fails with the revert and passes without.
    node = yaml.safe_load(out.read_text())
    assert node["name"] == data.shrunk.name
    reverted = run_cli("run", "--scenario-file", str(out), "-r", "27460", "--device", "cpu", "--no-cache")
    assert reverted.code == 1 and data.shrunk.verdict in reverted.out
    plain = run_cli("run", "--scenario-file", str(out), "--device", "cpu", "--no-cache")
    assert plain.code == 0, plain.out
    # No single reduction is smaller and still a scenario: the minimal claim is checked by the run above.
    from sglfix.codebases import get_codebase

    cb = get_codebase("reproduction")
    shrunk = {k: v for k, v in node.items() if k not in ("name", "description")}
    assert to_scenario(shrunk, codebase=cb).name == data.shrunk.name
    assert reductions(shrunk)
    # The same seed, the same search (its cells served by the result store the first one filled).
    again = tmp_path / "again.json"
    run_cli(*FIND, "--cache", store, "--json", str(again), subprocess=True, timeout=300)
    assert json.loads(again.read_text())["shrunk"]["name"] == data.shrunk.name


def test_a_budget_that_finds_nothing_says_so_and_exits_0(tmp_path):
    report = tmp_path / "search.json"
    result = run_cli(
        "search", "--family", "triton", "--mode", "DECODE", "--device", "cpu", "--examples", "8", "--no-cache",
        "--json", str(report), subprocess=True, timeout=300,
    )  # fmt: skip
    assert result.code == 0, (result.out, result.err)
    data = json.loads(report.read_text())
    assert data["found"] is None and data["tried"] == 8 and data["errors"] == []
    assert "nothing found: --examples 8" in result.out


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--family", "flashinfr"], ["--family flashinfr", "did you mean 'flashinfer'"]),
        (["--mode", "verify"], ["--mode verify: no such mode"]),
        (["--target", "revert"], ["--target revert", "--revert IDS"]),
        (["--target", "mutant"], ["--target mutant: give baseline"]),
        (["-r", "99999"], ["99999"]),
        (["-o", "/nonexistent-folder/x.yaml"], ["-o /nonexistent-folder/x.yaml", "does not exist"]),
    ],
)
def test_bad_input_is_one_line_before_any_cell(args, needles):
    assert_one_line_error(run_cli("search", "--device", "cpu", *args), *needles)


def test_a_live_bug_is_found_on_real_sglang_and_named_for_the_known_divergence_its_fix_clears(tmp_path):
    # From the generic space alone: the req_to_token headroom bug at page size 1 with tree drafting.
    report = tmp_path / "search.json"
    result = run_cli(
        "--profile", "sglang-0.5.23", "search", "--family", "probes", "--mode", "DECODE", "--device", "cpu",
        "--examples", "60", "--no-cache", "--json", str(report), subprocess=True, timeout=300,
    )  # fmt: skip
    assert result.code == 1, (result.out, result.err)
    data = json.loads(report.read_text())
    shrunk = data["shrunk"]
    assert shrunk["verdict"] == "INVARIANT" and shrunk["node"]["probe"] == "req-to-token-headroom"
    assert shrunk["node"]["page_size"] == 1 and shrunk["node"]["spec"]["topk"] > 1
    assert data["known"] == "probe-req-to-token-tree-ps1 (fixes/req-to-token-headroom-ps1.patch clears it)"
    assert "known divergence probe-req-to-token-tree-ps1" in result.out
