"""Real sglang 0.5.23's Triton multi-step EAGLE draft (``TritonMultiStepDraftBackend``, through
``sglang.triton_draft``) on CPU through the CLI a user runs: eager and graph cells pass with every
step's draft attention run by the Triton kernels and compared, and a replay that does not rebuild
the page tables its captured steps read is caught.
"""

from __future__ import annotations

from pathlib import Path

from real_sglang import breaking_patch, require_sglang, run_cli

_run = run_cli


def test_every_triton_draft_cell_passes_with_attention_run_and_page_tables_judged(tmp_path):
    require_sglang()
    cells = {c["scenario"]: c for c in _run(tmp_path, "-s", "sglang-triton-draft@*")["cells"]}
    assert len(cells) == 6, sorted(cells)
    for name, c in cells.items():
        assert c["verdict"] == "PASS", (name, c["findings"][:3])
        topk = 4 if "'topk':4" in name else 1
        # Two draft steps attend (the third token is the last step's output), each branch row.
        assert c["error"]["rows"] == 2 * 3 * topk and c["error"]["bad_rows"] == 0, (name, c["error"])
        assert any(
            f["message"] == "metadata reference: the page tables of 2 draft step(s) x "
            f"{3 * topk} branch row(s) are each branch's prefix then its own draft path"
            for f in c["findings"]
        ), (name, c["findings"])


def test_a_replay_that_leaves_the_captured_page_tables_stale_is_caught(tmp_path):
    require_sglang()
    source = Path(require_sglang()) / "srt" / "layers" / "attention" / "triton_backend.py"
    old = "            self.common_template(forward_batch, None, None)\n"
    assert source.read_text().count(old) == 1, "triton_backend.py no longer rebuilds the draft page tables this way"
    patch = breaking_patch(tmp_path, "triton_backend", old, "            pass\n")
    report = _run(tmp_path, "-s", "sglang-triton-draft@*", "--apply", str(patch))
    patched = {c["scenario"]: c for c in report["cells"] if c.get("toggles")}
    for name, c in patched.items():
        if "cg=eager" in name:
            assert c["verdict"] == "PASS", (name, c["findings"][:2])  # eager never replays
        else:
            assert c["verdict"] in ("DIVERGE", "INVARIANT"), (name, c["verdict"], c["findings"][:2])


def test_a_capture_that_hands_its_steps_no_page_table_is_caught(tmp_path):
    """Capture and replay bodies swapped: the replay still rebuilds every step's page table (the
    replayed attention passes), but the captured draft forward ran its steps on none."""
    require_sglang()
    old = "        if in_capture:\n            inner_fb = build_inner_fb_view(\n"
    patch = breaking_patch(
        tmp_path, "triton_backend", old, "        if not in_capture:\n            inner_fb = build_inner_fb_view(\n"
    )
    report = _run(tmp_path, "-s", "sglang-triton-draft@*", "--apply", str(patch))
    patched = {c["scenario"]: c for c in report["cells"] if c.get("toggles")}
    assert len(patched) == 6, sorted(patched)
    for name, c in patched.items():
        if "cg=eager" in name:
            assert c["verdict"] == "PASS", (name, c["findings"][:2])
            continue
        assert c["verdict"] == "INVARIANT", (name, c["verdict"], c["findings"][:2])
        assert any("step 0 was handed no page table" in f["message"] for f in c["findings"]), c["findings"][:3]
