"""``sglfix toggle from-git`` makes the toggle from REV's diff against its first parent, whatever
REV is: a merge commit gives what it brought in (not the newest non-merge commit behind it, as
``git format-patch -1`` would pick), under the merge's own title; a root commit, a commit that
changes nothing against its first parent and a revision that reads as an option are refused in
one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from builders import backends, git, part_fix
from clihelp import assert_one_line_error, run_cli

from sglfix.toggling.doctor import locate_in
from sglfix.toggling.registry import load_registry

ROOT = backends()
REGISTRY = load_registry()
REL = "srt/layers/attention/flashinfer_mla_backend.py"
CLASS = "sglfix.backends.srt.layers.attention.flashinfer_mla_backend.FlashInferMLAMultiStepDraftBackend."
F, G = "27460:sizing", "27460:assert"  # two fixes of two functions of one module
F_TARGET, G_TARGET = CLASS + "init_cuda_graph_state", CLASS + "common_template"
MERGE_MESSAGE = (
    "Merge branch 'assert-fits': check the draft row before the launch\n\n"
    "Brings in the row-size assert; see https://github.com/sgl-project/sglang/pull/27460.\n"
)


def _pre(*rids: str) -> str:
    """The module with the parts ``rids`` reverted (each part's function as before its fix)."""
    text = (ROOT / REL).read_text()
    for rid in rids:
        _, hand, _ = part_fix(REGISTRY, rid)
        for target, pre_function in hand.items():
            _, post_function, _ = locate_in(ROOT, target[len("sglfix.backends.") :].split("."), target)
            assert text.count(post_function) == 1, target
            text = text.replace(post_function, pre_function)
    return text


def _merge_repo(tmp_path: Path, *, newest: str) -> tuple[Path, Path]:
    """main fixes F ("Fix the draft row size"), branch assert-fits fixes G ("Assert the draft row
    fits"), main merges assert-fits with --no-ff: the merge's first parent has F fixed and G not,
    so its diff against that parent is G's fix alone. ``newest`` names the non-merge commit with
    the later date (the one ``git format-patch -1 MERGE`` takes)."""
    repo = tmp_path / "repo"
    path = repo / "backends" / REL
    path.parent.mkdir(parents=True)
    path.write_text(_pre(F, G))
    git(repo, "init", "-q", "-b", "main")
    # What a user's configuration could do to porcelain output must not reach the diff.
    for key, value in (("color.ui", "always"), ("diff.noprefix", "true"), ("core.pager", "false")):
        git(repo, "config", key, value)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "before both fixes", date="2024-01-01T00:00:00+00:00")
    f_date, g_date = ("2024-01-03T00:00:00+00:00", "2024-01-02T00:00:00+00:00")
    if newest == "side":
        f_date, g_date = g_date, f_date
    git(repo, "checkout", "-q", "-b", "assert-fits")
    path.write_text(_pre(F))
    git(repo, "commit", "-q", "-am", "Assert the draft row fits", date=g_date)
    git(repo, "checkout", "-q", "main")
    path.write_text(_pre(G))
    git(repo, "commit", "-q", "-am", "Fix the draft row size", date=f_date)
    git(repo, "merge", "-q", "--no-ff", "-m", MERGE_MESSAGE, "assert-fits", date="2024-01-04T00:00:00+00:00")
    assert path.read_text() == (ROOT / REL).read_text()  # the merge is the installed code
    return repo, path


@pytest.mark.parametrize("newest", ["main", "side"])
def test_a_merge_commit_gives_its_diff_against_its_first_parent_under_its_own_title(tmp_path, newest):
    repo, _ = _merge_repo(tmp_path, newest=newest)
    r = run_cli("toggle", "from-git", "HEAD", "--repo", str(repo), "--pr", "27460", "--force", timeout=120)
    assert r.code == 0, r.err
    data = yaml.safe_load(r.out)
    assert data["title"] == "Merge branch 'assert-fits': check the draft row before the launch"
    assert data["url"] == "https://github.com/sgl-project/sglang/pull/27460"
    assert data["description"].startswith("Brings in the row-size assert;")
    # It reverts what the merge brought in (G), and only that: F was on the first parent already.
    assert [p["target"] for p in data["patches"]] == [G_TARGET]
    (edit,) = data["patches"][0]["edits"]
    (hand,) = [e for sel in REGISTRY.select(G) for p in sel.part.patches for e in p.edits]
    assert (edit["match"].strip(), edit["replacement"].strip()) == (hand.match.strip(), hand.replacement.strip())
    assert F_TARGET not in r.out and "Fix the draft row size" not in r.out
    assert "Assert the draft row fits" not in r.out
    # The side branch's own commit, given by name, is the same change under its own title.
    r = run_cli("toggle", "from-git", "assert-fits", "--repo", str(repo), "--pr", "27460", "--force", timeout=120)
    assert r.code == 0, r.err
    side = yaml.safe_load(r.out)
    assert side["title"] == "Assert the draft row fits" and side["patches"] == data["patches"]
    # The first parent's commit, HEAD^1, is F's fix alone.
    r = run_cli("toggle", "from-git", "HEAD^1", "--repo", str(repo), "--pr", "27460", "--force", timeout=120)
    assert r.code == 0, r.err
    main = yaml.safe_load(r.out)
    assert main["title"] == "Fix the draft row size"
    assert [p["target"] for p in main["patches"]] == [F_TARGET]


def test_what_has_no_first_parent_diff_or_is_no_commit_is_refused_in_one_line(tmp_path):
    repo, path = _merge_repo(tmp_path, newest="main")
    root = git(repo, "rev-list", "--max-parents=0", "HEAD")
    line = assert_one_line_error(
        run_cli("toggle", "from-git", root, "--repo", str(repo), "--pr", "90027", timeout=60), root, "root commit"
    )
    assert "give the fix's own commit" in line
    # A merge that keeps its first parent's tree (-s ours) changes no file against it.
    git(repo, "checkout", "-q", "-b", "other", "HEAD~1")
    path.write_text(path.read_text() + "\n")
    git(repo, "commit", "-q", "-am", "Another change", date="2024-01-01T00:00:00+00:00")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "-s", "ours", "-m", "Merge other, keeping ours", "other", date="2024-01-01T00:00:00+00:00")
    assert_one_line_error(
        run_cli("toggle", "from-git", "HEAD", "--repo", str(repo), "--pr", "90027", timeout=60),
        "changes no file against its first parent",
    )
    for rev, needle in (
        ("--output=/tmp/x", "is not a revision"),
        ("HEAD:backends", "HEAD:backends"),  # a tree, not a commit
        ("HEAD~1..HEAD", "HEAD~1..HEAD"),
        ("no-such-rev", "no-such-rev"),
    ):
        assert_one_line_error(
            run_cli("toggle", "from-git", "--pr", "90027", "--repo", str(repo), "--", rev, timeout=60), needle
        )
    assert_one_line_error(
        run_cli("toggle", "from-git", "HEAD", "--repo", str(tmp_path), "--pr", "90027", timeout=60), str(tmp_path)
    )
