"""A source tree of sglang on PYTHONPATH is the code every worker runs, even where the wheel is
installed in the very folder sglfix runs from (a regular install: both in site-packages).

The layout is built from the installed sglang without copying it: ``site/`` holds links to this
sglfix and to the installed sglang (what a regular install looks like), ``tree/sglang`` is a
tree of links to the same files but one, the Triton backend, whose decode carries a planted
regression (half the softmax scale). The baseline must see it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "sglang-triton-decode@cg=eager,gpu_only=off"
BACKEND = Path("srt") / "layers" / "attention" / "triton_backend.py"
SHIPPED = "            layer.scaling,\n            k_descale,\n            v_descale,\n            logit_cap=logits_soft_cap,\n"


def _installed_sglang() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("sglang is not installed: pip install --no-deps sglang==0.5.23 (README)", pytrace=False)
    return Path(next(iter(spec.submodule_search_locations)))


def _tree(tmp_path: Path, *, version: str | None = None) -> Path:
    """``tmp_path/tree/sglang``: links to the installed sglang's files, its generated version file
    rewritten to ``version`` if given (what a checkout built at another version has)."""
    sglang = _installed_sglang()
    tree = tmp_path / "tree"
    shutil.copytree(sglang, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    if version is not None:
        generated = tree / "sglang" / "_version.py"
        text = generated.read_text()
        generated.unlink()
        generated.write_text(text.replace("'0.5.23'", repr(version)).replace("(0, 5, 23)", "(0, 0, 0)"))
    return tree


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    sglang = _installed_sglang()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sglfix").symlink_to(ROOT / "sglfix")
    (site / "sglang").symlink_to(sglang)
    for info in sglang.parent.glob("sglang-*.dist-info"):
        (site / info.name).symlink_to(info)
    tree = _tree(tmp_path)
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
        env=env, cwd=str(tmp_path), timeout=300,
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
    tree = _tree(tmp_path, version="0.5.24.dev0")
    env = {"PYTHONPATH": str(tree)}
    out = tmp_path / "run.json"
    r = run_cli(
        "--profile", "sglang", "run", "-s", SCENARIO, "--device", "cpu", "--json", str(out), env=env, timeout=300
    )  # fmt: skip
    assert r.code == 0, (r.out[-1500:], r.err[-1500:])
    cb = json.loads(out.read_text())["codebase"]
    assert (cb["name"], cb["version"], cb["path"]) == ("sglang-0.5.23", "0.5.24.dev0", str(tree / "sglang")), cb
    assert (cb["followed"], cb["beyond_range"]) == ("sglang", "0.5.24.dev0"), cb
    assert "following the installed sglang, newer than its range" in " ".join(r.out.split()), r.out[:800]
    # Pinned, the same tree is refused in one line naming both versions; so is a version older
    # than every profile when following.
    pinned = run_cli("--profile", "sglang-0.5.23", "run", "-s", SCENARIO, "--device", "cpu", env=env)
    assert_one_line_error(pinned, "written for sglang 0.5.23", "sglang 0.5.24.dev0 is installed")
    old = _tree(tmp_path / "old", version="0.5.10")
    older = run_cli("--profile", "sglang", "run", "-s", SCENARIO, "--device", "cpu", env={"PYTHONPATH": str(old)})
    assert_one_line_error(older, "--profile sglang", "sglang 0.5.10 is installed", "older than every profile")
