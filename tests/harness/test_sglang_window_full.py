"""The full-attention layer of a window model (``model.full_layer``) on real sglang: the backend
plans the metadata of both kinds of layer, and these cells run the one without a window, so a
full-attention plan that is wrong shows where every window-layer cell passes. Shown on two one-line
breaks of FlashInfer's ``update_sliding_window``: the 0.5.13-0.5.20 full-attention paged plan over
the whole sequence on the ragged path (0.5.21 plans it over the prefix), and the full layers'
wrapper clipped to the window."""

from __future__ import annotations

import pytest
from real_sglang import breaking_patch, by_scenario, run_cli

BREAKS = [
    (
        "elif use_ragged:\n                # Extend K/V lands after",
        "elif False:\n                # Extend K/V lands after",
    ),
    (
        "            if wrapper_id == 0:\n                if use_ragged:",
        "            if True:\n                if use_ragged:",
    ),
]
CELLS = ["-s", "sglang-fi-extend-window-full", "-s", "sglang-fi-extend-swa"]


@pytest.mark.parametrize("old,new", BREAKS, ids=["ragged-full-plan", "full-wrapper-windowed"])
def test_a_broken_full_attention_plan_fails_the_full_layer_and_the_window_layer_passes(tmp_path, old, new):
    report = run_cli(tmp_path, *CELLS, "--apply", str(breaking_patch(tmp_path, "flashinfer_backend", old, new)))
    baseline = by_scenario(report["cells"])
    patched = {c["scenario"]: c for c in report["cells"] if c.get("toggles")}
    assert set(baseline) == set(patched) == {"sglang-fi-extend-window-full", "sglang-fi-extend-swa"}
    assert all(c["verdict"] == "PASS" for c in baseline.values()), [c["key_figure"] for c in baseline.values()]
    assert patched["sglang-fi-extend-window-full"]["verdict"] == "DIVERGE", patched
    assert patched["sglang-fi-extend-swa"]["verdict"] == "PASS", patched["sglang-fi-extend-swa"]["key_figure"]
