"""Real sglang 0.5.23's FlashInfer-MLA backend in the modes besides the multi-step draft
(``sglang.flashinfer_mla_dense``: DECODE, EXTEND, TARGET_VERIFY, DRAFT_EXTEND_V2, eager and graph),
its TorchNativeAttnBackend (``sglang.torch_native``), the FlashInfer backend's encoder-decoder
path (``update_cross_attention``: ``sglang-fi-cross-*``, the self and the cross layer) and its
multi-item scoring (``_process_multi_item_scoring``: ``sglang-fi-mis-*``, ``sglang-fi-mixed-mis``),
on CPU through the CLI a user runs: every built-in scenario passes, and each judge fails when the code
under test is made wrong (a candidate fix that breaks it, applied with ``--apply``), including a
fault that only exists while a graph is captured and that replay rebuilds.
"""

from __future__ import annotations

import pytest
from real_sglang import breaking_patch, require_sglang, run_cli

_run, _breaking_patch = run_cli, breaking_patch


def _patched(report: dict) -> dict[str, dict]:
    return {c["scenario"]: c for c in report["cells"] if c.get("toggles")}


def test_every_fimla_and_torch_native_scenario_passes_with_its_judges_named(tmp_path):
    require_sglang()
    report = _run(tmp_path, "-s", "sglang-fimla-*", "-s", "sglang-torch-*")
    # The multi-head prefill has its own judge and known divergence (test_sglang_mla_mha.py).
    cells = {c["scenario"]: c for c in report["cells"] if "-mha-" not in c["scenario"]}
    assert any(n.startswith("sglang-fimla-") for n in cells) and any(n.startswith("sglang-torch-") for n in cells)
    failed = {n: (c["verdict"], c["findings"][:2]) for n, c in cells.items() if c["verdict"] != "PASS"}
    assert not failed, failed
    for name, c in cells.items():
        assert c["error"]["rows"] > 0 and c["error"]["bad_rows"] == 0, (name, c["error"])
        assert c["error"]["max_abs_err"] < (1.5e-2 if "fimla" in name else 2e-3), (name, c["error"])
        if name.startswith("sglang-fimla-"):
            # Every init's schedule was judged against its batch: capture and replay for graphs.
            inits = 2 if "cg=graph" in name or "decode-full" in name else 1
            refs = [f["message"] for f in c["findings"] if "metadata reference" in f["message"]]
            assert refs == [
                f"metadata reference: the MLA schedule of {inits} metadata init(s) (query rows, key lengths, "
                "each row's kv_indices) is its batch's"
            ], (name, c["findings"])


def test_a_schedule_wrong_only_at_capture_is_seen_though_replay_rebuilds_it(tmp_path):
    """One more key per request planned at capture only: the replayed output is right (replay
    re-plans), the capture's schedule is not the capture batch's, and the cell says so."""
    require_sglang()
    patch = _breaking_patch(
        tmp_path,
        "flashinfer_mla_backend",
        "self.fast_plan_kv_len_arr_cpu[:bs] = seq_lens_cpu[:bs] + ndt",
        "self.fast_plan_kv_len_arr_cpu[:bs] = seq_lens_cpu[:bs] + ndt + int(in_capture)",
    )
    cells = _patched(_run(tmp_path, "-s", "sglang-fimla-target-verify@cg=graph", "--apply", str(patch)))
    cell = cells["sglang-fimla-target-verify@cg=graph"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    assert cell["error"]["bad_rows"] == 0, "the replayed output alone does not show it"
    message = next(f["message"] for f in cell["findings"] if f["verdict"] == "DIVERGE")
    assert message.startswith("metadata reference: metadata init 1 of 2: row 0 is planned"), message


def test_torch_native_output_shows_a_request_reading_another_requests_rows(tmp_path):
    require_sglang()
    # The decode loop's (the second) read of a request's row: every request reads request 0's.
    patch = _breaking_patch(
        tmp_path,
        "torch_native_backend",
        "req_pool_idx = req_pool_indices[seq_idx]",
        "req_pool_idx = req_pool_indices[0]",
        occurrence=2,
    )
    cells = _patched(_run(tmp_path, "-s", "sglang-torch-decode@ps=1", "--apply", str(patch)))
    cell = cells["sglang-torch-decode@ps=1"]
    assert cell["verdict"] in ("DIVERGE", "CRASH"), cell["findings"]
    assert cell["verdict"] == "CRASH" or cell["error"]["bad_rows"] >= 1, cell["error"]


# FlashInfer's encoder-decoder path: update_cross_attention of the decode and the prefill updater.
_DECODE_CROSS = (
    "paged_kernel_lens = encoder_lens\n"
    "                kv_start_idx = torch.zeros_like(encoder_lens)\n"
    "                seq_lens_sum = encoder_lens.sum().item()\n"
    "                kv_lens_cpu = encoder_lens_cpu"
)
_PREFILL_CROSS = (
    "paged_kernel_lens = encoder_lens\n"
    "                kv_start_idx = torch.zeros_like(encoder_lens)\n"
    "                paged_kernel_lens_sum"
)


def _verdicts(cells: dict[str, dict]) -> dict[str, str]:
    return {name: c["verdict"] for name, c in cells.items()}


def test_every_flashinfer_cross_attention_scenario_passes(tmp_path):
    """An encoder-decoder model's self and cross layer, decode (eager, graph, padded graph) and
    extend: each output compared with its reference, every row."""
    require_sglang()
    cells = {c["scenario"]: c for c in _run(tmp_path, "-s", "sglang-fi-cross-*")["cells"]}
    assert len(cells) == 8, sorted(cells)
    failed = {n: (c["verdict"], c["findings"][:2]) for n, c in cells.items() if c["verdict"] != "PASS"}
    assert not failed, failed
    for name, c in cells.items():
        assert c["error"]["rows"] == (3 if "-decode@" in name else 21) and c["error"]["bad_rows"] == 0, (name, c)


def test_a_cross_wrapper_planned_over_the_decoder_tokens_is_seen(tmp_path):
    """The decode updater plans its cross wrapper over each row's first seq_lens entries (the
    decoder's lengths from the row's start) instead of its encoder_lens: the cross layer's cells
    diverge, eager and replayed, the self layer's pass."""
    require_sglang()
    patch = _breaking_patch(
        tmp_path,
        "flashinfer_backend",
        _DECODE_CROSS,
        "paged_kernel_lens = seq_lens\n"
        "                kv_start_idx = torch.zeros_like(encoder_lens)\n"
        "                kv_lens_cpu = seq_lens_cpu",
    )
    cells = _patched(_run(tmp_path, "-s", "sglang-fi-cross-decode@*", "--apply", str(patch)))
    # The cross layer's output shows it; the decode plans' judge sees the cross wrapper in the self
    # layer's cells too (the plan is the batch's, whichever layer a cell runs).
    assert _verdicts(cells) == {
        f"sglang-fi-cross-decode@cg={cg},cross={cross}": "DIVERGE"
        for cg in ("eager", "graph", "graph-padded")
        for cross in ("off", "on")
    }, {n: c["findings"][:1] for n, c in cells.items()}
    for name, c in cells.items():
        assert c["error"]["bad_rows"] == (3 if name.endswith("cross=on") else 0), (name, c["error"])
        assert any(
            f["message"].startswith("metadata reference: decode plan, metadata init 1 of ")
            and "wrapper 1 row 0" in f["message"]
            for f in c["findings"]
        ), c["findings"]


def test_a_self_wrapper_that_reads_from_the_rows_start_is_seen(tmp_path):
    """The decode updater plans its self wrapper without the encoder offset (kv_start_idx 0): the
    self layer reads the encoder's slots as its first keys. Its cells diverge, eager and replayed
    (the replay's offsets come from the graph runner's encoder_lens buffer), the cross layer's pass."""
    require_sglang()
    patch = _breaking_patch(
        tmp_path,
        "flashinfer_backend",
        "kv_start_idx = encoder_lens\n                kv_lens_cpu = seq_lens_cpu",
        "kv_start_idx = torch.zeros_like(encoder_lens)\n                kv_lens_cpu = seq_lens_cpu",
    )
    cells = _patched(_run(tmp_path, "-s", "sglang-fi-cross-decode@*", "--apply", str(patch)))
    # The self layer's output shows it; the decode plans' judge sees the self wrapper in the cross
    # layer's cells too.
    assert _verdicts(cells) == {
        f"sglang-fi-cross-decode@cg={cg},cross={cross}": "DIVERGE"
        for cg in ("eager", "graph", "graph-padded")
        for cross in ("off", "on")
    }, {n: c["findings"][:1] for n, c in cells.items()}
    for name, c in cells.items():
        assert c["error"]["bad_rows"] == (3 if name.endswith("cross=off") else 0), (name, c["error"])


def test_a_decode_plan_wrong_only_at_capture_is_seen_though_replay_rebuilds_it(tmp_path):
    """The decode wrappers planned over one key more than the capture batch's rows hold: every
    replay plans them again, so no replayed output shows it; the plan judged at capture does."""
    require_sglang()
    old = "        seq_lens = forward_batch.seq_lens\n        seq_lens_cpu = forward_batch.seq_lens_cpu\n"
    new = "        seq_lens = forward_batch.seq_lens + 1 if in_capture else forward_batch.seq_lens\n        seq_lens_cpu = forward_batch.seq_lens_cpu\n"
    patch = _breaking_patch(tmp_path, "flashinfer_backend", old, new)
    cells = _patched(_run(tmp_path, "-s", "sglang-fi-decode@*", "-s", "sglang-fi-decode-swa@*", "--apply", str(patch)))
    assert len(cells) == 5, sorted(cells)
    for name, c in cells.items():
        if "cg=eager" in name:
            assert c["verdict"] == "PASS", (name, c["findings"][:2])
            continue
        assert c["verdict"] == "DIVERGE" and c["error"]["bad_rows"] == 0, (name, c["verdict"], c["error"])
        message = next(f["message"] for f in c["findings"] if f["verdict"] == "DIVERGE")
        assert message.startswith("metadata reference: decode plan, metadata init 1 of 2: wrapper 0 row 0"), message
        assert "reads 2 keys, its layer reads 1" in message, message


@pytest.mark.parametrize(
    "old,new,wrong",
    [
        (
            _PREFILL_CROSS,
            _PREFILL_CROSS.replace("paged_kernel_lens = encoder_lens", "paged_kernel_lens = seq_lens"),
            "on",
        ),
        (
            "kv_start_idx = encoder_lens\n                paged_kernel_lens_sum",
            "kv_start_idx = torch.zeros_like(encoder_lens)\n                paged_kernel_lens_sum",
            "off",
        ),
    ],
    ids=["cross-over-decoder", "self-from-row-start"],
)
def test_an_extend_planned_without_the_encoder_layout_is_seen(tmp_path, old, new, wrong):
    """The prefill updater's two wrappers likewise: the cross wrapper over the decoder's lengths,
    or the self wrapper from the row's start; only the layer whose wrapper is wrong diverges."""
    require_sglang()
    patch = _breaking_patch(tmp_path, "flashinfer_backend", old, new)
    cells = _patched(_run(tmp_path, "-s", "sglang-fi-cross-extend@*", "--apply", str(patch)))
    assert _verdicts(cells) == {
        f"sglang-fi-cross-extend@cross={cross}": "DIVERGE" if cross == wrong else "PASS" for cross in ("off", "on")
    }, {n: c["findings"][:1] for n, c in cells.items()}


# FlashInfer's multi-item scoring (--enable-mis): _process_multi_item_scoring.
_SCORED = ("sglang-fi-mis-batch", "sglang-fi-mis-single", "sglang-fi-mis-edge", "sglang-fi-mis-long")
_MIS_ROWS = dict(zip(_SCORED, (28, 14, 19, 209)), **{"sglang-fi-mis-unscored": 13})
_MIS_FIX = "profiles/sglang-0.5.23/fixes/flashinfer-mis-itemless-request.patch"


def test_every_multi_item_scenario_passes_and_a_request_without_items_is_the_known_divergence(tmp_path):
    """Each item mask in the output (every row, delimiters too) and the positions and
    max_item_len the backend leaves, judged; the batch with a request without delimiters shows
    its shifted arrays (the last request's prefix length read past its allocation), and the
    profile's candidate fix clears it and changes nothing else."""
    from builders import ROOT

    require_sglang()
    report = _run(tmp_path, "-s", "sglang-fi-mis-*", "-s", "sglang-fi-mixed-mis", "--apply", str(ROOT / _MIS_FIX))
    base = {c["scenario"]: c for c in report["cells"] if not c.get("toggles")}
    fixed = _patched(report)
    assert set(base) == set(fixed) == {*_MIS_ROWS, "sglang-fi-mixed-mis"}, sorted(base)
    for name, rows in _MIS_ROWS.items():
        for cell in (base[name], fixed[name]):
            assert cell["verdict"] == "PASS", (name, cell["findings"][:2])
            assert cell["error"]["rows"] == rows and cell["error"]["bad_rows"] == 0, (name, cell["error"])
            assert any(f["message"].startswith("metadata reference: the positions of every")
                       for f in cell["findings"]), (name, cell["findings"])  # fmt: skip
    mixed = base["sglang-fi-mixed-mis"]
    assert mixed["verdict"] == "CRASH", mixed["findings"][:2]
    assert "prefix_len_ptr read past the end of its allocation: entry 1" in mixed["findings"][0]["message"]
    assert fixed["sglang-fi-mixed-mis"]["verdict"] == "PASS", fixed["sglang-fi-mixed-mis"]["findings"][:2]
    assert fixed["sglang-fi-mixed-mis"]["error"]["bad_rows"] == 0


def _mis_cells(tmp_path, old: str, new: str) -> dict[str, dict]:
    patch = _breaking_patch(tmp_path, "flashinfer_backend", old, new)
    return _patched(_run(tmp_path, "-s", "sglang-fi-mis-*", "--apply", str(patch)))


def test_an_item_mask_off_by_one_is_seen_in_every_output(tmp_path):
    """Each token's position in its item one too high: an item's token also sees the delimiter
    before it, a delimiter itself; every cell's output diverges, its positions still right."""
    require_sglang()
    cells = _mis_cells(
        tmp_path,
        "token_pos_in_items_ptr.append(pos_within_item.to(torch.uint16))",
        "token_pos_in_items_ptr.append((pos_within_item + 1).to(torch.uint16))",
    )
    assert _verdicts(cells) == {n: "DIVERGE" if n in _SCORED else "PASS" for n in _MIS_ROWS}, sorted(cells)
    for name in _SCORED:
        assert cells[name]["error"]["bad_rows"] > 0, (name, cells[name]["error"])


def test_a_prefix_length_without_the_cached_prefix_is_seen(tmp_path):
    """prefix_len from the first delimiter alone (without extend_prefix_lens_cpu): every scenario
    has a request on a cached prefix, whose mask then starts too early (reading its positions past
    the array where the suffix outgrows it: the code's CRASH) and whose item tokens are placed
    after the query's new tokens only."""
    require_sglang()
    cells = _mis_cells(tmp_path, "prefix_cache_lens[i] if prefix_cache_lens is not None else 0", "0")
    assert set(cells) == set(_MIS_ROWS), sorted(cells)
    for name, c in cells.items():
        want = ("DIVERGE", "CRASH") if name in _SCORED else ("PASS",)
        assert c["verdict"] in want, (name, c["verdict"], c["findings"][:1])
    assert (
        "token 165 (request 1, item 0 token 0) is at position 7, want 30"
        in cells["sglang-fi-mis-long"]["findings"][0]["message"]
    )


def test_positions_rewritten_off_by_one_are_seen_by_the_metadata_reference(tmp_path):
    """Every item token one position late: the output cannot show it (the layer has no rotary
    embedding); the metadata reference does, naming the token."""
    require_sglang()
    cells = _mis_cells(tmp_path, "prefix_len + pos_within_item - 1", "prefix_len + pos_within_item")
    assert _verdicts(cells) == {n: "DIVERGE" if n in _SCORED else "PASS" for n in _MIS_ROWS}, sorted(cells)
    for name in _SCORED:
        c = cells[name]
        assert c["error"]["bad_rows"] == 0 and "is at position" in c["findings"][0]["message"], (name, c["findings"][0])
    assert cells["sglang-fi-mis-batch"]["findings"][0]["message"].endswith(
        "token 6 (request 0, item 0 token 0) is at position 6, want 5"
    )


@pytest.mark.parametrize(
    "old,new,wrong",
    [
        (
            "t.to(torch.int32).max().to(torch.uint16)",
            "t.to(torch.int32).max().sub(1).to(torch.uint16)",
            set(_SCORED),
        ),
        (
            "token_pos_in_items_len=token_pos_in_items_len & 0xFFFFFFFF",
            "token_pos_in_items_len=(token_pos_in_items_len - 1) & 0xFFFFFFFF",
            {"sglang-fi-mis-batch", "sglang-fi-mis-edge", "sglang-fi-mis-long"},
        ),
    ],
    ids=["max-item-len-short", "stride-one-short"],
)
def test_a_short_max_item_len_or_stride_is_seen(tmp_path, old, new, wrong):
    """max_item_len one below the longest item (the kernel may skip key tiles an item token sees:
    the metadata reference), and the positions' stride one short (every request after the first
    reads its neighbour's: the output; one request has no neighbour)."""
    require_sglang()
    cells = _mis_cells(tmp_path, old, new)
    assert _verdicts(cells) == {n: "DIVERGE" if n in wrong else "PASS" for n in _MIS_ROWS}, {
        n: c["findings"][:1] for n, c in cells.items()
    }
