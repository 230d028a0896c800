"""``git bisect run sglfix run ...`` names the commit that broke a backend.

A throw-away git history of this source tree (good, harmless, breaking, harmless commits) is
installed editable into a fresh virtualenv, and real ``git bisect run`` drives ``sglfix run``:
exit 0 good, 1 bad, which is what it must read to land on the breaking commit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builders import ROOT, commit, git, venv_on_these_packages

SCENARIO = "triton-decode@cg=eager,gpu_only=off"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    # The committed tree only (what a clone has), not build outputs or caches.
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True, timeout=300)
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive.stdout, check=True, timeout=300)
    shutil.rmtree(repo / "bench" / "results", ignore_errors=True)
    git(repo, "init", "-q")
    return repo


def _editable_venv(tmp_path: Path, repo: Path) -> tuple[Path, dict]:
    """A fresh venv on this test environment's heavy packages with ``repo`` installed editable.
    Without pip: the venv's own bundled setuptools would shadow this environment's (which builds
    the editable install)."""
    venv = tmp_path / "venv"
    py = venv_on_these_packages(venv, with_pip=False)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-e",
            str(repo),
        ],
        check=True,
        timeout=600,
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLFIX_TOGGLES_DIR", "SGLANG_DEBUG_REVERT_PR")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # the recipe's plain `sglfix`
    return venv / "bin" / "sglfix", env


def _break_decode(repo: Path) -> None:
    backend = repo / "backends" / "srt" / "layers" / "attention" / "triton_backend.py"
    text = backend.read_text()
    assert text.count("            layer.scaling,\n") >= 1
    # The decode path's softmax scale goes wrong: every decode output diverges.
    head, tail = text.rsplit("            layer.scaling,\n", 1)
    backend.write_text(head + "            layer.scaling * 1.5,\n" + tail)


def _rename_decode_scenarios(repo: Path, old: str, new: str) -> None:
    path = repo / "scenarios" / "triton-decode.yaml"
    text = path.read_text()
    assert text.count(f"  - name: {old}\n") == 1
    path.write_text(text.replace(f"  - name: {old}\n", f"  - name: {new}\n"))


def test_git_bisect_run_names_the_breaking_commit(tmp_path):
    repo = _repo(tmp_path)
    good = commit(repo, "good")
    (repo / "NOTES.txt").write_text("harmless\n")
    commit(repo, "harmless before")
    _break_decode(repo)
    bad = commit(repo, "break the decode scale")
    (repo / "NOTES.txt").write_text("harmless\nagain\n")
    commit(repo, "harmless after")

    sglfix, env = _editable_venv(tmp_path, repo)
    check = subprocess.run(
        [str(sglfix), "run", "-s", SCENARIO, "--device", "cpu"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 1, check.stdout[-2000:] + check.stderr[-2000:]  # HEAD is bad
    git(repo, "bisect", "start", "HEAD", good)
    run = subprocess.run(
        ["git", "bisect", "run", str(sglfix), "run", "-s", SCENARIO, "--device", "cpu"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{bad} is the first bad commit" in run.stdout, run.stdout[-3000:]


def test_the_readme_recipe_skips_commits_where_the_scenario_does_not_exist(tmp_path):
    """Exit 2 (bad input: the scenario glob matches nothing at that commit) would read as "bad"
    to git; the bisect guide's recipe turns it into 125 (skip), so the search never blames a commit it
    could not test."""
    import re

    guide = (ROOT / "docs" / "how-to" / "bisect.md").read_text()
    recipe = re.search(r"^git bisect run (sh -c '.*')$", guide, re.M)
    assert recipe, "docs/how-to/bisect.md shows the git bisect run recipe"
    repo = _repo(tmp_path)
    good = commit(repo, "good")
    _rename_decode_scenarios(repo, "triton-decode", "triton-decode-renamed")
    untestable = commit(repo, "rename the decode scenarios (the glob matches nothing here)")
    _break_decode(repo)
    bad = commit(repo, "break the decode scale (still renamed)")
    _rename_decode_scenarios(repo, "triton-decode-renamed", "triton-decode")
    commit(repo, "rename them back")
    sglfix, env = _editable_venv(tmp_path, repo)
    command = ["sh", "-c", recipe.group(1)[len("sh -c '") : -1]]
    git(repo, "bisect", "start", "HEAD", good)
    run = subprocess.run(
        ["git", "bisect", "run", *command], cwd=repo, env=env, capture_output=True, text=True, timeout=1200
    )
    log = run.stdout + run.stderr
    # Both commits without the scenario were skipped, never called bad: git cannot tell which of
    # them broke it, and says so instead of naming the rename.
    assert f"{untestable} is the first bad commit" not in log, log[-3000:]
    assert "only 'skip'ped commits left" in log and untestable in log and bad in log, log[-3000:]
    git(repo, "bisect", "reset")
    # The same search without the mapping blames the rename: what the recipe prevents.
    git(repo, "bisect", "start", "HEAD", good)
    plain = subprocess.run(
        ["git", "bisect", "run", str(sglfix), "run", "-s", "triton-decode@*", "--device", "cpu"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert f"{untestable} is the first bad commit" in plain.stdout, (plain.stdout + plain.stderr)[-3000:]
