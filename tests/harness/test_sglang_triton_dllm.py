"""Real sglang 0.5.23's Triton backend in a diffusion LM's block extend (DLLM_EXTEND) on CPU
through the CLI a user runs: every canvas token attends the encoded context and the whole canvas
(both ways), eagerly and through the decode graph runner's capture and padded replay, and a block
extend that reads the canvas as context or lays out the canvas rows at another width is seen in
the graph cells that build it (``_update_dllm_buffers``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_sglang import breaking_patch, by_scenario, require_sglang, run_cli

GLOB = "sglang-triton-dllm*"


def test_every_block_extend_cell_passes_with_its_output_checked(tmp_path: Path):
    require_sglang()
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB)["cells"])
    assert len(cells) == 7, sorted(cells)
    rows = {"sglang-triton-dllm": 12, "sglang-triton-dllm-ps16-bf16": 16, "sglang-triton-dllm-wide": 129}
    for name, cell in cells.items():
        assert cell["verdict"] == "PASS", (name, cell["findings"])
        # Every canvas row compared: 3 requests x 4, 2 x 8, 1 x 129.
        assert cell["error"]["rows"] == rows[name.split("@")[0]], (name, cell["error"])
        assert cell["error"]["bad_rows"] == 0, (name, cell["error"])


@pytest.mark.parametrize(
    "old, new",
    [
        # The context read as the whole sequence: each request reads its own canvas twice.
        (
            "prefix_lens = (seq_lens[:bs] - block_size).clamp_min(0)",
            "prefix_lens = seq_lens[:bs].clamp_min(0)",
        ),
        # The canvas rows laid out one short: each request's queries start a row early.
        (
            "            (bs + 1) * block_size,\n            block_size,",
            "            (bs + 1) * (block_size - 1),\n            block_size - 1,",
        ),
    ],
    ids=["canvas-read-as-context", "canvas-rows-one-short"],
)
def test_a_block_extend_graph_that_misreads_the_canvas_is_seen(tmp_path: Path, old, new):
    require_sglang()
    patch = breaking_patch(tmp_path, "triton_backend", old, new)
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB, "--apply", str(patch))["cells"], patched=True)
    assert len(cells) == 7, sorted(cells)
    for name, cell in cells.items():
        if "cg=eager" in name:  # the eager block extend is an extend's metadata
            assert cell["verdict"] == "PASS", (name, cell["findings"][:2])
            continue
        assert cell["verdict"] in ("DIVERGE", "NAN", "CRASH", "INVARIANT"), (name, cell["verdict"])
        if cell["verdict"] == "DIVERGE":
            assert cell["error"]["bad_rows"] > 0, (name, cell["error"])
