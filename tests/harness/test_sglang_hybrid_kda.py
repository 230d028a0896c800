"""Real sglang 0.5.23's hybrid over Kimi-Linear's delta attention (``model.linear_attention: kda``)
on CPU through the CLI a user runs: its state slots and query offsets are judged as the gated
delta net's, and its prefill under breakable prefill graphs has the bucket tables it captured
judged after every capture and replay, so a table built wrong, a padded row that points into a
sequence or a replay that leaves the captured tables behind is seen where it happens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_sglang import breaking_patch, by_scenario, require_sglang, run_cli

GLOB = "sglang-hybrid-kda*"
# The breakable prefill graphs: every one captures a bucket whose tables hold sequence rows past
# its capture batch's, and replays.
BREAKABLE = (
    "sglang-hybrid-kda-extend@cg=graph",
    "sglang-hybrid-kda-extend@cg=graph-padded",
    "sglang-hybrid-kda-extend-cap",
    "sglang-hybrid-kda-extend-track@cg=graph-padded,host=on",
    "sglang-hybrid-kda-extend-track@cg=graph-padded,host=off",
)
TRACKED = BREAKABLE[3:]


def test_every_cell_is_judged_and_passes(tmp_path: Path):
    require_sglang()
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB)["cells"])
    assert len(cells) == 14, sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "PASS", (name, cell["findings"])
        messages = [f["message"] for f in cell["findings"]]
        tables = any("breakable prefill graph's bucket tables" in m for m in messages)
        assert tables == (name in BREAKABLE), (name, messages)
        if "target-verify" in name:
            assert any(m.startswith("post-verify commit: ") for m in messages), messages


@pytest.mark.parametrize(
    "module, old, new, hit, needle",
    [
        # Padded sequences start at 0 instead of at the batch's end: their empty rows overlap.
        (
            "linear/kda_prefill_graph",
            "cu[bs + 1 :] = total",
            "cu[bs + 1 :] = 0",
            BREAKABLE,
            "cu_seqlens[",
        ),
        # A padded sequence's state slot is slot 0, not the pad slot: its kernels write a live state.
        (
            "linear/kda_prefill_graph",
            "self.cache_indices[bs:].fill_(PAD_SLOT_ID)",
            "self.cache_indices[bs:].fill_(0)",
            BREAKABLE,
            "cache_indices[",
        ),
        # A replay rebuilds eager metadata instead of refreshing its bucket's captured tables.
        (
            "hybrid_linear_attn_backend",
            "        if capture_metadata is not None:\n            self.linear_attn_backend.refresh_prefill_graph_metadata(",
            "        if False:\n            self.linear_attn_backend.refresh_prefill_graph_metadata(",
            BREAKABLE,
            "no bucket tables",
        ),
        # A final snapshot taken as a chunk state: the request's cached state is a chunk behind.
        (
            "linear/kda_prefill_graph",
            "                track_mode[row] = TRACK_FINAL_STATE",
            "                track_mode[row] = TRACK_CHUNK_STATE",
            TRACKED,
            "track_mode[",
        ),
    ],
    ids=["padded-offsets", "padded-slot", "replay-without-refresh", "final-as-chunk"],
)
def test_a_wrong_bucket_table_is_seen_where_it_happens(tmp_path: Path, module, old, new, hit, needle):
    require_sglang()
    patch = breaking_patch(tmp_path, module, old, new)
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB, "--apply", str(patch))["cells"], patched=True)
    assert len(cells) == 14, sorted(cells)
    for name, cell in cells.items():
        if name not in hit:
            assert cell["verdict"] == "PASS", (name, cell["findings"][:2])
            continue
        assert cell["verdict"] == "DIVERGE", (name, cell["verdict"], cell["findings"][:2])
        messages = [f["message"] for f in cell["findings"] if f["verdict"] == "DIVERGE"]
        assert any(needle in m for m in messages), (name, messages[:3])


KIMI = "sglang-hybrid-kimi*"
# The chunked multi-head prefill's known upstream merge bug (known/divergences.yaml).
KIMI_KNOWN = "sglang-hybrid-kimi-extend-mha@mha=24"


def test_kimi_linear_cells_pass_but_the_known_chunked_merge(tmp_path: Path):
    """Kimi-Linear's shape, MLA full attention under the hybrid: every cell passes, its MLA schedule
    and its KDA metadata judged, the verify followed by the commit; the chunked multi-head prefill
    shows the FlashInfer-MLA merge bug it shares with sglang-fimla-mha-extend@mha=24."""
    require_sglang()
    cells = by_scenario(run_cli(tmp_path, "-s", KIMI)["cells"])
    assert len(cells) == 8, sorted(cells)
    for name, cell in cells.items():
        messages = [f["message"] for f in cell["findings"]]
        assert any(m.startswith("metadata reference: the MLA schedule of ") for m in messages), (name, messages)
        assert any(m.startswith("metadata reference: the linear layers' state slots") for m in messages), messages
        if name == KIMI_KNOWN:
            assert cell["verdict"] == "DIVERGE", (name, cell["findings"][:3])
            continue
        assert cell["verdict"] == "PASS", (name, cell["findings"])
        if "target-verify" in name:
            assert any(m.startswith("post-verify commit: ") for m in messages), messages


def test_the_hybrid_hands_the_mla_prefill_its_chunk_metadata(tmp_path: Path):
    """A hybrid that drops the MLA child's chunk metadata (init_mha_chunk_metadata not delegated)
    leaves the multi-head prefill's ragged wrappers unplanned: both prefill cells fail."""
    require_sglang()
    patch = breaking_patch(
        tmp_path,
        "hybrid_linear_attn_backend",
        "        if init is not None:\n            init(forward_batch, disable_flashinfer_ragged)",
        "        if False:\n            init(forward_batch, disable_flashinfer_ragged)",
    )
    report = run_cli(tmp_path, "-s", "sglang-hybrid-kimi-extend-mha*", "--apply", str(patch))
    cells = by_scenario(report["cells"], patched=True)
    assert sorted(cells) == ["sglang-hybrid-kimi-extend-mha@mha=1024", KIMI_KNOWN], sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "CRASH", (name, cell["verdict"], cell["findings"][:2])
        messages = [f["message"] for f in cell["findings"]]
        assert any("called before plan()" in m for m in messages), (name, messages[:2])
