"""``git bisect run`` over an sglang checkout, as the README's recipe runs it.

The history is built from the Python trees of two consecutive releases (0.5.22 from sglfix's
release cache, 0.5.23 as installed), as trees of links, then one commit planting a regression in
the Triton decode (half the softmax scale), one whose version no profile covers (it cannot be
tested: sglfix refuses it before any cell, and ``--git-bisect`` turns that into 125, skip), and
one more. ``git bisect run`` must name the planted commit.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builders import commit, git

BACKEND = Path("srt") / "layers" / "attention" / "triton_backend.py"
SHIPPED = "            layer.scaling,\n            k_descale,\n"
PLANTED = "            layer.scaling * 0.5,\n            k_descale,\n"
SCENARIO = "sglang-triton-decode@cg=eager,gpu_only=off"


def _links(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))


def _set_version(tree: Path, version: str) -> None:
    for name in ("_version.py", "version.py"):
        (tree / name).unlink(missing_ok=True)
    (tree / "version.py").write_text(f'__version__ = "{version}"\n')


def test_git_bisect_run_names_the_commit_that_planted_a_regression(tmp_path):
    from sglfix.codebases.releases import fetch_release

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("sglang is not installed: pip install --no-deps sglang==0.5.23 (README)", pytrace=False)
    installed = Path(next(iter(spec.submodule_search_locations)))
    older = Path(fetch_release("sglang", "0.5.22").path)  # the package index, once per cache
    repo = tmp_path / "sglang"
    tree = repo / "python" / "sglang"
    tree.parent.mkdir(parents=True)
    git(repo, "init", "-q")
    _links(older, tree)
    good = commit(repo, "release 0.5.22")
    _links(installed, tree)
    commit(repo, "release 0.5.23")
    text = (installed / BACKEND).read_text()
    assert text.count(SHIPPED) == 1, "the decode call this test edits has moved"
    (tree / BACKEND).unlink()
    (tree / BACKEND).write_text(text.replace(SHIPPED, PLANTED))
    planted = commit(repo, "planted: half the softmax scale in the Triton decode")
    _set_version(tree, "0.5.10")
    commit(repo, "a version no profile covers")
    _set_version(tree, "0.5.24.dev0")
    commit(repo, "main moves on")

    step = (
        f'PYTHONPATH=python {sys.executable} -m sglfix --git-bisect --profile sglang run -s "{SCENARIO}" --device cpu'
    )
    git(repo, "bisect", "start", "HEAD", good)
    r = subprocess.run(["git", "bisect", "run", "sh", "-c", step], cwd=repo, capture_output=True, text=True)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert f"{planted} is the first bad commit" in log, log[-3000:]
    git(repo, "bisect", "reset")
    # The commit no profile covers is refused in one line and read as "cannot be tested".
    git(repo, "checkout", "-q", "HEAD~1")
    skip = subprocess.run(["sh", "-c", step], cwd=repo, capture_output=True, text=True)
    assert skip.returncode == 125, skip.stderr
    assert "older than every profile" in skip.stderr
