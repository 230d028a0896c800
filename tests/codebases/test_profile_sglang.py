"""The ``sglang-0.5.23`` profile against the real sglang 0.5.23 wheel (downloaded: network).

``sglfix doctor --profile sglang-0.5.23 --source DIR`` applies every toggle and part to the
wheel's source files without importing sglang; sglang's own four working reverts are carried
as they are, the two it registers dead (27338, 27460) are repaired.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sglang_wheel as sw
import yaml
from builders import ROOT

pytestmark = pytest.mark.network

PROFILE = ROOT / "profiles" / "sglang-0.5.23"
SEED = {26651, 26738, 26239, 27460, 21987}
SGLANG_OWN = {25015, 26329, 26972, 27360, 27338, 27460}
# Merged fixes present in 0.5.23 that the profile adds (toggles sglfix writes, not sglang).
ADDED = {27545, 26880, 29858, 26513, 35424, 28221, 33127, 32288}
AS_IS = {25015, 26329, 26972, 27360}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    try:
        wheel = sw.fetch_wheel()
    except sw.WheelFetchError as exc:
        pytest.fail(str(exc), pytrace=False)
    dest = tmp_path_factory.mktemp("sglang-0.5.23")
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("sglang/") and name.endswith(".py"):
                zf.extract(name, dest)
    return dest


def _doctor(*args: str, before: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLFIX_TOGGLES_DIR", "SGLFIX_PROFILE", "SGLANG_DEBUG_REVERT_PR")
    }
    return subprocess.run(
        [sys.executable, "-m", "sglfix", *before, "doctor", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_doctor_passes_on_the_real_wheel_and_names_every_toggle(source):
    r = _doctor("--profile", "sglang-0.5.23", "--source", str(source), "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["mode"] == "static"
    whole = {int(c["id"]) for c in report["toggles"] if c["id"].isdigit()}
    assert whole == SEED | SGLANG_OWN | ADDED and len(whole) == len(SEED | SGLANG_OWN | ADDED)
    applies = [c for c in report["toggles"] if not c["id"].endswith(" expect")]
    assert all(c["targets"] and all(t.startswith("sglang.") for t in c["targets"]) for c in applies)
    # Every expectation of the profile is checked too, against its built-in scenarios.
    assert report["expectations_checked"] > 0 and "sglang-0.5.23" in report["expectations_against"]
    assert all(c["ok"] for c in report["toggles"] if c["id"].endswith(" expect"))
    plain = _doctor("--source", str(source), "--profile", "sglang-0.5.23")  # --profile after the command too
    assert plain.returncode == 0 and all(str(pr) in plain.stdout for pr in whole)


def test_sglang_own_reverts_are_carried_as_they_are_or_repaired(source):
    own = sw.parse_revert_yamls((source / sw.TOGGLE_MODULE).read_text())
    assert set(own) == SGLANG_OWN
    for pr in AS_IS:
        toggle = yaml.safe_load((PROFILE / f"{pr}.yaml").read_text())
        patches = toggle.get("patches") or [p for part in toggle["parts"].values() for p in part["patches"]]
        assert patches == yaml.safe_load(own[pr])["patches"], pr
    for pr in SGLANG_OWN - AS_IS:  # repaired: the same functions' fix, new match text
        toggle = yaml.safe_load((PROFILE / f"{pr}.yaml").read_text())
        patches = toggle.get("patches") or [p for part in toggle["parts"].values() for p in part["patches"]]
        assert patches != yaml.safe_load(own[pr])["patches"], pr


def test_the_engines_own_registry_drifts_where_the_profile_does_not(source, tmp_path):
    own = sw.parse_revert_yamls((source / sw.TOGGLE_MODULE).read_text())
    for pr, text in own.items():
        (tmp_path / f"{pr}.yaml").write_text(f'pr: {pr}\ntitle: "sglang registered revert {pr}"\n{text}')
    r = _doctor("--source", str(source), "--json", before=("--toggles", str(tmp_path)))
    assert r.returncode == 1
    drifted = {c["id"] for c in json.loads(r.stdout)["toggles"] if not c["ok"]}
    assert drifted == {"27338", "27460"}
