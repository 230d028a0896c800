"""Real sglang 0.5.23's FlashInfer-MLA backend in the modes besides the multi-step draft
(``sglang.flashinfer_mla_dense``: DECODE, EXTEND, TARGET_VERIFY, DRAFT_EXTEND_V2, eager and graph),
its TorchNativeAttnBackend (``sglang.torch_native``) and the FlashInfer backend's encoder-decoder
path (``update_cross_attention``: ``sglang-fi-cross-*``, the self and the cross layer), on CPU
through the CLI a user runs: every built-in scenario passes, and each judge fails when the code
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
    cells = {c["scenario"]: c for c in report["cells"]}
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
    assert _verdicts(cells) == {
        f"sglang-fi-cross-decode@cg={cg},cross={cross}": "DIVERGE" if cross == "on" else "PASS"
        for cg in ("eager", "graph", "graph-padded")
        for cross in ("off", "on")
    }, {n: c["findings"][:1] for n, c in cells.items()}
    for name, c in cells.items():
        if name.endswith("cross=on"):
            assert c["error"]["bad_rows"] == 3, (name, c["error"])


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
    assert _verdicts(cells) == {
        f"sglang-fi-cross-decode@cg={cg},cross={cross}": "DIVERGE" if cross == "off" else "PASS"
        for cg in ("eager", "graph", "graph-padded")
        for cross in ("off", "on")
    }, {n: c["findings"][:1] for n, c in cells.items()}


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
