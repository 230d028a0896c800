"""One record per code-base version, found on disk: a newcomer adds an sglang version by copying a
profile folder and a kit package, touching no file of sglfix; only the kit names a version."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from builders import ROOT
from clihelp import assert_one_line_error, run_cli

BUILTIN = "sglang-0.5.23"
NEW = "sglang-0.5.99"
KIT_DIR = ROOT / "sglfix" / "harness" / "kits" / "sglang_0_5_23"


def _newcomer(tmp_path: Path) -> dict[str, str]:
    """What the README tells a newcomer to do for sglang 0.5.99: copy the profile folder and the
    kit package, edit the record's name, versions and kit; the environment that finds them."""
    profiles = tmp_path / "my-profiles"
    folder = profiles / NEW
    shutil.copytree(ROOT / "profiles" / BUILTIN, folder, ignore=shutil.ignore_patterns("__pycache__"))
    record = (folder / "profile.toml").read_text()
    record = re.sub(r'(?m)^versions = ".*"$', 'versions = ">=0.5.99"', record)
    record = record.replace('kit = "sglfix.harness.kits.sglang_0_5_23"', 'kit = "kit_sglang_0_5_99"')
    (folder / "profile.toml").write_text(record.replace("0.5.23", "0.5.99"))
    kits = tmp_path / "kits"
    shutil.copytree(KIT_DIR, kits / "kit_sglang_0_5_99", ignore=shutil.ignore_patterns("__pycache__"))
    init = kits / "kit_sglang_0_5_99" / "__init__.py"
    init.write_text(init.read_text().replace('VERSION = "0.5.23"', 'VERSION = "0.5.99"'))
    return {"SGLFIX_PROFILES_PATH": str(profiles), "PYTHONPATH": str(kits)}


def _py(code: str, *, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("SGLFIX_PROFILE", "SGLFIX_TOGGLES_DIR", "PYTHONPATH")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


def _fake_sglang(root: Path, version: str) -> Path:
    pkg = root / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the fake sglang of this test must never be imported')\n")
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


def test_a_copied_profile_folder_and_kit_are_found_resolved_and_listed(tmp_path):
    env = _newcomer(tmp_path)
    folder = tmp_path / "my-profiles" / NEW
    # Found, validated by the record's model, its paths in the copy and its kit the copy's.
    found = _py(
        textwrap.dedent(f"""
            import importlib.util, json
            from sglfix.codebases import profiles
            from sglfix.harness.kits import PARTS
            records = profiles(checked=True)
            p = records[{NEW!r}]
            print(json.dumps({{
                "names": sorted(records),
                "toggles": p.toggles_dir, "scenarios": p.scenarios_dir, "known": p.known_file,
                "covers": [p.covers(v) for v in ("0.5.99", "0.6.0", "0.5.23")],
                "old_covers": records[{BUILTIN!r}].covers("0.5.99"),
                "kit": [importlib.util.find_spec(f"{{p.kit}}.{{part}}").origin for part in PARTS],
            }}))
        """),
        env=env,
    )
    assert found.returncode == 0, found.stderr
    data = json.loads(found.stdout)
    assert data["names"] == ["reproduction", BUILTIN, NEW]
    assert data["toggles"] == str(folder) and data["scenarios"] == str(folder / "scenarios")
    assert data["known"] == str(folder / "known" / "divergences.yaml")
    assert data["covers"] == [True, True, False] and data["old_covers"] is False
    assert all(path.startswith(str(tmp_path / "kits" / "kit_sglang_0_5_99")) for path in data["kit"]), data["kit"]

    # Resolved and listed: --profile, and SGLFIX_PROFILE, read the copy's toggles.
    builtin = run_cli("--profile", BUILTIN, "list", "--json")
    assert builtin.code == 0, builtin.err
    for args, extra in ((("list", "--profile", NEW), {}), (("list",), {"SGLFIX_PROFILE": NEW})):
        r = run_cli(*args, "--json", env={**env, **extra}, subprocess=True)
        assert r.code == 0, r.err
        listed = json.loads(r.out)
        assert listed["directory"] == str(folder)
        assert [t["id"] for t in listed["toggles"]] == [t["id"] for t in json.loads(builtin.out)["toggles"]]
    scen = run_cli("--profile", NEW, "scenarios", "--json", env=env, subprocess=True)
    assert scen.code == 0, scen.err
    assert {s["name"] for s in json.loads(scen.out)["scenarios"]} >= {"probe-req-to-token-tree-ps1"}
    # A wrong name lists every profile found, the new one with them.
    bad = run_cli("--profile", "sglang-0.5.9", "list", env=env, subprocess=True)
    assert_one_line_error(bad, "no profile 'sglang-0.5.9'", f"{BUILTIN}, {NEW}", "SGLFIX_PROFILES_PATH")
    # The checkout's own profiles are untouched: the new one exists only where the newcomer put it.
    assert not (ROOT / "profiles" / NEW).exists()
    assert sorted(p.parent.name for p in (ROOT / "profiles").glob("*/profile.toml")) == ["reproduction", BUILTIN]


def test_the_new_record_is_the_active_code_base_and_its_kit_serves_the_adapters(tmp_path):
    env = _newcomer(tmp_path)
    r = _py(
        textwrap.dedent(f"""
            from sglfix.codebases import activate, active
            from sglfix.harness.kits import kit
            activate({NEW!r})
            graphs = kit("graphs")
            print(active().name, active().label, graphs.__name__, hasattr(graphs, "GraphRunner"))
        """),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [NEW, "sglang", "0.5.99", "kit_sglang_0_5_99.graphs", "True"]


def test_the_installed_version_picks_the_profile_whose_range_covers_it(tmp_path):
    """The start-up hook's resolver follows what is installed: a fake sglang 0.5.99 on the path
    selects the copied profile on its import; the built-in one's run refuses it in one line."""
    env = _newcomer(tmp_path)
    fake = _fake_sglang(tmp_path / "site", "0.5.99")
    env["PYTHONPATH"] = os.pathsep.join((str(fake), env["PYTHONPATH"]))
    r = _py(
        "from sglfix.toggling.profiles import resolve_profile\n"
        "c = resolve_profile(follow_imports=True); print(c.profile, dict((m, p.name) for m, p in c.candidates))",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "None {'sglang': 'sglang-0.5.99', 'sglfix.backends': 'reproduction'}"
    refused = run_cli("--profile", BUILTIN, "run", "-s", "*", "--device", "cpu", env=env, subprocess=True)
    assert_one_line_error(refused, "written for sglang 0.5.23", "sglang 0.5.99 is installed", f"pick profile {NEW}")


def test_a_bad_record_or_search_folder_is_one_line(tmp_path):
    env = _newcomer(tmp_path)
    record = tmp_path / "my-profiles" / NEW / "profile.toml"
    text = record.read_text()
    record.write_text(text.replace("install_hint =", "install_hnit ="))
    assert_one_line_error(
        run_cli("--profile", NEW, "list", env=env, subprocess=True), str(record), "install_hnit", "install_hint"
    )
    record.write_text(text.replace('standins = ["sgl_kernel", "torchvision"]', 'standins = "sgl_kernel"'))
    assert_one_line_error(run_cli("list", env=env, subprocess=True), str(record), "standins")
    record.write_text(text.replace(f'name = "{NEW}"', f'name = "{BUILTIN}"'))
    assert_one_line_error(run_cli("list", env=env, subprocess=True), f"profile {BUILTIN} is also")
    record.write_text(text.replace('versions = ">=0.5.99"', 'versions = ">=0.6"'))
    assert_one_line_error(run_cli("list", env=env, subprocess=True), "does not cover version 0.5.99")
    missing = {**env, "SGLFIX_PROFILES_PATH": str(tmp_path / "nowhere")}
    assert_one_line_error(run_cli("list", env=missing, subprocess=True), "SGLFIX_PROFILES_PATH", "is not a folder")


def test_resolution_order_is_option_then_environment_then_the_reproduction(monkeypatch):
    from sglfix.toggling.profiles import resolve_profile

    monkeypatch.delenv("SGLFIX_PROFILE", raising=False)
    assert resolve_profile().profile.name == "reproduction"
    assert resolve_profile().profile.is_reproduction
    monkeypatch.setenv("SGLFIX_PROFILE", BUILTIN)
    assert resolve_profile().profile.name == BUILTIN and not resolve_profile().profile.is_reproduction
    assert resolve_profile(option="reproduction").profile.name == "reproduction"


def test_only_the_kit_package_names_the_version():
    """Every other module reads the version from the record (profile.toml, outside sglfix/)."""
    r = subprocess.run(
        ["git", "grep", "--untracked", "-n", r"0\.5\.23", "--", "sglfix"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (0, 1), r.stderr  # 1: no match at all
    outside = [line for line in r.stdout.splitlines() if not line.startswith("sglfix/harness/kits/sglang_0_5_23/")]
    assert not outside, "\n".join(outside)


def test_a_worker_finds_the_record_where_its_environment_does_not_name_the_folder(tmp_path):
    """A Ray actor on another node does not share the parent's environment: the worker config
    carries the profiles' folders, so a worker started without SGLFIX_PROFILES_PATH (as there)
    still boots into the copied record."""
    env = _newcomer(tmp_path)
    record = tmp_path / "my-profiles" / NEW / "profile.toml"  # its range covers the sglang installed here
    record.write_text(record.read_text().replace('versions = ">=0.5.99"', 'versions = ">=0.5"'))
    r = _py(
        textwrap.dedent(f"""
            import os
            from sglfix.execution.worker import Worker, WorkerConfig
            config = WorkerConfig(device="cpu", codebase={NEW!r})
            del os.environ["SGLFIX_PROFILES_PATH"]
            w = Worker(config)
            try:
                w.wait_ready()
                print(w.info["codebase"]["name"] if isinstance(w.info["codebase"], dict) else w.info["codebase"])
            finally:
                w.kill()
        """),
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == NEW
