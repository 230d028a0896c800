"""A candidate fix (``--apply FIX.patch``) on the reproduction: applied in every worker through the
revert engine, each cell beside the same cell without it, judged in the one judgement; refused in
one line before any cell when it cannot be applied; applied in any process by ``SGLFIX_APPLY``."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.common.codebase import package_dir

REL = "srt/layers/attention/triton_backend.py"
SOURCE = Path(package_dir("sglfix.backends")) / REL
NAME = "triton-decode@cg=eager,gpu_only=off"
DECODE = ("-s", NAME, "--device", "cpu")


def write_fix(tmp_path: Path, name: str, old: str, new: str, *, path: str = "backends/" + REL, count: int = 1) -> str:
    """A unified diff, as ``git diff`` writes it, that replaces ``old`` by ``new`` in the installed file."""
    text = SOURCE.read_text()
    assert text.count(old) == count, old
    after = text.replace(old, new)
    diff = "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3
        )
    )
    file = tmp_path / name
    file.write_text(f"Subject: [PATCH] {name}\n\n---\ndiff --git a/{path} b/{path}\n{diff}")
    return str(file)


BENIGN = ("        o = torch.empty_like(q)\n        if save_kv_cache:\n            forward_batch.token_to_kv_pool.set_kv_buffer(\n                layer,\n                forward_batch.out_cache_loc,\n                k.reshape(-1, layer.tp_k_head_num, layer.head_dim),\n                v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim),\n            )\n        md = self.forward_metadata\n        decode_attention_fwd(", "        o = torch.zeros_like(q)\n        if save_kv_cache:\n            forward_batch.token_to_kv_pool.set_kv_buffer(\n                layer,\n                forward_batch.out_cache_loc,\n                k.reshape(-1, layer.tp_k_head_num, layer.head_dim),\n                v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim),\n            )\n        md = self.forward_metadata\n        decode_attention_fwd(")  # fmt: skip


def _breaking(tmp_path: Path) -> str:
    # forward_decode's softmax scale halved: every decode output changes.
    text = SOURCE.read_text()
    start = text.index("    def forward_decode(")
    tail = text[start:]
    old = tail[: tail.index("        return o\n") + len("        return o\n")]
    assert old.count("            layer.scaling,\n") == 1
    return write_fix(
        tmp_path,
        "halve-scale.patch",
        old,
        old.replace("            layer.scaling,\n", "            layer.scaling * 0.5,\n"),
    )


def test_a_fix_that_changes_nothing_passes_and_every_cell_stands_beside_its_unpatched_twin(tmp_path):
    fix = write_fix(tmp_path, "zeros.patch", *BENIGN)
    out = tmp_path / "r.json"
    r = run_cli("run", *DECODE, "--apply", fix, "--json", str(out), timeout=600, subprocess=True)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    cells = {c["id"]: c for c in data["cells"]}
    assert set(cells) == {f"baseline::{NAME}", f"+zeros::{NAME}"}
    assert cells[f"+zeros::{NAME}"]["verdict"] == "PASS"
    assert data["apply"]["candidates"][0]["id"] == "+zeros"
    assert data["apply"]["candidates"][0]["functions"] == [
        "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode"
    ]
    assert "+zeros: clears nothing; breaks nothing; 1 of 1 patched cell(s) unchanged" in r.out.splitlines()[-1]


def test_a_fix_that_breaks_a_cell_fails_the_run_and_composes_with_a_revert(tmp_path):
    fix = _breaking(tmp_path)
    out = tmp_path / "r.json"
    r = run_cli("run", *DECODE, "--apply", fix, "-r", "26651:clamp", "--json", str(out), timeout=600, subprocess=True)
    assert r.code == 1, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    cells = {c["id"]: c for c in data["cells"]}
    assert set(cells) == {f"26651:clamp::{NAME}", f"+halve-scale,26651:clamp::{NAME}"}
    broken = cells[f"+halve-scale,26651:clamp::{NAME}"]
    assert broken["verdict"] == "DIVERGE" and broken["meaning"] == "broken", broken
    assert "changes PASS to DIVERGE" in broken["why"]
    assert cells[f"26651:clamp::{NAME}"]["verdict"] == "PASS"
    assert data["judged"]["passed"] is False
    assert "1 cell(s) broken by +halve-scale" in r.out.splitlines()[-1]


def test_expect_fixes_fails_when_the_fix_clears_nothing(tmp_path):
    fix = write_fix(tmp_path, "zeros.patch", *BENIGN)
    r = run_cli("run", *DECODE, "--apply", fix, "--expect-fixes", "triton-decode@*", timeout=600, subprocess=True)
    assert r.code == 1, r.out[-3000:] + r.err[-3000:]
    assert "--expect-fixes triton-decode@*: nothing to clear: it passes without the fix too" in r.out.splitlines()[-1]


def test_a_fix_and_a_revert_on_the_same_lines_are_not_built_together_and_the_rest_runs(tmp_path):
    fix = write_fix(
        tmp_path,
        "clamp-method.patch",
        "kv_lens = torch.clamp(kv_lens, min=0)",
        "kv_lens = kv_lens.clamp(min=0)",
        count=2,
    )
    out = tmp_path / "r.json"
    r = run_cli("run", *DECODE, "--apply", fix, "-r", "26651:clamp", "--json", str(out), timeout=600, subprocess=True)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    assert [c["id"] for c in data["cells"]] == [f"26651:clamp::{NAME}"]
    (conflict,) = data["apply"]["conflicts"]
    assert conflict["set"] == "+clamp-method,26651:clamp"
    assert "change the same lines" in conflict["why"]
    assert "+clamp-method,26651:clamp not built" in r.err


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda t: _not_applying(t), ["does not apply to the installed code", "another version"]),
        (
            lambda t: write_fix(t, "elsewhere.patch", *BENIGN, path="python/other/" + REL),
            ["outside the code base (its paths start with backends/)"],
        ),
        (lambda t: _text_file(t), ["not a unified diff"]),
        (lambda t: _module_level(t), ["module-level change", "move the new code into the function"]),
        (lambda t: _new_file(t), ["adds a new file"]),
    ],
    ids=["not-applying", "outside", "not-a-diff", "module-level", "new-file"],
)
def test_a_fix_that_cannot_be_applied_is_one_line_before_any_cell(tmp_path, make, needles):
    fix = make(tmp_path)
    for command in (["run", *DECODE], ["matrix", *DECODE], ["bisect", *DECODE, "-r", "26651"]):
        r = run_cli(*command, "--apply", fix, "--json", str(tmp_path / "r.json"), timeout=120)
        line = assert_one_line_error(r, f"--apply {fix}", *needles)
        assert not (tmp_path / "r.json").exists(), line


def _binary_diff(tmp_path: Path) -> str:
    f = tmp_path / "image.patch"
    f.write_text(
        "diff --git a/backends/srt/logo.png b/backends/srt/logo.png\nindex 1111111..2222222 100644\n"
        "Binary files a/backends/srt/logo.png and b/backends/srt/logo.png differ\n"
    )
    return str(f)


def _empty(tmp_path: Path) -> str:
    f = tmp_path / "empty.patch"
    f.write_text("")
    return str(f)


def _nul_bytes(tmp_path: Path) -> str:
    f = tmp_path / "fix.patch"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    return str(f)


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda t: str(t / "missing.patch"), ["missing.patch does not exist"]),
        (_empty, ["is empty", "git show"]),
        (_binary_diff, ["backends/srt/logo.png is a binary file"]),
        (_nul_bytes, ["is binary (holds NUL bytes)", "give a unified diff as text"]),
    ],
    ids=["missing", "empty", "binary-diff", "binary-file"],
)
def test_a_missing_empty_or_binary_fix_file_is_one_line_before_any_cell(tmp_path, make, needles):
    fix = make(tmp_path)
    r = run_cli("run", *DECODE, "--apply", fix, "--json", str(tmp_path / "r.json"), timeout=120)
    assert_one_line_error(r, "--apply", fix, *needles)
    assert not (tmp_path / "r.json").exists()


def test_expect_fixes_that_names_no_selected_scenario_is_refused_before_any_cell(tmp_path):
    fix = write_fix(tmp_path, "zeros.patch", *BENIGN)
    out = tmp_path / "r.json"
    for command in ("run", "matrix"):
        r = run_cli(
            command, *DECODE, "--apply", fix, "--expect-fixes", "triton-decod@*", "--json", str(out), timeout=120
        )
        assert_one_line_error(r, "--expect-fixes triton-decod@*: matches none of the 1 selected scenario(s)")
        assert not out.exists()


def test_expect_fixes_needs_apply():
    r = run_cli("run", *DECODE, "--expect-fixes", "x", timeout=60)
    assert_one_line_error(r, "--expect-fixes", "--apply FIX.patch")


def _not_applying(tmp_path: Path) -> str:
    fix = Path(write_fix(tmp_path, "stale.patch", *BENIGN))
    # The diff of another version: its context lines are not in the installed file.
    text = fix.read_text()
    line = " q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)"
    assert text.count(line) == 1
    fix.write_text(text.replace(line, " q = q.view(-1, layer.tp_q_head_num, layer.head_dim)"))
    return str(fix)


def _text_file(tmp_path: Path) -> str:
    f = tmp_path / "notes.patch"
    f.write_text("Just some notes, no diff here.\n")
    return str(f)


def _module_level(tmp_path: Path) -> str:
    text = SOURCE.read_text()
    anchor = "@dataclass\nclass ForwardMetadata:"
    assert text.count(anchor) == 1
    return write_fix(tmp_path, "helper.patch", anchor, "HELPER_LIMIT = 4\n\n\n" + anchor)


def _new_file(tmp_path: Path) -> str:
    f = tmp_path / "newfile.patch"
    f.write_text(
        "diff --git a/backends/srt/extra.py b/backends/srt/extra.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/backends/srt/extra.py\n@@ -0,0 +1,2 @@\n+def helper():\n+    return 1\n"
    )
    return str(f)


def test_matrix_and_bisect_with_a_fix_that_changes_nothing(tmp_path):
    fix = write_fix(tmp_path, "zeros.patch", *BENIGN)
    out = tmp_path / "m.json"
    r = run_cli("matrix", *DECODE, "--apply", fix, "--json", str(out), timeout=900, subprocess=True)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    data = json.loads(out.read_text())
    sets = list(dict.fromkeys(c["id"].split("::")[0] for c in data["cells"]))
    # Each set of the matrix, then the same set with the fix.
    assert sets[:2] == ["baseline", "+zeros"] and all(
        sets[i + 1] == "+zeros," + sets[i] for i in range(2, len(sets), 2)
    ), sets
    assert "gate passed" in r.out.splitlines()[-1] and "breaks nothing" in r.out.splitlines()[-1]
    b = run_cli(
        "bisect",
        *DECODE,
        "-r",
        "26651,26738",
        "--apply",
        fix,
        "--json",
        str(tmp_path / "b.json"),
        timeout=900,
        subprocess=True,
    )
    assert b.code == 0, b.out[-3000:] + b.err[-3000:]
    applied = json.loads((tmp_path / "b.json").read_text())["apply"]
    assert applied["same"] is True and not applied["only_without_fix"] and not applied["only_with_fix"]


def test_sglfix_apply_applies_the_fix_in_a_plain_process(tmp_path):
    fix = _breaking(tmp_path)
    code = (
        "import sglfix, sglfix.backends.srt.layers.attention.triton_backend as t; "
        "print(sglfix.reverted_ids(), 'scaling' in t.TritonAttnBackend.forward_decode.__code__.co_names)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_PROFILE")}
    env.update(SGLFIX_APPLY=fix, SGLFIX_PROFILE="reproduction", TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['+halve-scale'] True", r.stdout
    # The applied code is the fixed function: its constants hold the 0.5.
    code2 = "import sglfix.backends.srt.layers.attention.triton_backend as t; print(0.5 in t.TritonAttnBackend.forward_decode.__code__.co_consts)"
    r2 = subprocess.run(
        [sys.executable, "-c", code2], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r2.stdout.strip() == "True", r2.stderr
    env["SGLFIX_APPLY"] = str(tmp_path / "missing.patch")
    r3 = subprocess.run(
        [sys.executable, "-c", "print('ran')"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r3.returncode == 2 and "ran" not in r3.stdout
    assert r3.stderr.strip().startswith("sglfix: error: SGLFIX_APPLY:") and len(r3.stderr.strip().splitlines()) == 1


def test_reversing_a_diff_twice_gives_the_same_changes(tmp_path):
    from unidiff import PatchSet

    from sglfix.toggling.candidate import reverse_diff

    fix = Path(_breaking(tmp_path)).read_text()
    _, once = reverse_diff(fix, where="x")
    _, twice = reverse_diff(once, where="x")

    def changes(text: str) -> list:
        return [
            (h.source_start, h.target_start, [(line.line_type, line.value) for line in h])
            for f in PatchSet(text)
            for h in f
        ]

    assert changes(twice) == changes(fix)
    assert changes(once) != changes(fix)


def test_shards_of_a_run_with_a_fix_merge_into_the_same_judgement(tmp_path):
    fix = _breaking(tmp_path)
    parts = []
    for i in (1, 2):
        out = tmp_path / f"s{i}.json"
        run_cli("run", "-s", "triton-decode@cg=eager*", "--device", "cpu", "--apply", fix, "--shard", f"{i}/2",
                "--json", str(out), timeout=600, subprocess=True)  # fmt: skip
        parts.append(str(out))
    merged = tmp_path / "m.json"
    r = run_cli("report", "merge", *parts, "-o", str(merged), "--gate", timeout=120)
    data = json.loads(merged.read_text())
    assert data["apply"]["candidates"][0]["id"] == "+halve-scale"
    broken = [c["id"] for c in data["cells"] if c.get("meaning") == "broken"]
    assert len(broken) == 2 and all(b.startswith("+halve-scale::") for b in broken), data["cells"]
    assert data["judged"]["fixes"] == ["+halve-scale"] and r.code == 1


def test_the_fix_line_counts_cells_skipped_here_once_as_the_judgement_does():
    """A run with a fix where a scenario SKIPs here: the SKIPs (with and without the fix) are
    counted once in the line, by the judgement's own count; the fix's part counts the patched
    cells that ran to a verdict. The same for ERROR."""
    import re

    from sglfix.report.outcome import Meaning, judge

    def cell(toggles, scenario, verdict):
        return {"toggles": toggles, "scenario": scenario, "verdict": verdict}

    cells = [
        cell([], "a", "PASS"),
        cell(["+fix"], "a", "PASS"),
        cell([], "b", "SKIP"),
        cell(["+fix"], "b", "SKIP"),
        cell([], "c", "ERROR"),
        cell(["+fix"], "c", "ERROR"),
    ]
    report = {"cells": cells, "apply": {"candidates": [{"id": "+fix"}], "expect_fixes": [], "over": []}}
    judgement = judge(report, mode="findings")
    line = judgement.outcome()
    assert [int(n) for n in re.findall(r"(\d+) skipped here", line)] == [judgement.count(Meaning.SKIPPED)] == [2], line
    assert [int(n) for n in re.findall(r"(\d+) ERROR", line)] == [judgement.count(Meaning.ERROR)] == [2], line
    assert "1 of 1 patched cell(s) that ran to a verdict unchanged" in line, line
