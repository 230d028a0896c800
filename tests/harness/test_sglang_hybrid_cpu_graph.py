"""Real sglang 0.5.23's hybrid under a CPU device's decode graphs (``cuda_graph.cpu``: its
``CPUGraphRunner`` over ``IntelAMXAttnBackend``) on CPU through the CLI a user runs: the CPU
attention kernel's output over the rows the backend hands it, and the linear layers' metadata after
every capture and replay, for every linear mixer; a backend that reads a request short, or a
capture that leaves its graph's state slots unset, is seen.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from real_sglang import breaking_patch, by_scenario, require_sglang, run_cli

GLOB = "sglang-hybrid-cpu-graph*"


def test_every_mixer_under_cpu_graphs_passes(tmp_path: Path):
    require_sglang()
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB)["cells"])
    assert len(cells) == 8, sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "PASS", (name, cell["findings"])
        messages = [f["message"] for f in cell["findings"]]
        # One capture per size, then the replay: every one judged.
        inits = 3 if "graph-padded" in name else 2
        assert any(f"of {inits} metadata init(s) are their batch's" in m for m in messages), (name, messages)


@pytest.mark.parametrize(
    "module, old, new, needle",
    [
        # The CPU backend's decode reads one key short of every request.
        (
            "intel_amx_backend",
            "            seq_lens = forward_batch.seq_lens\n\n        q = q.reshape",
            "            seq_lens = forward_batch.seq_lens - 1\n\n        q = q.reshape",
            "rows bad",
        ),
        # A capture leaves the per-size state slots at the pad slot: the graph reads no request's state.
        (
            "hybrid_linear_attn_backend",
            "        self.state_indices_list[bs - 1][: len(mamba_indices)].copy_(mamba_indices)\n\n        # Capture",
            "        pass\n\n        # Capture",
            "mamba_cache_indices[",
        ),
    ],
    ids=["amx-reads-short", "capture-without-slots"],
)
def test_a_wrong_cpu_graph_is_seen(tmp_path: Path, module, old, new, needle):
    require_sglang()
    patch = breaking_patch(tmp_path, module, old, new)
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB, "--apply", str(patch))["cells"], patched=True)
    assert len(cells) == 8, sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "DIVERGE", (name, cell["verdict"], cell["findings"][:2])
        messages = [f["message"] for f in cell["findings"] if f["verdict"] == "DIVERGE"]
        assert any(needle in m for m in messages), (name, messages[:3])


def test_a_decode_handed_to_the_extend_kernel_is_the_codes_crash(tmp_path: Path):
    # The decode's call made to sgl_kernel's extend op: the op refuses the decode's arguments, a CRASH
    # of the code under test, never an ERROR of sglfix's (which models the decode kernel only).
    require_sglang()
    patch = breaking_patch(
        tmp_path,
        "intel_amx_backend",
        "self.decode_attention_fwd = torch.ops.sgl_kernel.decode_attention_cpu",
        "self.decode_attention_fwd = torch.ops.sgl_kernel.extend_attention_cpu",
    )
    cells = by_scenario(run_cli(tmp_path, "-s", GLOB, "--apply", str(patch))["cells"], patched=True)
    assert len(cells) == 8, sorted(cells)
    for name, cell in cells.items():
        assert cell["verdict"] == "CRASH", (name, cell["verdict"], cell["findings"][:2])
        assert "extend_attention_cpu handed the decode kernel's arguments" in cell["findings"][0]["message"]
