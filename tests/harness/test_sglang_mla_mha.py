"""Real sglang 0.5.23's MLA multi-head prefill (``model.mha_chunk``, ``backend: flashinfer_mla``) on
CPU through the CLI a user runs: sglang's dispatcher takes the one-shot path where the batch fits
and the chunked one where it does not; the one shot passes, the chunked path shows the known
divergence (base-2 log-sum-exps merged as natural ones) on exactly the requests with a cached
prefix, the profile's candidate fix clears it, a chunk runner that plans the wrong query offsets
is seen, and the key is refused in one line where nothing runs it.
"""

from __future__ import annotations

from pathlib import Path

import clihelp
from builders import ROOT
from real_sglang import breaking_patch, require_sglang, run_cli

FIX = ROOT / "profiles" / "sglang-0.5.23" / "fixes" / "fimla-mha-chunk-lse-base.patch"
# sglang-fimla-mha-extend: prefixes 13, 0, 37 with 5, 7, 9 new tokens.
ROWS, PREFIXED_ROWS = 21, 5 + 9


def _cells(tmp_path: Path, *args: str) -> dict[str, dict]:
    cells = run_cli(tmp_path, "-s", "sglang-fimla-mha-extend@*", *args)["cells"]
    return {("+" if c.get("toggles") else "") + c["scenario"]: c for c in cells}


def test_one_shot_passes_and_the_chunked_merge_misweighs_the_prefixed_requests(tmp_path: Path):
    require_sglang()
    cells = _cells(tmp_path)
    assert set(cells) == {"sglang-fimla-mha-extend@mha=1024", "sglang-fimla-mha-extend@mha=24"}, sorted(cells)
    one_shot, chunked = cells["sglang-fimla-mha-extend@mha=1024"], cells["sglang-fimla-mha-extend@mha=24"]
    assert one_shot["verdict"] == "PASS", one_shot["findings"]
    assert one_shot["error"]["rows"] == ROWS and one_shot["error"]["bad_rows"] == 0
    assert chunked["verdict"] == "DIVERGE", chunked["findings"]
    # Every row of the two requests with a prefix, none of the one without.
    assert chunked["error"]["bad_rows"] == PREFIXED_ROWS, chunked["error"]


def test_the_candidate_fix_clears_the_chunked_cell_and_keeps_the_one_shot(tmp_path: Path):
    require_sglang()
    cells = _cells(tmp_path, "--apply", str(FIX))
    for name in ("+sglang-fimla-mha-extend@mha=1024", "+sglang-fimla-mha-extend@mha=24"):
        assert cells[name]["verdict"] == "PASS", (name, cells[name]["findings"])
        assert cells[name]["error"]["bad_rows"] == 0


def test_a_chunk_runner_that_plans_query_offsets_from_the_whole_sequences_is_seen(tmp_path: Path):
    """The ragged wrappers' query offsets counted over the prefix too: both paths read queries
    that are not there (the one shot as much as the chunks)."""
    require_sglang()
    patch = breaking_patch(
        tmp_path,
        "flashinfer_mla_backend",
        "qo_indptr[1 : bs + 1] = torch.cumsum(seq_lens - prefix_lens, dim=0)",
        "qo_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)",
    )
    cells = _cells(tmp_path, "--apply", str(patch))
    for name in ("+sglang-fimla-mha-extend@mha=1024", "+sglang-fimla-mha-extend@mha=24"):
        assert cells[name]["verdict"] in ("DIVERGE", "CRASH"), (name, cells[name]["verdict"], cells[name]["findings"])


def test_a_multi_head_prefill_where_nothing_runs_one_is_one_line_before_any_cell(tmp_path: Path):
    body = "    batch:\n      prefix_lens: [13, 37]\n      extend_lens: [5, 9]\n"
    mla = "    model: {num_heads: 16, dtype: bfloat16, mha_chunk: 24}\n"
    for name, head, needles in (
        (
            "decode",
            "    backend: flashinfer_mla\n    mode: DECODE\n",
            ("model.mha_chunk", "flashinfer_mla in EXTEND only"),
        ),
        (
            "graph",
            "    backend: flashinfer_mla\n    mode: EXTEND\n    cuda_graph: {capture_bs: [2]}\n",
            ("model.mha_chunk", "drop cuda_graph"),
        ),
        (
            "triton",
            "    backend: triton\n    mode: EXTEND\n",
            ("model.mha_chunk",),
        ),
    ):
        path = tmp_path / f"{name}.yaml"
        model = mla if name != "triton" else "    model: {mha_chunk: 24}\n"
        body_here = body if name != "decode" else "    batch:\n      prefix_lens: [13, 37]\n"
        path.write_text(f"scenarios:\n  - name: mha-{name}\n{head}{body_here}{model}")
        r = clihelp.run_cli("--profile", "sglang-0.5.23", "run", "--scenario-file", str(path), "--device", "cpu")
        clihelp.assert_one_line_error(r, *needles)
