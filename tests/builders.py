"""What several test files build the same way: the repository's root, the worker pool's test
cells and toggles, git repositories and their commits, venvs that borrow this environment's
packages, a built-in fix as its diff or its patches, and the toggle sglfix cannot judge. Plain
helpers only, light to import (every test file's collection reads this module); fixtures shared
the same way are in conftest.py, helpers for real sglang in real_sglang.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

# The checkout these tests belong to, wherever in tests/ a file sits.
ROOT = Path(__file__).resolve().parent.parent


# -- cells and toggles for the worker pool --------------------------------------------------------

SCEN = "triton-decode@cg=eager,gpu_only=off"
SCEN2 = "triton-extend"
# Where a test toggle edits the reproduction: a function every triton cell runs, at a line it has once.
TARGET = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
ANCHOR = "bs = forward_batch.batch_size\n"
# A toggle that leaves its class changed after its cell (the pool must replace the worker), and
# one that changes nothing.
LEAK_CLASS, BENIGN = 90008, 90009


@dataclass(frozen=True)
class Cell:
    id: str
    scenario: object
    toggles: tuple[str, ...]


_SCENARIOS: dict = {}


def cell(name: str, *toggles: str) -> Cell:
    """A cell of the built-in scenario ``name`` with ``toggles`` reverted, as the pool takes it."""
    if not _SCENARIOS:
        from sglfix.scenario import load_scenarios

        _SCENARIOS.update((s.name, s) for s in load_scenarios([], builtin=True))
    return Cell(id=f"{name}|{','.join(toggles)}", scenario=_SCENARIOS[name], toggles=tuple(toggles))


def write_toggle(
    directory: Path,
    pr: int,
    *,
    preamble: str = "",
    target: str = TARGET,
    match: str = ANCHOR,
    append: str = "pass\n",
    title: str | None = None,
) -> None:
    """``directory/<pr>.yaml``: a toggle whose one patch appends ``append`` after ``match`` in
    ``target``, its ``preamble`` (dedented) run where the patch applies."""
    import yaml

    patch = {"target": target, "edits": [{"match": match, "append": append}]}
    if preamble:
        patch["preamble"] = textwrap.dedent(preamble).strip() + "\n"
    text = yaml.safe_dump({"pr": pr, "title": title or f"test toggle {pr}", "patches": [patch]}, sort_keys=False)
    (directory / f"{pr}.yaml").write_text(text)


def write_class_leak(directory: Path) -> None:
    """LEAK_CLASS, whose cell leaves its backend class's method replaced, and BENIGN."""
    write_toggle(
        directory,
        LEAK_CLASS,
        preamble="""
        def _leaked(*args, **kwargs):
            raise RuntimeError("class state leaked from 90008")
        type(self)._fill_kv_indices = _leaked
    """,
    )
    write_toggle(directory, BENIGN)


def assert_matched(results, cells) -> None:
    """The pool's results are those of ``cells``, one each, in their order."""
    assert len(results) == len(cells)
    for r, c in zip(results, cells):
        assert (r.scenario, tuple(r.toggles)) == (c.scenario.name, c.toggles), (r, c)


# -- git ---------------------------------------------------------------------------------------


def git(repo: Path, *args: str, date: str | None = None) -> str:
    """``git args`` in ``repo`` as a fixed author (at ``date`` if given), reading no user or system
    configuration; its output, stripped. A failure fails the test with git's words."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    if date is not None:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, (args, r.stdout + r.stderr)
    return r.stdout.strip()


def commit(repo: Path, message: str) -> str:
    """Everything in ``repo`` committed; the new commit's hash."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


# -- venvs ---------------------------------------------------------------------------------------


def venv_on_these_packages(venv: Path, *, with_pip: bool) -> Path:
    """A fresh venv at ``venv`` whose heavy packages (torch, triton, ...) are this test
    environment's, named by a .pth; its python. Never --system-site-packages: from inside a venv
    that would inherit the *base* interpreter's packages, which a fresh machine does not have.
    Without pip, this environment's pip installs into it (``pip --python``)."""
    import sysconfig

    subprocess.run(
        [sys.executable, "-m", "venv", *(() if with_pip else ("--without-pip",)), str(venv)], check=True, timeout=300
    )
    py = venv / "bin" / "python"
    new_site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(new_site, "test-env-packages.pth").write_text("\n".join(sorted(ours)) + "\n")
    return py


# -- a fix of the reproduction as its diff -------------------------------------------------------

PACKAGE = "sglfix.backends"


def backends() -> Path:
    """The folder the reproduction (``sglfix.backends``) is imported from."""
    import importlib.util

    return Path(next(iter(importlib.util.find_spec(PACKAGE).submodule_search_locations)))


def part_fix(registry, rid: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """A hand-written part ``rid`` of ``registry`` as its fix would show it: the diff (pre-fix: the
    reproduction with the part reverted; post-fix: as shipped), each target's hand-reverted
    source, and each changed file's pre-fix text by its path in the repository."""
    import difflib

    from sglfix.patching.editor import apply_edits
    from sglfix.toggling.doctor import locate_in

    root = backends()
    files: dict[Path, str] = {}
    hand: dict[str, str] = {}
    for sel in registry.select(rid):
        for patch in sel.part.patches:
            path, source, _ = locate_in(root, patch.target[len(PACKAGE) + 1 :].split("."), patch.target)
            current = hand.get(patch.target, source)
            hand[patch.target] = apply_edits(source=current, edits=patch.edits)
            text = files.get(Path(path)) or Path(path).read_text()
            files[Path(path)] = text.replace(current, hand[patch.target], 1)
    diff = ""
    for path, pre in files.items():
        rel = "backends/" + path.relative_to(root).as_posix()
        post = path.read_text()
        diff += "".join(difflib.unified_diff(pre.splitlines(True), post.splitlines(True), "a/" + rel, "b/" + rel))
    return diff, hand, {"backends/" + path.relative_to(root).as_posix(): pre for path, pre in files.items()}


# A toggle that applies and hands sglfix's guard check a buffer list it cannot read: sglfix cannot
# judge the cell (ERROR).
HARNESS_FAILS = (
    "pr: 88888\ntitle: sglfix cannot judge this\npatches:\n"
    "  - target: sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata\n"
    '    preamble: "self.static_buffers = [object()]\\n"\n'
    '    edits:\n      - match: "bs = forward_batch.batch_size\\n"\n        append: "pass\\n"\n'
)


def toggle_patches(toggle_id: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The built-in toggle part's patches as (target, [(match, replacement), ...]), the form the
    reproduction's tests revert by hand (tests/backends/conftest.py: ``reverted``)."""
    from sglfix.toggling.registry import load_registry

    out = []
    for sel in load_registry().select(toggle_id):
        for patch in sel.part.patches:
            out.append((patch.target, [(e.match, e.replacement) for e in patch.edits]))
    return out
