"""``sglfix report finding``: one cell written up as an upstream issue needs it, from a report,
with the functions of the code base the cell ran (run again here), on the reproduction and on real
sglang (where the profile's candidate fix that clears the finding is part of it)."""

from __future__ import annotations

from clihelp import assert_one_line_error, run_cli
from real_sglang import clean_env, require_sglang

NAME = "triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off"


def test_a_reproduction_finding_names_the_scenario_the_command_and_the_code_it_ran(tmp_path):
    report = tmp_path / "r.json"
    r = run_cli("run", "-s", NAME, "--device", "cpu", "-r", "26651:clamp", "--json", str(report), timeout=600)
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    md = tmp_path / "f.md"
    f = run_cli("report", "finding", str(report), f"26651:clamp::{NAME}", "-o", str(md), timeout=600)
    assert f.code == 0, f.out[-2000:] + f.err[-2000:]
    text = md.read_text()
    assert text.startswith(f"# {NAME}: INVARIANT\n")
    assert f"sglfix --profile reproduction run -s {NAME} --device cpu -r 26651:clamp" in text
    assert "```yaml\nname: triton-draft-extend-v2\n" in text
    assert "grid point `cg=graph,builder=kit,gpu_only=off`" in text
    # The reverted function ran, and the table says where it is defined.
    row = next(
        line for line in text.splitlines() if "TritonAttnBackend.init_forward_metadata_replay_cuda_graph`" in line
    )
    assert "srt/layers/attention/triton_backend.py:" in row
    assert "## A candidate fix" not in text  # the reproduction keeps none for this


def test_without_a_rerun_it_says_the_functions_are_not_listed(tmp_path):
    report = tmp_path / "r.json"
    run_cli("run", "-s", NAME, "--device", "cpu", "-r", "26651:clamp", "--json", str(report), timeout=600)
    f = run_cli("report", "finding", str(report), f"26651:clamp::{NAME}", "--no-rerun", timeout=120)
    assert f.code == 0, f.err
    assert "Not run again here (--no-rerun)" in f.out and "| function | defined at |" not in f.out


def test_a_cell_the_report_lacks_is_one_line_with_the_nearest(tmp_path):
    report = tmp_path / "r.json"
    run_cli("run", "-s", NAME, "--device", "cpu", "--json", str(report), timeout=600)
    f = run_cli("report", "finding", str(report), f"basline::{NAME}", timeout=60)
    assert_one_line_error(f, "has no cell", "did you mean", f"baseline::{NAME}")


def test_the_sglang_finding_carries_the_profiles_fix(tmp_path):
    require_sglang()
    report = tmp_path / "r.json"
    env = clean_env()
    run_cli(
        "--profile", "sglang-0.5.23", "run", "-s", "probe-req-to-token-tree-ps1", "--device", "cpu", "--json",
        str(report), env=env, timeout=600,
    )  # fmt: skip
    f = run_cli("report", "finding", str(report), "baseline::probe-req-to-token-tree-ps1", env=env, timeout=600)
    assert f.code == 0, f.err[-2000:]
    text = f.out
    assert "- code base: sglang 0.5.23" in text
    assert "widens a request's req_to_token row only for page_size > 1" in text  # the known entry's reason
    assert "`sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len` | " in text
    assert "sglang/srt/mem_cache/allocation_sizing.py:" in text
    assert "--apply profiles/sglang-0.5.23/fixes/req-to-token-headroom-ps1.patch" in text or "--apply " in text
    assert "+        if page_size > 1 or spec_algo.is_uno() or spec_algo.is_eagle():" in text
