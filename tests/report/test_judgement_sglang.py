"""The judgement on real sglang 0.5.23 on a CPU box, where the TRTLLM-MLA scenarios SKIP (their
kernel needs a GPU) and the baseline shows a known upstream divergence
(probe-req-to-token-tree-ps1): the matrix's summary and bisect read both as the one rule says."""

from __future__ import annotations

import json

from clihelp import run_cli
from real_sglang import clean_env, require_sglang

SCENARIOS = ("-s", "trtllm-draft-extend@*", "-s", "probe-req-to-token-tree-ps1", "-s", "probe-req-to-token-tree-paged")


def test_the_profile_matrix_summary_counts_cuda_only_expectations_and_names_skip_and_baseline_verdicts(tmp_path):
    require_sglang()
    out = tmp_path / "m.json"
    r = run_cli(
        "--profile", "sglang-0.5.23", "matrix", *SCENARIOS, "--device", "cpu", "--json", str(out),
        env=clean_env(), timeout=900, subprocess=True,
    )  # fmt: skip
    assert r.code == 0, r.out[-4000:] + r.err[-3000:]
    lines = r.out.splitlines()
    last = lines[-1]
    data = json.loads(out.read_text())
    cuda_only = [n for n in data["not_checked"] if n["reason"] == "cuda only"]
    assert cuda_only and all(n["device"] == "cuda" for n in cuda_only)
    assert f"{len(cuda_only)} cuda only" in last and "gate passed" in last, last
    # 21987's scenarios all SKIP on CPU: said so, not "not reached".
    (line,) = [x for x in lines if x.startswith("21987: ")]
    assert "SKIP on this device" in line and "not reached: these scenarios" not in line, line
    # 26972 changes the paged probe; on ps1 its cell shows the baseline's own (known) INVARIANT.
    (line,) = [x for x in lines if x.startswith("26972: ")]
    assert "(1 INVARIANT" in line and "probe-req-to-token-tree-paged" in line, line
    assert "probe-req-to-token-tree-ps1 (" not in line, line
    meanings = {c["id"]: c["meaning"] for c in data["cells"]}
    assert meanings["26972::probe-req-to-token-tree-ps1"] == "known"
    assert meanings["baseline::trtllm-draft-extend@ps=32,cg=graph"] == "skipped"


def test_bisect_on_real_sglang_leaves_out_skip_scenarios_and_known_divergences(tmp_path):
    require_sglang()
    out = tmp_path / "b.json"
    r = run_cli(
        "--profile", "sglang-0.5.23", "bisect", "-r", "26972", "-r", "26329", *SCENARIOS, "--device", "cpu",
        "--json", str(out), env=clean_env(), timeout=900, subprocess=True,
    )  # fmt: skip
    # It searches (no refusal of the baseline) and finds 26972 on the paged probe only.
    assert r.code == 1, r.out[-4000:] + r.err[-3000:]
    assert "SKIP here, left out" in r.err and "known divergence in the baseline" in r.err, r.err
    data = json.loads(out.read_text())
    assert [c["ids"] for c in data["culprits"]] == [["26972"]], data["culprits"]
    assert data["culprits"][0]["scenarios"] == ["probe-req-to-token-tree-paged"]
    assert len(data["left_out"]["skip"]) == 6 and data["left_out"]["known"] == ["probe-req-to-token-tree-ps1"]
