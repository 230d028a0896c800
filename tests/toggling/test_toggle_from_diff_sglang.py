"""``toggle from-diff`` on sglang's own history: the fix's lines, taken from the pre-fix and
post-fix wheels that ``profiles/sglang-0.5.23/SOURCES.md`` names and carried onto the installed
0.5.23, become a toggle that doctor passes and that reverts like the profile's hand-written part.
"""

from __future__ import annotations

import ast
import difflib
import zipfile
from pathlib import Path

import pytest
import sglang_wheel as sw
from builders import ROOT
from clihelp import run_cli
from real_sglang import require_sglang

from sglfix.patching.editor import apply_edits
from sglfix.toggling import fromdiff
from sglfix.toggling.doctor import locate_in
from sglfix.toggling.registry import load_registry

PROFILE = ROOT / "profiles" / "sglang-0.5.23"
ATTN = "srt/layers/attention/"

# The parts whose fix lines are still in 0.5.23 as the wheels have them: 21987 and 26651 had their
# pre-fix code in another function, 26738's lines were re-indented and re-commented since, and
# 26239:backend-slice reverts to lines equivalent to, not the same as, the hand-written part.
# The two wheels differ in more than the fix, so the fix is the change runs that name ``marker``.
CASES = {
    "27460:sizing": (
        ATTN + "flashinfer_mla_backend.py",
        "FlashInferMLAMultiStepDraftBackend.init_cuda_graph_state",
        "kv_indices_width",
    ),
    "27460:assert": (
        ATTN + "flashinfer_mla_backend.py",
        "FlashInferMLAMultiStepDraftBackend.common_template",
        "assert_buffer_fits",
    ),
    "27338:sizing": (
        ATTN + "flashinfer_backend.py",
        "FlashInferMultiStepDraftBackend.init_cuda_graph_state",
        "kv_indices_width",
    ),
    "27338:assert": (
        ATTN + "flashinfer_backend.py",
        "FlashInferMultiStepDraftBackend.common_template",
        "assert_buffer_fits",
    ),
    "26239:worker-helper": (
        "srt/speculative/eagle_worker_v2.py",
        "EagleDraftWorker.draft_forward",
        "per_step_draft_out_cache_loc",
    ),
}
PRE_FIX, POST_FIX = "0.5.12", "0.5.13"


def _span(text: str, qualname: str) -> tuple[int, int]:
    """0-based first line (decorators included) and end of a function or method."""
    body = ast.parse(text).body
    *classes, name = qualname.split(".")
    for cls in classes:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name][-1]
    return min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1, node.end_lineno


def _function(text: str, qualname: str) -> list[str]:
    start, end = _span(text, qualname)
    return text.splitlines()[start:end]


def _wheel_function(version: str, rel: str, qualname: str) -> list[str]:
    try:
        wheel = sw.fetch_wheel(version)
    except sw.WheelFetchError as exc:
        pytest.fail(str(exc), pytrace=False)
    with zipfile.ZipFile(wheel) as zf:
        return _function(zf.read(f"sglang/{rel}").decode(), qualname)


def _undo_fix(pre: list[str], post: list[str], installed: list[str], marker: str) -> list[str]:
    """``installed`` with each pre->post change run that names ``marker`` undone; a run is found
    by its post-fix lines, widened by the wheel's neighbouring lines until it occurs once."""
    key = [line.rstrip() for line in installed]
    edits = []
    opcodes = difflib.SequenceMatcher(None, pre, post, autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal" or not any(marker in line for line in pre[i1:i2] + post[j1:j2]):
            continue
        for k in range(0 if j2 > j1 else 1, 4):
            lo, hi = max(j1 - k, 0), j2 + k
            want = [line.rstrip() for line in post[lo:hi]]
            hits = [s for s in range(len(key) - len(want) + 1) if key[s : s + len(want)] == want]
            if len(hits) == 1:
                edits.append((hits[0], hits[0] + len(want), post[lo:j1] + pre[i1:i2] + post[j2:hi]))
                break
        else:
            pytest.fail(f"the fix's change run at post-fix line {j1 + 1} is not in 0.5.23: {post[j1:j2]}")
    assert edits, f"no change run between the wheels names {marker!r}"
    out = list(installed)
    for start, end, lines in sorted(edits, reverse=True):
        out[start:end] = lines
    return out


def _reverted(root: Path, patches) -> dict[str, list[str]]:
    out: dict[str, str] = {}  # target -> source
    for patch in patches:
        rel = patch.target.split(".")[1:]
        source = out.get(patch.target) or locate_in(root, rel, patch.target)[1]
        out[patch.target] = apply_edits(source=source, edits=patch.edits)
    return {target: fromdiff.normalized(source) for target, source in out.items()}


@pytest.mark.network
@pytest.mark.parametrize("part", sorted(CASES))
def test_the_wheels_fix_diff_reverts_like_the_hand_written_part(part, tmp_path):
    rel, qualname, marker = CASES[part]
    root = Path(require_sglang())
    installed = (root / rel).read_text()
    start, end = _span(installed, qualname)
    lines = installed.splitlines(True)
    reverted = _undo_fix(
        _wheel_function(PRE_FIX, rel, qualname),
        _wheel_function(POST_FIX, rel, qualname),
        _function(installed, qualname),
        marker,
    )
    pre_file = [*lines[:start], *(line + "\n" for line in reverted), *lines[end:]]
    name = f"python/sglang/{rel}"
    patch = tmp_path / "fix.patch"
    patch.write_text("".join(difflib.unified_diff(pre_file, lines, "a/" + name, "b/" + name)))

    pr = part.split(":")[0]
    out = tmp_path / "toggles" / f"{pr}.yaml"
    out.parent.mkdir()
    r = run_cli("--profile", "sglang-0.5.23", "toggle", "from-diff", str(patch), "--pr", pr, "--force", "-o", str(out))
    assert r.code == 0, r.err
    d = run_cli("--profile", "sglang-0.5.23", "doctor", "--source", str(root.parent), "--toggles", str(out.parent))
    assert d.code == 0 and "1/1 checks pass" in d.out, d.out + d.err

    generated = [p for sel in load_registry(str(out.parent)).select(pr) for p in sel.part.patches]
    hand = [p for sel in load_registry(str(PROFILE)).select(part) for p in sel.part.patches]
    assert _reverted(root, generated) == _reverted(root, hand)
