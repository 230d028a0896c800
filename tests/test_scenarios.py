"""Scenario files: keys, grid expansion, errors with file:line, and a user's own file running unchanged."""

from __future__ import annotations

import pytest

from clihelp import assert_one_line_error, run_cli
from sglfix.common.errors import ConfigError
from sglfix.scenario import MODES, load_scenario_file, load_scenarios

USER_FILE = """\
name: my-verify-check
backend: triton
mode: TARGET_VERIFY
batch: {prefix_lens: [9, 30, 17]}
cuda_graph: {capture_bs: [4]}
gpu_only: true
page_size: 16
model: {num_heads: 8, num_kv_heads: 2, head_dim: 64, dtype: bfloat16}
spec: {topk: 1, num_steps: 2, num_draft_tokens: 3}
seed: 7
tolerance: 0.02
"""


def test_builtin_set_covers_every_dimension():
    scenarios = load_scenarios()
    assert {s.mode for s in scenarios} == set(MODES)
    assert {s.page_size for s in scenarios} == {1, 16}
    assert {s.model.dtype for s in scenarios} == {"float16", "bfloat16"}
    assert {s.gpu_only for s in scenarios} == {False, True}
    graphs = {(s.mode, s.cuda_graph, s.padded) for s in scenarios}
    for mode in set(MODES) - {"EXTEND"}:
        assert {(mode, False, False), (mode, True, False), (mode, True, True)} <= graphs
    assert {s.builder for s in scenarios if s.mode == "DRAFT_EXTEND_V2"} == {"kit", "glue"}
    assert len({s.name for s in scenarios}) == len(scenarios)


def test_grid_names_and_values(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text("name: g\nmode: DECODE\nbatch: {prefix_lens: [5, 6]}\n"
                 "grid:\n  model.dtype: [float16, bfloat16]\n  cuda_graph: [false, {capture_bs: [4]}]\n")
    got = {s.name: s for s in load_scenario_file(f)}
    assert set(got) == {"g@dtype=fp16,cg=eager", "g@dtype=fp16,cg=graph-padded",
                        "g@dtype=bf16,cg=eager", "g@dtype=bf16,cg=graph-padded"}
    s = got["g@dtype=bf16,cg=graph-padded"]
    assert s.model.dtype == "bfloat16" and s.capture_bs == (4,) and s.graph_bs == 4 and s.padded


BAD = [
    ("name: x\nmode: DECOD\nbatch: {prefix_lens: [3]}\n", 2, "did you mean 'DECODE'"),
    ("name: x\nmode: DECODE\nbatch: {prefix_len: [3]}\n", 3, "unknown key 'prefix_len'"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [0]}\n", 3, "integers >= 1"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3, 4]}\ncuda_graph: {capture_bs: [1]}\n", 4, "fits no captured size"),
    ("name: x\nmode: EXTEND\nbatch: {prefix_lens: [3]}\n", 3, "needs batch.extend_lens"),
    ("name: x\nmode: DRAFT_EXTEND\nbatch: {prefix_lens: [3]}\n", 3, "needs batch.accept_lens"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\nmodel: {num_heads: 3, num_kv_heads: 2}\n", 4, "multiple of num_kv_heads"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\ngrid: {pagesize: [1]}\n", 4, "not a scenario key"),
    ("name: x\nmode: DECODE\nbatch: {prefix_lens: [3]}\ntolerance: 2\n", 4, "tolerance"),
    ("name: x\nmode: TARGET_VERIFY\nbatch: {prefix_lens: [3], accept_lens: [4]}\n", 3, "< spec.num_draft_tokens"),
]


@pytest.mark.parametrize("text,line,needle", BAD, ids=[b[2][:20] for b in BAD])
def test_bad_scenarios_cite_file_and_line(tmp_path, text, line, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    assert f"bad.yaml:{line}:" in str(info.value) and needle in str(info.value), str(info.value)


def test_bad_scenario_file_on_the_cli_is_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD[0][0])
    assert_one_line_error(run_cli("run", "--scenario-file", str(f), "--device", "cpu"), "bad.yaml:2:")
    assert_one_line_error(run_cli("run", "-s", "no-such-scenario*", "--device", "cpu"), "no scenario matches")
    assert_one_line_error(run_cli("run", "-r", "99999", "--device", "cpu"), "not registered")
    assert_one_line_error(run_cli("run", "--device", "tpu"), "--device")


def test_a_scenario_file_written_by_someone_else_runs_unchanged(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(USER_FILE)
    out = tmp_path / "r.json"
    r = run_cli("run", "--scenario-file", str(f), "--device", "cpu", "--json", str(out), timeout=600)
    assert r.code == 0, r.out + r.err
    import json

    data = json.loads(out.read_text())
    assert [c["scenario"] for c in data["cells"]] == ["my-verify-check"]
    assert data["cells"][0]["verdict"] == "PASS"
    assert data["cells"][0]["error"]["rows"] == 9  # 3 requests x 3 draft tokens compared
