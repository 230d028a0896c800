"""Real sglang 0.5.23's FlashMLA multi-step EAGLE draft (``backend: flashmla``, DRAFT_DECODE) on CPU
through the CLI a user runs: the known divergence (every step attends the committed prefix only)
is seen by both judges, the profile's candidate fix clears it in every cell, and a step kernel
handed fewer rows than its batch is the code's CRASH, not a failure of sglfix.
"""

from __future__ import annotations

from pathlib import Path

from builders import ROOT
from real_sglang import breaking_patch, require_sglang, run_cli

FIX = ROOT / "profiles" / "sglang-0.5.23" / "fixes" / "flashmla-draft-step-lens.patch"
PREFIXES = (62, 64, 130, 5)


def test_every_draft_step_misses_its_draft_tokens_eager_and_under_graphs(tmp_path: Path):
    require_sglang()
    cells = run_cli(tmp_path, "-s", "sglang-flashmla-draft@*")["cells"]
    assert len(cells) == 3, [c["scenario"] for c in cells]
    for cell in cells:
        assert cell["verdict"] == "DIVERGE", (cell["scenario"], cell["findings"])
        messages = [f["message"] for f in cell["findings"]]
        # Step i's first row reads the 62-token prefix, where the prefix and i + 1 draft tokens are due.
        for i in range(3):
            want = f"metadata reference: step {i} kv_indptr[1] = {PREFIXES[0]}, expected {PREFIXES[0] + i + 1}"
            assert want in messages, (cell["scenario"], messages)
        # The output shows it too: every branch row of every step.
        assert cell["error"]["bad_rows"] == cell["error"]["rows"] == 3 * len(PREFIXES), cell["error"]


def test_the_candidate_fix_clears_every_cell(tmp_path: Path):
    require_sglang()
    cells = run_cli(tmp_path, "-s", "sglang-flashmla-draft@*", "--apply", str(FIX))["cells"]
    fixed = [c for c in cells if c.get("toggles")]
    assert len(fixed) == 3, [c["scenario"] for c in cells]
    for cell in fixed:
        assert cell["verdict"] == "PASS", (cell["scenario"], cell["findings"])
        assert cell["error"]["bad_rows"] == 0, cell["error"]
        assert any("page tables of 3 draft step(s) x 4 branch row(s)" in f["message"] for f in cell["findings"])


def test_a_replay_whose_steps_get_too_few_rows_crashes_the_code_not_sglfix(tmp_path: Path):
    """The replay view handed to the steps one row short: FlashMLA's kernel would read past its
    block table and lengths (an illegal address on the GPU). Eager cells never build that view."""
    require_sglang()
    patch = breaking_patch(
        tmp_path,
        "flashmla_backend",
        "            bs=forward_batch.batch_size,\n            forward_mode=ForwardMode.DECODE,",
        "            bs=forward_batch.batch_size - 1,\n            forward_mode=ForwardMode.DECODE,",
    )
    cells = run_cli(tmp_path, "-s", "sglang-flashmla-draft@*", "--apply", str(patch))["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    for name, cell in patched.items():
        if "cg=graph" in name:
            assert cell["verdict"] == "CRASH", (name, cell["verdict"], cell["findings"][:2])
        else:
            assert cell["verdict"] == "DIVERGE", (name, cell["verdict"])


def test_a_block_table_narrower_than_a_requests_keys_is_the_codes_crash():
    """A block table sized for fewer pages than a request's keys (a max_seqlen_pad rounded to
    the wrong page size): FlashMLA's kernel reads past the row; the stand-in reports the code's
    OutOfBounds, never an IndexError of its own (sglfix's ERROR)."""
    import pytest
    import torch

    from sglfix.harness import flashmla
    from sglfix.harness.codefault import OutOfBounds

    lens = torch.tensor([70, 10], dtype=torch.int32)
    meta, splits = flashmla.get_mla_metadata(lens, 1, 1)
    q = torch.randn(2, 1, 4, 8)
    cache = torch.randn(4, flashmla.PAGE, 1, 8)
    narrow = torch.tensor([[0], [1]], dtype=torch.int32)  # one page; request 0's 70 keys need two
    with pytest.raises(OutOfBounds, match="block_table is 1 blocks wide; request 0's 70 keys need 2"):
        flashmla.flash_mla_with_kvcache(q, cache, narrow, lens, 8, meta, splits)
    wide = torch.tensor([[0, 2], [1, 3]], dtype=torch.int32)
    out, _ = flashmla.flash_mla_with_kvcache(q, cache, wide, lens, 8, meta, splits)
    assert out.shape == (2, 1, 4, 8) and torch.isfinite(out).all()
