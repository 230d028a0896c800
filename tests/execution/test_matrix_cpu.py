"""The main job on CPU: every built-in scenario passes at baseline, and every toggle and part,
reverted through SGLANG_DEBUG_REVERT_PR in the worker, gives the verdict its expect names."""

from __future__ import annotations

import json

import pytest
from clihelp import run_cli

from sglfix.toggling.registry import load_registry

# Served cells the run of every cell runs again fresh (--verify-store), drawn at random.
VERIFIED = 40


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def reaching(tmp_path_factory, store):
    """The matrix with reachability (the default): unreached cells are marked, not run. Into an
    empty store: every cell it holds was run here."""
    out = tmp_path_factory.mktemp("matrix") / "reach.json"
    r = run_cli(
        "matrix", "--parts", "--device", "cpu", "--json", str(out), "--cache", str(store), timeout=1800, subprocess=True
    )
    return r, json.loads(out.read_text())


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, store, reaching):
    """Every cell. The cells the reaching run ran are served from its store (a run of every cell
    takes no NOT_REACHED mark from it: those cells run here), and VERIFIED of them, drawn at
    random, run again fresh; a served cell that differs from its fresh run fails the run."""
    out = tmp_path_factory.mktemp("matrix") / "m.json"
    r = run_cli(
        "matrix", "--parts", "--device", "cpu", "--json", str(out), "--no-reachability", "--cache", str(store),
        "--verify-store", str(VERIFIED), timeout=1800, subprocess=True,
    )  # fmt: skip
    return r, json.loads(out.read_text())


def test_reachability_changes_no_verdict(matrix, reaching):
    (r_all, everything), (r_reach, reached) = matrix, reaching
    assert r_reach.code == 0, r_reach.err[-2000:]
    assert r_all.code == 0, r_all.err[-2000:]  # --verify-store: no served cell differs from its fresh run
    full = {c["id"]: c for c in everything["cells"]}
    marked = {c["id"]: c for c in reached["cells"]}
    assert marked.keys() == full.keys()
    unreached = [c for c in marked.values() if c["verdict"] == "NOT_REACHED"]
    assert len(unreached) > len(marked) // 4  # the backends share few target functions
    for cid, c in marked.items():
        if c["verdict"] == "NOT_REACHED":
            # Provably the baseline: run anyway, it gives the baseline's verdict and numbers.
            assert not full[cid].get("stored"), cid  # run by the run of every cell, not served its mark
            same = c["findings"][0]["same_as"]
            base = full[f"baseline::{c['scenario']}"]
            assert full[cid]["verdict"] == same == base["verdict"], (cid, full[cid]["findings"])
            assert full[cid]["error"] == base["error"], cid
            assert c["revert_env"] == ",".join(c["toggles"])  # the set was applied: it would ERROR if it could not
        else:
            # Run once, by the reaching run; VERIFIED of them ran again in the run of every cell.
            assert full[cid].get("stored") and c["verdict"] == full[cid]["verdict"], cid
    assert everything["store"]["verified"] == VERIFIED and everything["store"]["ran"] == len(unreached)
    assert [e["met"] for e in reached["expectations"]] == [e["met"] for e in everything["expectations"]]
    assert reached["stray"] == everything["stray"] == []
    baselines = [c for c in reached["cells"] if not c["toggles"]]
    assert all(isinstance(c["reached"], list) for c in baselines)
    assert everything["kernel_memo"]["hits"] > everything["kernel_memo"]["launches"] // 2


def test_matrix_exits_0_and_baseline_passes(matrix):
    r, data = matrix
    assert r.code == 0, r.out[-3000:] + r.err[-2000:]
    base = [c for c in data["cells"] if not c["toggles"]]
    assert base and all(c["verdict"] == "PASS" for c in base), [c["scenario"] for c in base if c["verdict"] != "PASS"]
    assert not data["stray"]


def test_every_toggle_and_part_is_caught_by_its_expectation(matrix):
    _, data = matrix
    checks = data["expectations"]
    assert checks and all(c["met"] for c in checks), [c for c in checks if not c["met"]]
    caught = {rid for c in checks if c["met"] and set(c["wanted"]) - {"PASS"} for rid in c["revert"]}
    neutral_ok = {
        c["revert"][0]
        for c in checks
        if c["met"] and c["wanted"] == ["PASS"] and c["scenario"] == "*" and len(c["revert"]) == 1
    }
    for toggle in load_registry():
        for rid in toggle.ids[1:]:  # every part, each reverted alone
            if toggle.parts[rid.split(":")[1]].behaviour_neutral:
                # A refactor: reverting it alone must leave every verdict as it is.
                assert rid in neutral_ok, (
                    f"{rid} is declared behaviour-neutral but no PASS-everywhere expectation is met"
                )
                continue
            assert rid in caught or f"{toggle.pr}:{rid.split(':')[1]}" in caught, f"{rid} is caught by no scenario"


def test_reverts_run_through_the_env_variable_in_the_worker(matrix):
    _, data = matrix
    for c in data["cells"]:
        assert c["revert_env"] == (",".join(c["toggles"]) or "0")


def test_divergence_reports_its_size_and_location(matrix):
    _, data = matrix
    cell = next(c for c in data["cells"] if c["toggles"] == ["26651:triton-kv-lens"] and c["verdict"] == "DIVERGE")
    err = cell["error"]
    assert err["max_abs_err"] > 0.1 and err["bad_rows"] > 0 and err["first_bad_request"] is not None
    assert "max abs err" in cell["findings"][0]["message"]
    inv = next(
        c
        for c in data["cells"]
        if c["toggles"] == ["26651:clamp"] and c["scenario"].startswith("triton-draft-extend-v2@cg=graph-padded")
    )
    assert inv["verdict"] == "INVARIANT" and "not monotone" in inv["findings"][0]["message"]
