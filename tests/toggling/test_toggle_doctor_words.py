"""Bad input to ``sglfix toggle`` and ``sglfix doctor`` is one line on stderr that names the input
and the fix, exit 2: a diff that changes only comments or docstrings, an empty diff, diff paths
with '.' or '..' components (mapped like the plain path, or refused when they climb past the
top), a commit whose diff is not UTF-8, a --source folder without the toggles' packages, and
--caught-by where pytest cannot be imported."""

from __future__ import annotations

import difflib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import ROOT as REPO
from builders import commit, git
from clihelp import assert_one_line_error, run_cli

from sglfix.toggling import fromdiff

ROOT = Path(next(iter(importlib.util.find_spec("sglfix.backends").submodule_search_locations)))
REL = "srt/layers/attention/triton_backend.py"
POST = (ROOT / REL).read_text()
CLAMP = "                kv_lens = torch.clamp(kv_lens, min=0)\n"
COMMENT = "# PR 26651: padded rows (seq_lens = fill 1, extend = num_draft_tokens) go negative."
METHOD_DOC = '"""Init auxiliary variables for triton attention backend."""'
MODULE_DOC = "The Triton attention backend: builds"
CAPTURE = (
    "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata_capture_cuda_graph"
)


def _diff(pre: str, post: str = POST, *, a: str = f"a/backends/{REL}", b: str = f"b/backends/{REL}") -> str:
    return "".join(difflib.unified_diff(pre.splitlines(True), post.splitlines(True), a, b))


def _with_module_comment(text: str) -> str:
    lines = text.splitlines(True)
    i = next(i for i, line in enumerate(lines) if line.startswith("import "))
    return "".join([*lines[:i], "# a comment the fix removed\n", *lines[i:]])


def _from_diff(tmp_path: Path, text: str, *args: str):
    patch = tmp_path / "fix.patch"
    patch.write_text(text)
    return run_cli("toggle", "from-diff", str(patch), "--pr", "90001", *args, timeout=120)


# --------------------------------------------------------------------------- 1. no code change


@pytest.mark.parametrize(
    "pre",
    [
        pytest.param(POST.replace(COMMENT, "# padded rows go negative.", 1), id="comment-in-a-function"),
        pytest.param(POST.replace(METHOD_DOC, '"""Init the variables."""', 1), id="method-docstring"),
        pytest.param(POST.replace(MODULE_DOC, "The Triton backend: builds", 1), id="module-docstring"),
        pytest.param(_with_module_comment(POST), id="module-comment"),
    ],
)
def test_a_diff_that_changes_only_comments_or_docstrings_is_refused(tmp_path, pre):
    assert pre != POST
    out = tmp_path / "t.yaml"
    line = assert_one_line_error(
        _from_diff(tmp_path, _diff(pre), "-o", str(out)), "fix.patch", "changes no code (only comments or docstrings)"
    )
    assert "give the diff of the fix's code change" in line
    assert not out.exists()


def test_a_diff_with_a_code_change_beside_comment_changes_reverts_the_code_only(tmp_path):
    pre = _with_module_comment(POST.replace(CLAMP, "", 1).replace(METHOD_DOC, '"""Init the variables."""', 1))
    r = _from_diff(tmp_path, _diff(pre))
    assert r.code == 0, r.err
    assert [p["target"] for p in yaml.safe_load(r.out)["patches"]] == [CAPTURE]
    assert "changes only comments or docstrings" in r.err


# --------------------------------------------------------------------------- 2. an empty file


@pytest.mark.parametrize("text", ["", "  \n\n\t\n"])
def test_an_empty_diff_file_is_called_empty(tmp_path, text):
    line = assert_one_line_error(_from_diff(tmp_path, text), "fix.patch is empty")
    assert "not a unified diff" not in line


# --------------------------------------------------------------------------- 3. '.' and '..' in paths


@pytest.mark.parametrize(
    "a, b",
    [
        (f"a/./backends/{REL}", f"b/./backends/{REL}"),
        (f"a/backends/srt/../{REL}", f"b/backends/srt/../{REL}"),
        (f"a/backends/./{REL}", f"b/backends/./{REL}"),
    ],
)
def test_dot_components_in_a_diff_path_map_like_the_plain_path(tmp_path, a, b):
    pre = POST.replace(CLAMP, "", 1)
    plain = _from_diff(tmp_path, _diff(pre))
    assert plain.code == 0, plain.err
    r = _from_diff(tmp_path, _diff(pre, a=a, b=b))
    assert r.code == 0, r.err
    assert yaml.safe_load(r.out) == yaml.safe_load(plain.out)


def test_a_diff_path_that_climbs_above_the_root_is_refused_in_one_line(tmp_path):
    diff = _diff(POST.replace(CLAMP, "", 1), a=f"a/../backends/{REL}", b=f"b/../backends/{REL}")
    assert_one_line_error(_from_diff(tmp_path, diff), f"../backends/{REL}", "climbs above the repository's root")


def test_a_checkout_subfolder_path_with_dot_dot_maps_to_the_package(tmp_path):
    """As the sglang profile names its files (python/sglang/...), on a package of its own."""
    root = tmp_path / "pkgx"
    root.mkdir()
    (root / "__init__.py").write_text("")
    post = "def size(max_bs):\n    return max_bs * 2\n"
    (root / "worker.py").write_text(post)
    diff = _diff(
        "def size(max_bs):\n    return max_bs\n",
        post,
        a="a/python/../python/sglang/worker.py",
        b="b/python/../python/sglang/worker.py",
    )
    plan = fromdiff.plan(diff, where="fix.patch", pr=1, package="pkgx", repo_prefix="python/sglang/", source_root=root)
    assert not plan.refusals, [n.why for n in plan.refusals]
    assert [r.target for r in plan.reverts] == ["pkgx.worker.size"]


# --------------------------------------------------------------------------- 4. from-git, not UTF-8


def test_a_commit_whose_diff_is_not_utf8_is_refused_naming_the_file(tmp_path):
    repo = tmp_path / "repo"
    path = repo / "backends" / REL
    path.parent.mkdir(parents=True)
    # Before the fix the line held a Latin-1 byte: read as UTF-8 it would reach the toggle as U+FFFD.
    path.write_bytes(POST.encode().replace(CLAMP.encode(), b"                kv_lens = kv_lens  # caf\xe9\n", 1))
    git(repo, "init", "-q")
    commit(repo, "before")
    path.write_text(POST)
    commit(repo, "Clamp the draft kv lengths")
    out = tmp_path / "t.yaml"
    r = run_cli("toggle", "from-git", "HEAD", "--repo", str(repo), "--pr", "90001", "-o", str(out), timeout=120)
    line = assert_one_line_error(r, f"backends/{REL}", "is not UTF-8 text", "byte 0xe9")
    assert "internal error" not in line and not out.exists()


# --------------------------------------------------------------------------- 5. doctor --source layout


@pytest.mark.parametrize("where", ["backends", "empty"])
def test_doctor_source_without_the_package_folder_is_refused_before_any_check(tmp_path, where):
    source = "backends" if where == "backends" else str(tmp_path)
    r = run_cli("doctor", "--source", source, cwd=str(REPO), timeout=120)
    assert_one_line_error(r, f"--source {source}", "has no sglfix/backends/ folder")
    assert "DRIFTED" not in r.out


def test_doctor_source_names_the_checkout_subfolder_that_holds_the_package(tmp_path):
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    (toggles / "44444.yaml").write_text(
        "pr: 44444\ntitle: t\npatches:\n  - target: sglang.srt.worker.size\n    edits:\n"
        "      - match: return max_bs * 2\n        replacement: return max_bs\n"
    )
    # A checkout named after the package, as a clone of it is: the python/ inside is what to give.
    checkout = tmp_path / "sglang"
    (checkout / "python" / "sglang" / "srt").mkdir(parents=True)
    (checkout / "python" / "sglang" / "__init__.py").write_text("")
    r = run_cli("--toggles", str(toggles), "doctor", "--source", str(checkout), timeout=120)
    assert_one_line_error(r, "has no sglang/ folder", f"give {checkout / 'python'}")
    r = run_cli("--toggles", str(toggles), "doctor", "--source", str(checkout / "python" / "sglang"), timeout=120)
    assert_one_line_error(r, "has no sglang/ folder", f"give {checkout / 'python'}, the folder that holds it")


# --------------------------------------------------------------------------- 6. --caught-by, no pytest


def test_doctor_caught_by_without_pytest_names_the_install(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pytest.py").write_text('raise ImportError("No module named pytest")\n')
    env = {"PYTHONPATH": str(shadow)}
    # The shadow is what the CLI's interpreter imports as pytest: the path under test is taken.
    probe = subprocess.run(
        [sys.executable, "-c", "import pytest"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert probe.returncode != 0 and "No module named pytest" in probe.stderr, probe.stderr
    r = run_cli(
        "doctor", "--caught-by", "--tests-root", str(REPO), env=env, cwd=str(REPO), timeout=120, subprocess=True
    )
    line = assert_one_line_error(r, "--caught-by", "pytest", "pip install 'sglfix[test]'")
    assert "cannot import" in line
