"""Scenario files written by someone else with the MLA-family keys (backend, draft_decode,
max_context_len, MLA model shapes, accept_lens on trtllm_mla) run unchanged through the CLI, and
the three fixes show where they must and pass where they must not matter."""

from __future__ import annotations

import json

import pytest
from clihelp import assert_one_line_error, run_cli

# The example, verbatim but for the case of two values (names are case-insensitive).
DRAFT = """\
name: mla-draft-topk4
backend: FlashInfer_MLA
mode: Draft_Decode
batch: {prefix_lens: [37, 90, 5]}
cuda_graph: {capture_bs: [4]}
max_context_len: 128
page_size: 1
model: {num_heads: 16, kv_lora_rank: 512, qk_rope_head_dim: 64, dtype: bfloat16}
spec: {topk: 4, num_steps: 3}
"""

GQA_DRAFT = """\
name: gqa-draft-topk4
backend: flashinfer
mode: draft_decode
batch: {prefix_lens: [37, 90, 5]}
cuda_graph: {capture_bs: [4]}
max_context_len: 128
model: {num_heads: 8, num_kv_heads: 2, head_dim: 128, dtype: float16}
spec: {topk: 4, num_steps: 3}
"""

EXTEND = """\
scenarios:
  - name: mine-trtllm-unequal
    backend: trtllm_mla
    mode: draft_extend_v2
    batch: {prefix_lens: [70, 12], accept_lens: [0, 2]}
    cuda_graph: {capture_bs: [2]}
    page_size: 64
    model: {num_heads: 32, dtype: float16}
    spec: {num_draft_tokens: 3}
  - name: mine-trtllm-all-accepted
    backend: trtllm_mla
    mode: DRAFT_EXTEND
    batch: {prefix_lens: [70, 12], accept_lens: [2, 2]}
    cuda_graph: {capture_bs: [2]}
    page_size: 64
    model: {num_heads: 32, dtype: float16}
    spec: {num_draft_tokens: 3}
"""


def _run(tmp_path, text: str, *args: str) -> dict:
    f = tmp_path / "mine.yaml"
    f.write_text(text)
    out = tmp_path / "r.json"
    r = run_cli(
        "run", "--scenario-file", str(f), "--device", "cpu", "--json", str(out), *args, timeout=600, subprocess=True
    )
    assert r.code in (0, 1), (r.code, r.out[-2000:], r.err[-2000:])
    data = json.loads(out.read_text())
    return {c["scenario"]: c for c in data["cells"]}


@pytest.mark.parametrize("text, name", [(DRAFT, "mla-draft-topk4"), (GQA_DRAFT, "gqa-draft-topk4")])
def test_someone_elses_draft_scenario_passes_and_shows_the_sizing_bug(tmp_path, text, name):
    assert _run(tmp_path, text)[name]["verdict"] == "PASS"
    pr = "27460" if "MLA" in text else "27338"
    cell = _run(tmp_path, text, "-r", pr)[name]
    assert cell["verdict"] == "INVARIANT", cell["findings"]
    messages = " | ".join(f["message"] for f in cell["findings"])
    assert "exceeds kv_indices length 512" in messages and "guard element(s) overwritten" in messages
    assert any(f["verdict"] == "DIVERGE" for f in cell["findings"]), messages
    crash = _run(tmp_path, text, "-r", f"{pr}:sizing")[name]
    assert crash["verdict"] == "CRASH" and "needs 580 entries" in crash["findings"][0]["message"]


def test_someone_elses_draft_extend_scenarios(tmp_path):
    base = _run(tmp_path, EXTEND)
    assert {c["verdict"] for c in base.values()} == {"PASS"}
    reverted = _run(tmp_path, EXTEND, "-r", "21987")
    assert reverted["mine-trtllm-unequal"]["verdict"] == "DIVERGE"
    assert reverted["mine-trtllm-unequal"]["error"]["first_bad_request"] == 0
    assert reverted["mine-trtllm-all-accepted"]["verdict"] == "PASS"


@pytest.mark.parametrize(
    "patch, needles",
    [
        (
            "model: {num_heads: 16, kv_lora_rank: 256, qk_rope_head_dim: 64, dtype: bfloat16}",
            ["model.kv_lora_rank 256", "512 only"],
        ),
        (
            "model: {num_heads: 16, kv_lora_rank: 512, qk_rope_head_dim: 64, dtype: float32}",
            ["flashinfer_mla", "float16 or bfloat16"],
        ),
        ("max_context_len: 64", ["max_context_len 64", "request 1 needs 102", "at least 102"]),
        ("page_size: 16", ["page_size 1"]),
    ],
)
def test_what_the_mla_kernels_cannot_take_is_a_one_line_error(tmp_path, patch, needles):
    key = patch.split(":")[0]
    lines = [patch if line.startswith(key + ":") else line for line in DRAFT.splitlines()]
    f = tmp_path / "bad.yaml"
    f.write_text("\n".join(lines) + "\n")
    assert_one_line_error(run_cli("run", "--scenario-file", str(f), "--device", "cpu"), "bad.yaml:", *needles)


DSV4 = """\
name: my-dsv4-mtp
backend: DeepSeek_V4
mode: draft_decode
batch: {prefix_lens: [180, 9]}
model: {num_heads: 32, kv_lora_rank: 512, qk_rope_head_dim: 64, dtype: bfloat16}
spec: {topk: 1, num_steps: 4}
grid:
  cuda_graph: [false, {capture_bs: [2]}]
"""


def test_someone_elses_deepseek_v4_scenario(tmp_path):
    base = _run(tmp_path, DSV4)
    assert [c["verdict"] for c in base.values()] == ["PASS", "PASS"]
    assert {c["scenario"] for c in base.values()} == {"my-dsv4-mtp@cg=eager", "my-dsv4-mtp@cg=graph"}
    reverted = _run(tmp_path, DSV4, "-r", "26239")
    eager, graph = reverted["my-dsv4-mtp@cg=eager"], reverted["my-dsv4-mtp@cg=graph"]
    assert eager["verdict"] == "CRASH" and "AssertionError" in eager["findings"][0]["message"], eager["findings"]
    assert graph["verdict"] == "PASS"
    assert {c["verdict"] for c in _run(tmp_path, DSV4, "-r", "26239:worker-helper").values()} == {"PASS"}
