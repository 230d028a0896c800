"""``sglfix toggle from-diff`` / ``from-git`` and ``sglfix schema``: every part of the built-in
toggles round-trips (its fix's diff, pre-fix text from the toggle and post-fix from backends/,
becomes a toggle that reverts each function to the same code as the hand-written part, and to
the same verdicts), what cannot be a function revert is refused line by line, and the built-in
files pass the schemas."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
import yaml
from builders import PACKAGE, backends, commit, git, part_fix
from clihelp import assert_one_line_error, run_cli

from sglfix.patching.editor import apply_edits
from sglfix.toggling import fromdiff
from sglfix.toggling.doctor import locate_in
from sglfix.toggling.registry import load_registry

ROOT = backends()
REGISTRY = load_registry()
PARTS = [rid for t in REGISTRY for rid in (t.ids[1:] if len(t.parts) > 1 else t.ids[:1])]


def _reverted(target: str, edits) -> str:
    _, source, _ = locate_in(ROOT, target[len(PACKAGE) + 1 :].split("."), target)
    return apply_edits(source=source, edits=edits)


def fix_diff(rid: str) -> tuple[str, dict[str, str]]:
    """The diff of one hand-written part as its fix would show it and each target's hand-reverted source."""
    diff, hand, _ = part_fix(REGISTRY, rid)
    return diff, hand


def _plan(diff: str, pr: int = 90001) -> fromdiff.Plan:
    return fromdiff.plan(diff, where="fix.patch", pr=pr, package=PACKAGE, repo_prefix="backends/", source_root=ROOT)


@pytest.mark.parametrize("rid", PARTS)
def test_every_built_in_part_round_trips_to_the_same_reverted_code(rid):
    diff, hand = fix_diff(rid)
    assert diff, rid
    plan = _plan(diff)
    assert not plan.refusals, [n.why for n in plan.refusals]
    assert fromdiff.check(plan, package=PACKAGE, source_root=ROOT) == []
    generated = {r.target: _reverted(r.target, r.edits) for r in plan.reverts}
    assert set(generated) == set(hand), (rid, sorted(generated), sorted(hand))
    for target, source in hand.items():
        assert fromdiff.normalized(generated[target]) == fromdiff.normalized(source), (rid, target)


def test_from_diff_writes_a_toggle_that_loads_and_reverts_like_the_hand_written_one(tmp_path):
    diff, hand = fix_diff("26738")
    patch = tmp_path / "fix.patch"
    patch.write_text(
        "From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001\n"
        "From: A Developer <dev@example.com>\n"
        "Subject: [PATCH] Guard needs_cpu_seq_lens against None backends\n"
        "\nSee https://github.com/sgl-project/sglang/pull/26738 for the bug.\n---\n" + diff
    )
    out = tmp_path / "toggles" / "26738.yaml"
    out.parent.mkdir()
    r = run_cli("toggle", "from-diff", str(patch), "--pr", "26738", "--force", "-o", str(out), timeout=120)
    assert r.code == 0, r.err
    assert "3 function(s) in 3 part(s)" in r.err, r.err
    data = yaml.safe_load(out.read_text())
    assert data["title"] == "Guard needs_cpu_seq_lens against None backends"
    assert data["url"] == "https://github.com/sgl-project/sglang/pull/26738"
    registry = load_registry(str(out.parent))
    toggle = next(iter(registry))
    got = {}
    for sel in registry.select("26738"):
        for p in sel.part.patches:
            got[p.target] = _reverted(p.target, p.edits)
    assert {t: fromdiff.normalized(s) for t, s in got.items()} == {t: fromdiff.normalized(s) for t, s in hand.items()}
    assert len(toggle.parts) == 3
    # doctor applies and restores each part live.
    d = run_cli("--toggles", str(out.parent), "doctor", timeout=120)
    assert d.code == 0 and "4/4 checks pass" in d.out, d.out + d.err


def test_from_git_reads_the_commit_of_a_checkout(tmp_path):
    _, _, pre_files = part_fix(REGISTRY, "27460:sizing")
    repo = tmp_path / "repo"
    ((rel, pre),) = pre_files.items()
    post = (ROOT / rel[len("backends/") :]).read_text()
    pre_file = repo / rel
    pre_file.parent.mkdir(parents=True)
    pre_file.write_text(pre)
    git(repo, "init", "-q")
    commit(repo, "before")
    pre_file.write_text(post)
    commit(repo, "Size the draft row from the tree")
    r = run_cli("toggle", "from-git", "HEAD", "--repo", str(repo), "--pr", "27460", "--force", timeout=120)
    assert r.code == 0, r.err
    data = yaml.safe_load(r.out)
    assert data["title"] == "Size the draft row from the tree"
    (edit,) = data["patches"][0]["edits"]
    (hand,) = [e for sel in REGISTRY.select("27460:sizing") for p in sel.part.patches for e in p.edits]
    assert (edit["match"].strip(), edit["replacement"].strip()) == (hand.match.strip(), hand.replacement.strip())
    assert_one_line_error(
        run_cli("toggle", "from-git", "no-such-rev", "--repo", str(repo), "--pr", "1", timeout=60), "no-such-rev"
    )


def _module_level_diff() -> str:
    rel = "srt/layers/attention/triton_backend.py"
    post = (ROOT / rel).read_text().splitlines(True)
    i = next(i for i, line in enumerate(post) if line.startswith("import "))
    pre = [*post[:i], "import os\n", *post[i:]]  # the fix removed a module-level import... of os
    return "".join(difflib.unified_diff(pre, post, f"a/backends/{rel}", f"b/backends/{rel}"))


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: "just some words\nno diff here\n", "is not a unified diff"),
        (
            lambda: fix_diff("26651:clamp")[0].replace(
                "+                kv_lens = torch.clamp", "+                kv_lens = torch.clip"
            ),
            "does not apply to the installed code",
        ),
        (_module_level_diff, "a module-level change (outside any function)"),
    ],
)
def test_what_cannot_be_a_function_revert_is_refused_and_nothing_is_written(tmp_path, make, needle):
    patch = tmp_path / "fix.patch"
    patch.write_text(make())
    out = tmp_path / "t.yaml"
    r = run_cli("toggle", "from-diff", str(patch), "--pr", "90001", "-o", str(out), timeout=60)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert r.code == 2 and lines and all(line.startswith("sglfix: error: ") for line in lines), r.err
    assert any(needle in line for line in lines), r.err
    assert "Traceback" not in r.err and not out.exists()


def test_the_schemas_describe_every_built_in_file():
    import jsonschema

    from sglfix.toggling.profiles import PROFILES

    schemas = {}
    for kind in ("toggle", "scenario"):
        r = run_cli("schema", kind, timeout=60)
        assert r.code == 0, r.err
        schemas[kind] = json.loads(r.out)
        jsonschema.Draft202012Validator.check_schema(schemas[kind])
    seen = 0
    for profile in PROFILES.values():
        for kind, folder in (("toggle", profile.toggles_dir), ("scenario", profile.scenarios_dir)):
            validator = jsonschema.Draft202012Validator(schemas[kind])
            for f in sorted(Path(folder).glob("*.yaml")):
                errors = [e.message for e in validator.iter_errors(yaml.safe_load(f.read_text()))]
                assert not errors, (str(f), errors[:3])
                seen += 1
    assert seen >= 20
    # A schema can fail: a misspelt key and a toggle with both patches and parts are errors.
    toggle = yaml.safe_load((Path(PROFILES["reproduction"].toggles_dir) / "26651.yaml").read_text())
    validator = jsonschema.Draft202012Validator(schemas["toggle"])
    assert list(validator.iter_errors({**toggle, "titel": "x"}))
    assert list(validator.iter_errors({**toggle, "patches": toggle["parts"]["clamp"]["patches"]}))


def test_generated_parts_give_the_same_verdicts_as_the_hand_written_ones(tmp_path):
    """One matrix over the built-in toggles and, beside them, a generated toggle per part (PR
    90001, 90002, ... from that part's diff): every generated toggle's cell has its part's verdict,
    scenario by scenario."""
    import shutil

    from sglfix.toggling.profiles import PROFILES

    toggles = tmp_path / "toggles"
    shutil.copytree(PROFILES["reproduction"].toggles_dir, toggles)
    twin = {}
    for i, rid in enumerate(PARTS, start=1):
        pr = 90000 + i
        plan = _plan(fix_diff(rid)[0], pr=pr)
        (toggles / f"{pr}.yaml").write_text(fromdiff.to_yaml(fromdiff.toggle_data(plan)))
        twin[str(pr)] = rid
    report = tmp_path / "m.json"
    r = run_cli(
        "--toggles",
        str(toggles),
        "matrix",
        "--parts",
        "--device",
        "cpu",
        "--json",
        str(report),
        timeout=1200,
        subprocess=True,
    )
    assert report.exists(), r.out[-2000:] + r.err
    cells = {(",".join(c["toggles"]), c["scenario"]): c["verdict"] for c in json.loads(report.read_text())["cells"]}
    scenarios = {s for _, s in cells}
    compared = 0
    for pr, rid in twin.items():
        for s in scenarios:
            assert cells[(pr, s)] == cells[(rid, s)], (pr, rid, s)
            compared += 1
    assert compared == len(PARTS) * len(scenarios) and len(scenarios) > 100
    # Not all the same verdict: the parts do change verdicts somewhere.
    assert {cells[(pr, s)] for pr in twin for s in scenarios} - {"PASS", "NOT_REACHED"}


POST = """\
class Worker:
    def draft(self, score_list, token_list):
        score_list = normalize(
            score_list
        )
        parents, draft_tokens = organize(
            score_list, token_list
        )

        return parents, draft_tokens

    def size(self, max_bs: int):
        return max_bs * 2
"""


def _synthetic(tmp_path: Path, pre: str) -> tuple[fromdiff.Plan, Path]:
    """A one-file package ``pkgx`` whose installed (post-fix) source is ``POST``."""
    root = tmp_path / "pkgx"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "worker.py").write_text(POST)
    diff = "".join(
        difflib.unified_diff(
            pre.splitlines(True), POST.splitlines(True), "a/src/pkgx/worker.py", "b/src/pkgx/worker.py"
        )
    )
    return fromdiff.plan(diff, where="fix.patch", pr=1, package="pkgx", repo_prefix="src/pkgx/", source_root=root), root


def test_an_anchor_never_starts_inside_brackets(tmp_path):
    # The fix removed a line right after a call whose arguments sit on their own lines: an anchor
    # starting at the closing bracket would shift the line it restores to the bracket's indent.
    pre = POST.replace("        )\n\n", "        )\n        draft_tokens = draft_tokens.contiguous()\n\n")
    plan, root = _synthetic(tmp_path, pre)
    assert not plan.refusals and fromdiff.check(plan, package="pkgx", source_root=root) == []
    (edit,) = plan.reverts[0].edits
    indents = [len(s) - len(s.lstrip()) for s in edit.match.splitlines() if s.strip()]
    assert indents[0] == min(indents) and edit.match.strip() != ")", edit.match
    assert "draft_tokens = draft_tokens.contiguous()" in edit.replacement


def test_a_signature_change_is_reverted_with_a_note(tmp_path):
    plan, root = _synthetic(tmp_path, POST.replace("def size(self, max_bs: int):", "def size(self, max_bs):"))
    assert not plan.refusals and fromdiff.check(plan, package="pkgx", source_root=root) == []
    assert [r.target for r in plan.reverts] == ["pkgx.worker.Worker.size"]
    assert any("changes the signature of Worker.size" in n.why and not n.blocking for n in plan.notes)


def test_from_diff_never_overwrites_a_file_nor_adds_a_second_toggle_for_a_registered_pr_unless_forced(tmp_path):
    diff, _ = fix_diff("26738")
    patch = tmp_path / "fix.patch"
    patch.write_text(diff)
    hand = tmp_path / "26738.yaml"
    hand.write_text("# hand-written: expect: and caught_by live here\n" * 68)
    # A PR the toggle files register: refused before anything runs, naming the registered file.
    r = run_cli("toggle", "from-diff", str(patch), "--pr", "26738", timeout=60)
    assert_one_line_error(r, "--pr 26738 is already registered", "26738.yaml", "--force")
    # An existing output file: refused, and left as it was.
    r = run_cli("toggle", "from-diff", str(patch), "--pr", "26738", "--force", "-o", str(hand), timeout=60)
    assert r.code == 0, r.err  # --force replaces it, and says the PR is registered
    assert "already registered" in r.err and yaml.safe_load(hand.read_text())["pr"] == 26738
    hand.write_text("# hand-written\n" * 68)
    r = run_cli("toggle", "from-diff", str(patch), "--pr", "90002", "-o", str(hand), timeout=60)
    assert_one_line_error(r, f"--output {hand} exists (68 lines)", "--force")
    assert hand.read_text() == "# hand-written\n" * 68


def test_paths_with_dot_segments_map_as_the_plain_path_and_one_climbing_above_the_root_is_refused():
    diff, _ = fix_diff("26651:clamp")
    rel = "backends/srt/layers/attention/triton_backend.py"
    assert diff.count(rel) == 2, diff[:300]
    plain = _plan(diff)
    assert plain.reverts and not plain.refusals
    for spelled in ("./" + rel, rel.replace("srt/", "srt/./", 1), rel.replace("srt/", "srt/layers/../", 1)):
        p = _plan(diff.replace(rel, spelled))
        assert not p.refusals, [n.why for n in p.refusals]
        assert [(r.target, r.edits) for r in p.reverts] == [(r.target, r.edits) for r in plain.reverts], spelled
    climbing = _plan(diff.replace(rel, "../" + rel))
    (refusal,) = climbing.refusals
    assert not climbing.reverts and refusal.why.startswith("climbs above"), refusal


def test_a_diff_that_only_adds_a_file_is_one_line_and_nothing_is_written(tmp_path):
    patch = tmp_path / "new.patch"
    patch.write_text(
        "diff --git a/backends/srt/extra.py b/backends/srt/./extra.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/backends/srt/./extra.py\n@@ -0,0 +1,2 @@\n+def helper():\n+    return 1\n"
    )
    out = tmp_path / "t.yaml"
    r = run_cli("toggle", "from-diff", str(patch), "--pr", "90001", "-o", str(out), timeout=60)
    assert_one_line_error(r, "only adds new files (backends/srt/extra.py)", "nothing existed before the fix")
    assert not out.exists()
