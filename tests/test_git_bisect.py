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
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "triton-decode@cg=eager,gpu_only=off"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def test_git_bisect_run_names_the_breaking_commit(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    # The committed tree only (what a clone has), not build outputs or caches.
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True, timeout=300)
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive.stdout, check=True, timeout=300)
    shutil.rmtree(repo / "bench" / "results", ignore_errors=True)
    _git(repo, "init", "-q")
    good = _commit(repo, "good")
    (repo / "NOTES.txt").write_text("harmless\n")
    _commit(repo, "harmless before")
    backend = repo / "backends" / "srt" / "layers" / "attention" / "triton_backend.py"
    text = backend.read_text()
    assert text.count("            layer.scaling,\n") >= 1
    # The decode path's softmax scale goes wrong: every decode output diverges.
    head, tail = text.rsplit("            layer.scaling,\n", 1)
    backend.write_text(head + "            layer.scaling * 1.5,\n" + tail)
    bad = _commit(repo, "break the decode scale")
    (repo / "NOTES.txt").write_text("harmless\nagain\n")
    _commit(repo, "harmless after")

    # A fresh venv whose heavy packages (torch, triton, ...) come from this test environment
    # through a .pth, never --system-site-packages (that would inherit the base interpreter's).
    # --without-pip: the venv's own bundled setuptools would shadow this environment's (which
    # builds the editable install); this environment's pip installs into it (--python).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    new_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(new_site, "test-env-packages.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-build-isolation", "-e", str(repo)], check=True, timeout=600)

    sglfix = venv / "bin" / "sglfix"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLFIX_TOGGLES_DIR", "SGLANG_DEBUG_REVERT_PR")}
    check = subprocess.run([str(sglfix), "run", "-s", SCENARIO, "--device", "cpu"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 1, check.stdout[-2000:] + check.stderr[-2000:]  # HEAD is bad
    _git(repo, "bisect", "start", "HEAD", good)
    run = subprocess.run(["git", "bisect", "run", str(sglfix), "run", "-s", SCENARIO, "--device", "cpu"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"{bad} is the first bad commit" in run.stdout, run.stdout[-3000:]
