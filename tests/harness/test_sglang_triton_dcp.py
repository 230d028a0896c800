"""Real sglang 0.5.23's Triton backend under decode context parallelism (``dcp_size`` > 1) on CPU
through the CLI a user runs: every rank's metadata is judged after every init, and a backend that
hands a rank another rank's share, reads its whole sequence or reads an extend's new tokens as
cached is seen, in the phase where it happens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_sglang import breaking_patch, by_scenario, require_sglang, run_cli

GLOB = "sglang-triton-dcp-*"


def test_every_rank_of_every_cell_is_judged_and_passes(tmp_path: Path):
    require_sglang()
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB)["cells"])
    assert len(cells) == 10, sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "PASS", (name, cell["findings"])
        messages = [f["message"] for f in cell["findings"]]
        phases = "(capture, replay)" if "cg=graph" in name else "(eager)"
        assert any(m.startswith("every dcp rank's kv_indptr") and m.endswith(phases) for m in messages), messages
        # The forward needs the DCP group: the cell says so rather than claim an output.
        assert any(m.startswith("output not checked: a decode context-parallel forward") for m in messages)


@pytest.mark.parametrize(
    "old, new, hit, needle",
    [
        # Every rank counts rank 0's positions: ranks >= 1 read one too many where a length is odd.
        (
            "return get_dcp_lens(lens, self.dcp_size, self.dcp_rank, start)",
            "return get_dcp_lens(lens, self.dcp_size, 0, start)",
            lambda name: True,
            "kv entries on dcp rank",
        ),
        # The graph path forgets DCP: each rank's captured graph reads the whole sequence.
        (
            "        if self.dcp_size > 1:\n            # DCP: per-rank sharded; write into the same cuda-graph buffers",
            "        if False:\n            # DCP: per-rank sharded; write into the same cuda-graph buffers",
            lambda name: "cg=graph" in name,
            "the rank owns",
        ),
        # An extend's ranks read its new tokens' positions as cached.
        (
            "                    forward_batch.req_pool_indices,\n                    forward_batch.extend_prefix_lens,",
            "                    forward_batch.req_pool_indices,\n                    forward_batch.seq_lens,",
            lambda name: "extend" in name,
            "extend_prefix_lens",
        ),
    ],
    ids=["rank-0-counts", "graph-without-dcp", "extend-reads-new-tokens"],
)
def test_a_rank_reading_what_it_does_not_own_is_seen_where_it_happens(tmp_path: Path, old, new, hit, needle):
    require_sglang()
    patch = breaking_patch(tmp_path, "triton_backend", old, new)
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB, "--apply", str(patch))["cells"], patched=True)
    assert len(cells) == 10, sorted(cells)
    for name, cell in cells.items():
        if not hit(name):
            assert cell["verdict"] == "PASS", (name, cell["findings"][:2])
            continue
        assert cell["verdict"] == "INVARIANT", (name, cell["verdict"], cell["findings"][:2])
        messages = [f["message"] for f in cell["findings"] if f["verdict"] == "INVARIANT"]
        assert any(needle in m for m in messages), (name, messages[:3])


def test_a_backend_built_without_its_rank_is_the_codes_crash(tmp_path: Path):
    # A backend that never sets its rank fails where its own metadata code reads it: a CRASH of the
    # code under test, not a release sglfix cannot drive (ERROR) nor one without DCP (SKIP).
    require_sglang()
    patch = breaking_patch(
        tmp_path,
        "triton_backend",
        "            self.dcp_rank = get_parallel().attn_dcp_rank",
        "            pass",
    )
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB, "--apply", str(patch))["cells"], patched=True)
    assert len(cells) == 10, sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "CRASH", (name, cell["verdict"], cell["findings"][:2])
        assert "no attribute 'dcp_rank'" in cell["findings"][0]["message"], cell["findings"][0]
