"""Checks of real sglang's metadata that the cells make beside the attention output, each shown
failing on a one-line break of the engine code it judges (as a mutant or a candidate fix would
break it) and passing without it: the output's dtype, the DSv4 draft steps' metadata, the idle
draft extend's padded spec input, the draft-extend glue's hidden-state capture and deterministic
inference's batch invariance."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from real_sglang import by_scenario, require_sglang, run_cli

# (sglang module, the text broken, what replaces it, the cells, what the broken cells say)
BREAKS = [
    (
        "srt/layers/attention/graph_utils.py",
        "    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):",
        "    if not (dtype in (torch.float8_e4m3fn, torch.float8_e5m2)):",
        ["-s", "sglang-fi-extend-graph*"],
        "the attention output is bfloat16 where the model runs in float16",
    ),
    (
        "srt/layers/attention/deepseek_v4_backend.py",
        "        return DSV4RawDecodeMetadata(\n            req_pool_indices=req_pool_indices,",
        "        return DSV4RawDecodeMetadata(\n            req_pool_indices=None,",
        ["--backend", "deepseek_v4"],
        "req_pool_indices None after init_forward_metadata",
    ),
    (
        "srt/speculative/eagle_info.py",
        "            self.num_accept_tokens = pad_tensor_to_size(\n                self.num_accept_tokens, batch_size\n",
        "            self.num_accept_tokens = pad_tensor_to_size(\n                self.num_accept_tokens, batch_size + 1\n",
        ["-s", "probe-draft-extend-idle*"],
        "spec_info.num_accept_tokens holds 3 rows for the padded batch of 2",
    ),
    (
        "srt/speculative/eagle_worker_common.py",
        "        capture_hidden_mode=capture_mode,\n        return_hidden_states_before_norm=return_hidden",
        "        capture_hidden_mode=None,\n        return_hidden_states_before_norm=return_hidden",
        ["-s", "sglang-triton-draft-extend-v2-bf16*"],
        "the draft-extend glue captures the LAST hidden states",
    ),
    (
        # Deterministic inference without its fixed split tile: the device heuristic splits by batch.
        "srt/layers/attention/triton_backend.py",
        "        if self.enable_deterministic:\n            # Fixed split tile size",
        "        if not self.enable_deterministic:\n            # Fixed split tile size",
        ["-s", "sglang-triton-decode-det*"],
        "the batch changes its reduction order",
    ),
]


def _patch(tmp_path: Path, module: str, old: str, new: str) -> Path:
    source = Path(require_sglang()) / module
    text = source.read_text()
    assert text.count(old) == 1, f"{module} no longer has one {old!r}"
    path = f"python/sglang/{module}"
    diff = difflib.unified_diff(
        text.splitlines(keepends=True),
        text.replace(old, new).splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    patch = tmp_path / "broken.patch"
    patch.write_text("".join(diff))
    return patch


@pytest.mark.parametrize("module,old,new,cells,said", BREAKS, ids=[b[0].rsplit("/", 1)[-1] for b in BREAKS])
def test_a_broken_engine_path_fails_its_check_and_the_engine_as_shipped_passes_it(
    tmp_path, module, old, new, cells, said
):
    report = run_cli(tmp_path, *cells, "--apply", str(_patch(tmp_path, module, old, new)))
    baseline = by_scenario(report["cells"])
    patched = [c for c in report["cells"] if c.get("toggles")]
    assert baseline and patched, report["cells"]
    assert all(c["verdict"] == "PASS" for c in baseline.values()), [c["key_figure"] for c in baseline.values()]
    broken = [c for c in patched if any(said in f["message"] for f in c["findings"])]
    assert broken and all(c["verdict"] == "INVARIANT" for c in broken), [c["key_figure"] for c in patched]
