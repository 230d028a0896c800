"""A source tree of sglang on PYTHONPATH is the code every worker runs, even where the wheel is
installed in the very folder sglfix runs from (a regular install: both in site-packages).

The layout is built from the installed sglang without copying it: ``site/`` holds links to this
sglfix and to the installed sglang (what a regular install looks like), ``tree/sglang`` is a
tree of links to the same files but one, the Triton backend, whose decode carries a planted
regression (half the softmax scale). The baseline must see it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from builders import ROOT
from clihelp import assert_one_line_error, run_cli
from real_sglang import require_sglang, sglang_tree

SCENARIO = "sglang-triton-decode@cg=eager,gpu_only=off"
BACKEND = Path("srt") / "layers" / "attention" / "triton_backend.py"
SHIPPED = "            layer.scaling,\n            k_descale,\n            v_descale,\n            logit_cap=logits_soft_cap,\n"


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    sglang = Path(require_sglang())
    site = tmp_path / "site"
    site.mkdir()
    (site / "sglfix").symlink_to(ROOT / "sglfix")
    (site / "sglang").symlink_to(sglang)
    for info in sglang.parent.glob("sglang-*.dist-info"):
        (site / info.name).symlink_to(info)
    tree = sglang_tree(tmp_path)
    planted = tree / "sglang" / BACKEND
    text = (sglang / BACKEND).read_text()
    assert text.count(SHIPPED) == 1, "the decode call this test edits has moved"
    planted.unlink()
    planted.write_text(text.replace(SHIPPED, SHIPPED.replace("layer.scaling,", "layer.scaling * 0.5,")))
    return site, tree


def test_a_source_tree_on_pythonpath_is_what_the_workers_run(tmp_path):
    site, tree = _layout(tmp_path)
    out = tmp_path / "run.json"
    env = {"PYTHONPATH": os.pathsep.join((str(tree), str(site)))}
    r = run_cli(
        "--profile", "sglang-0.5.23", "run", "-s", SCENARIO, "--device", "cpu", "--json", str(out),
        env=env, cwd=str(tmp_path), timeout=300, subprocess=True,
    )  # fmt: skip
    assert r.code == 1, (r.code, r.out[-2000:], r.err[-2000:])
    report = json.loads(out.read_text())
    assert report["codebase"]["path"] == str(tree / "sglang"), report["codebase"]
    (cell,) = report["cells"]
    assert cell["verdict"] == "DIVERGE", cell
    assert f"code base: sglang 0.5.23 at {tree / 'sglang'}" in " ".join(r.out.split()), r.out[:1500]


def test_profile_sglang_follows_the_installed_version():
    pinned = run_cli("--profile", "sglang-0.5.23", "list", "--json")
    followed = run_cli("--profile", "sglang", "list", "--json")
    assert pinned.code == followed.code == 0, followed.err
    assert json.loads(followed.out) == json.loads(pinned.out)


def test_a_checkout_newer_than_every_profile_runs_with_the_newest(tmp_path):
    tree = sglang_tree(tmp_path, version="0.5.24.dev0")
    env = {"PYTHONPATH": str(tree)}
    out = tmp_path / "run.json"
    r = run_cli(
        "--profile", "sglang", "run", "-s", SCENARIO, "--device", "cpu", "--json", str(out), env=env, timeout=300, subprocess=True
    )  # fmt: skip
    assert r.code == 0, (r.out[-1500:], r.err[-1500:])
    cb = json.loads(out.read_text())["codebase"]
    assert (cb["name"], cb["version"], cb["path"]) == ("sglang-0.5.23", "0.5.24.dev0", str(tree / "sglang")), cb
    assert (cb["followed"], cb["beyond_range"]) == ("sglang", "0.5.24.dev0"), cb
    assert "following the installed sglang, newer than its range" in " ".join(r.out.split()), r.out[:800]
    # Pinned, the same tree is refused in one line naming both versions; so is a version older
    # than every profile when following.
    pinned = run_cli("--profile", "sglang-0.5.23", "run", "-s", SCENARIO, "--device", "cpu", env=env, subprocess=True)
    assert_one_line_error(pinned, "written for sglang 0.5.23", "sglang 0.5.24.dev0 is installed")
    old = sglang_tree(tmp_path / "old", version="0.5.10")
    older = run_cli(
        "--profile", "sglang", "run", "-s", SCENARIO, "--device", "cpu", env={"PYTHONPATH": str(old)}, subprocess=True
    )
    assert_one_line_error(older, "--profile sglang", "sglang 0.5.10 is installed", "older than every profile")


def test_a_revert_that_no_longer_applies_to_the_checkout_is_a_finding_not_a_refusal(tmp_path):
    """A checkout newer than every profile, where 26972's fixed line has been rewritten: the
    matrix runs every other set, names 26972 in the summary and the JSON, and fails its gate."""
    tree = sglang_tree(tmp_path, version="0.5.24.dev0")
    sizing = tree / "sglang" / "srt" / "mem_cache" / "allocation_sizing.py"
    text = sizing.read_text()
    fixed = "extra = max(extra, get_alloc_reserve_per_decode() + page_size - 1)"
    assert text.count(fixed) == 1, "the line this test rewrites has moved"
    sizing.unlink()
    sizing.write_text(text.replace(fixed, "extra = max(get_alloc_reserve_per_decode() + page_size - 1, extra)"))
    out, junit, markdown = tmp_path / "m.json", tmp_path / "m.xml", tmp_path / "m.md"
    r = run_cli(
        "--profile", "sglang", "matrix", "-s", "probe-req-to-token*", "--device", "cpu", "--json", str(out),
        "--junit", str(junit), "--markdown", str(markdown), env={"PYTHONPATH": str(tree)}, timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 1, (r.code, r.out[-1500:], r.err[-1500:])
    report = json.loads(out.read_text())
    assert [d["id"] for d in report["drifted"]] == ["26972"], report["drifted"]
    assert "get_req_to_token_extra_context_len" in report["drifted"][0]["why"]
    assert not any("26972" in c["toggles"] for c in report["cells"])
    ran = {tuple(c["toggles"]) for c in report["cells"]}
    assert () in ran and len(ran) > 5, ran  # the baseline and every other set ran
    assert report["judged"]["outcome"].startswith("gate failed: 1 revert(s) no longer apply (26972)"), report["judged"]
    assert "26972 no longer applies at this code" in r.err
    assert report["summary"].get("ERROR", 0) == 0
    # Every output says so: a failed JUnit case of its own, and a Markdown section.
    from junitparser import JUnitXml

    failed = [(case.name, case.classname) for suite in JUnitXml.fromfile(str(junit)) for case in suite if case.result]
    assert ("26972", "drifted") in failed, failed
    assert "Reverts that no longer apply here" in markdown.read_text()
    # bisect has no plan to leave the set out of: it refuses the drifted candidate, naming it.
    bisect = run_cli("--profile", "sglang", "bisect", "-s", "probe-req-to-token*", "--device", "cpu",
                     env={"PYTHONPATH": str(tree)}, subprocess=True)  # fmt: skip
    assert_one_line_error(bisect, "revert 26972", "without 26972")
    # On code its profile covers (0.5.23), the same edit is a broken profile: refused before any worker.
    pinned = sglang_tree(tmp_path / "pinned")
    moved = pinned / "sglang" / "srt" / "mem_cache" / "allocation_sizing.py"
    moved.unlink()
    moved.write_text(sizing.read_text())
    refused = run_cli(
        "--profile", "sglang", "matrix", "-s", "probe-req-to-token*", "--device", "cpu",
        env={"PYTHONPATH": str(pinned)}, subprocess=True,
    )  # fmt: skip
    assert_one_line_error(refused, "revert 26972", "get_req_to_token_extra_context_len")
