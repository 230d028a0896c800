"""A candidate fix on real sglang 0.5.23 (CPU): the profile's fix for the live req_to_token headroom
bug clears its known divergence, as run, with a revert, and in a plain process through
``SGLFIX_APPLY``; the profile keeps it and the doctor checks it still applies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clihelp import assert_one_line_error, run_cli
from real_sglang import clean_env, require_sglang

from sglfix.toggling.profiles import PROFILES

PROFILE = PROFILES["sglang-0.5.23"]
FIX = f"{PROFILE.folder}/fixes/req-to-token-headroom-ps1.patch"
PROBES = ("--profile", "sglang-0.5.23", "run", "-s", "probe-req-to-token-*", "--device", "cpu")


def test_the_profiles_fix_clears_its_known_divergence_and_changes_nothing_else(tmp_path):
    require_sglang()
    out = tmp_path / "r.json"
    r = run_cli(
        *PROBES, "--apply", FIX, "--expect-fixes", "probe-req-to-token-tree-ps1", "--json", str(out),
        env=clean_env(), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    cells = {c["id"]: c for c in json.loads(out.read_text())["cells"]}
    before = cells["baseline::probe-req-to-token-tree-ps1"]
    after = cells["+req-to-token-headroom-ps1::probe-req-to-token-tree-ps1"]
    assert (before["verdict"], before["meaning"]) == ("INVARIANT", "known")
    assert (after["verdict"], after["meaning"]) == ("PASS", "fixed")
    assert "fixes known divergence probe-req-to-token-tree-ps1" in after["why"]
    for name in ("probe-req-to-token-tree-paged", "probe-req-to-token-chain-paged"):
        assert (
            cells[f"baseline::{name}"]["verdict"] == cells[f"+req-to-token-headroom-ps1::{name}"]["verdict"] == "PASS"
        )
    last = r.out.splitlines()[-1]
    assert "fixes known divergence probe-req-to-token-tree-ps1; breaks nothing" in last, last
    assert "--expect-fixes probe-req-to-token-tree-ps1: met" in last, last


def test_with_the_revert_of_the_widening_the_fix_cannot_clear_it_and_the_gate_says_so(tmp_path):
    require_sglang()
    out = tmp_path / "r.json"
    r = run_cli(
        *PROBES, "-r", "26972", "--apply", FIX, "--expect-fixes", "probe-req-to-token-tree-ps1", "--json", str(out),
        env=clean_env(), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 1, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    (check,) = data["judged"]["fix_checks"]
    assert check["met"] is False and "still INVARIANT with the fix" in check["why"]
    cell = {c["id"]: c for c in data["cells"]}["+req-to-token-headroom-ps1,26972::probe-req-to-token-tree-ps1"]
    assert cell["verdict"] == "INVARIANT" and cell["meaning"] == "known"


def test_a_fix_for_another_version_is_refused_before_any_cell(tmp_path):
    require_sglang()
    stale = tmp_path / "stale.patch"
    text = Path(FIX).read_text()
    stale.write_text(text.replace("SpeculativeAlgorithm.from_string(", "SpeculativeAlgorithm.parse("))
    assert stale.read_text() != text
    r = run_cli(*PROBES, "--apply", str(stale), env=clean_env(), timeout=120, subprocess=True)
    assert_one_line_error(r, f"--apply {stale}", "does not apply to the installed code")


def test_the_doctor_checks_the_profiles_fixes():
    require_sglang()
    r = run_cli("--profile", "sglang-0.5.23", "doctor", env=clean_env(), timeout=600, subprocess=True)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    line = next(x for x in r.out.splitlines() if "req-to-token-headroom-ps1.patch" in x)
    assert line.startswith("ok") and "clears probe-req-to-token-tree-ps1" in line, line


def test_sglfix_apply_in_a_plain_process_patches_real_sglang(tmp_path):
    require_sglang()
    env = clean_env()
    env.update(SGLFIX_APPLY=FIX, TRITON_INTERPRET="1")
    code = (
        "import sglfix; import sglang.srt.mem_cache.allocation_sizing as a; "
        "print(sglfix.reverted_ids(), 'is_eagle' in a.get_req_to_token_extra_context_len.__code__.co_names)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "['+req-to-token-headroom-ps1'] True", r.stdout
