"""Helpers for tests that run against the installed real sglang (CI installs sglang 0.5.23).

Real sglang is never imported into the test process itself: each check runs in a fresh
interpreter, as a user's process would. A missing or wrong sglang is a failure with the
install line, never a skip: these tests exist to prove sglfix works on the real engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

VERSION = "0.5.23"
INSTALL = f"pip install --no-deps sglang=={VERSION} && pip install -e '.[sglang]'"


def require_sglang() -> str:
    """The installed sglang's directory; fails the test when it is missing or of another version."""
    from sglfix.codebases import CODEBASES, installed

    found = installed(CODEBASES[f"sglang-{VERSION}"])
    if found is None:
        pytest.fail(f"real sglang is not installed in this environment; install it: {INSTALL}", pytrace=False)
    if found.version != VERSION:
        pytest.fail(
            f"sglang {found.version} is installed ({found.path}); these tests need {VERSION}: {INSTALL}", pytrace=False
        )
    return found.path


def sglang_tree(where: Path, *, version: str | None = None) -> Path:
    """``where/tree/sglang``: links to the installed sglang's files, its generated version file
    rewritten to ``version`` if given (what a checkout built at another version has)."""
    sglang = Path(require_sglang())
    tree = where / "tree"
    shutil.copytree(sglang, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    if version is not None:
        generated = tree / "sglang" / "_version.py"
        text = generated.read_text()
        generated.unlink()
        generated.write_text(text.replace(f"'{VERSION}'", repr(version)).replace("(0, 5, 23)", "(0, 0, 0)"))
    return tree


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh user process: no sglfix selection inherited from this one."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SGLFIX_", "PYTEST_", "SGLANG_DEBUG_REVERT_PR")) or k in ("SGLFIX_STORE", "SGLFIX_JOBS")
    }
    # A terminal's size is the outer run's (pytest-xdist sets COLUMNS=80 in its workers), not the
    # user's: it would squeeze the tables the tests read (clihelp gives its own width).
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


# sglang 0.5.23 imports torchvision and sgl_kernel at module level; on a CPU box they are stood in
# for (both raise when called). A user's engine process has them installed.
STANDINS = "from sglfix.codebases.standins import install as _standins; _standins()\n"


def run_python(
    code: str, *, env: dict[str, str], args: tuple[str, ...] = (), timeout: float = 300, standins: bool = True
) -> subprocess.CompletedProcess:
    program = (STANDINS if standins else "") + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, *args, "-c", program], capture_output=True, text=True, env=env, timeout=timeout
    )


def known_divergences(names: list[str], *, device: str = "cpu") -> dict[str, tuple[str, ...]]:
    """Of the cells ``names``, those the sglang 0.5.23 profile lists as known upstream divergences
    at the installed release (a bug fixed before it is not expected here) on ``device`` -> the
    verdicts the entry allows."""
    import fnmatch

    from sglfix.execution.known import load_known
    from sglfix.toggling.profiles import PROFILES

    known = [k for k in load_known(PROFILES[f"sglang-{VERSION}"].known_file) if k.holds_for(VERSION)]
    return {
        name: tuple(k.verdict)
        for name in names
        for k in known
        if fnmatch.fnmatchcase(name, k.scenario) and k.device in ("any", device)
    }


def run_cli(tmp_path: Path, *args: str) -> dict:
    """``sglfix --profile sglang-0.5.23 run --device cpu --no-cache ARGS`` in a fresh process, as a
    user runs it; its JSON report (the test fails with the output when none was written)."""
    from builders import ROOT

    out = tmp_path / f"run-{len(list(tmp_path.glob('run-*.json')))}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEBUG_REVERT_PR", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-m", "sglfix", "--profile", f"sglang-{VERSION}", "run", "--device", "cpu", "--no-cache"]
        + ["--json", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=600,
    )
    assert out.exists(), f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    import json

    return json.loads(out.read_text())


def by_scenario(cells: list[dict], *, patched: bool = False) -> dict[str, dict]:
    """A report's cells by scenario: the baseline's, or (``patched``) those run with a toggle or
    an applied patch."""
    return {c["scenario"]: c for c in cells if bool(c.get("toggles")) == patched}


def breaking_patch(tmp_path: Path, module: str, old: str, new: str, *, occurrence: int = 1) -> Path:
    """A unified diff of the installed sglang's attention module ``module`` with its
    ``occurrence``-th ``old`` replaced by ``new``: a candidate fix that breaks it, for ``--apply``."""
    import difflib

    source = Path(require_sglang()) / "srt" / "layers" / "attention" / f"{module}.py"
    text = source.read_text()
    assert text.count(old) >= occurrence, f"{module}.py no longer has {occurrence} x {old!r}"
    at = -1
    for _ in range(occurrence):
        at = text.index(old, at + 1)
    changed = text[:at] + new + text[at + len(old) :]
    path = f"python/sglang/srt/layers/attention/{module}.py"
    diff = difflib.unified_diff(
        text.splitlines(keepends=True), changed.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
    )
    patch = tmp_path / "broken.patch"
    patch.write_text("".join(diff))
    return patch
