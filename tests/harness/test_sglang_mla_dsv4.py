"""The sglang adapters for DeepSeek-V4, FlashInfer (GQA, MLA) multi-step draft and TRT-LLM MLA draft
extend, against the installed real sglang 0.5.23 on CPU (CI installs it).

Every toggle set runs in a fresh interpreter started with ``SGLFIX_PROFILE=sglang-0.5.23`` and
``SGLANG_DEBUG_REVERT_PR`` (the production route: the start-up hook reverts at import), which
activates the code base, runs the profile's built-in scenarios of ``mla_dsv4.yaml`` through
``run_cell`` and prints one JSON line per cell. A missing sglang fails, never skips.

What CPU can check (the cells say the rest): DSv4's per-step baked write locations (metadata
only: its attention needs flash_mla); the FlashInfer multi-step backends' own code (row sizing,
the size check, the Triton kernel that fills the rows; FlashInfer itself needs CUDA, so no
attention output); TRT-LLM MLA not at all (its constructor needs CUDA + FlashInfer): SKIP.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
from builders import ROOT
from real_sglang import require_sglang

from sglfix.harness.adapters.base import AdapterBase

SCENARIOS = ROOT / "profiles" / "sglang-0.5.23" / "scenarios" / "mla_dsv4.yaml"
MARK = "CELL "

DRIVER = textwrap.dedent("""
    import fnmatch, json, os, sys
    import sglfix.codebases as codebases
    codebases.activate("sglang-0.5.23")
    from sglfix.toggling.env import maybe_revert_pr_fix
    from sglfix.toggling.registry import load_registry, parse_toggle_ids
    from sglfix.toggling.revert import revert, reverted_ids
    maybe_revert_pr_fix()  # the start-up hook already applied SGLANG_DEBUG_REVERT_PR: a no-op then
    from sglfix.harness.cell import run_cell
    from sglfix.scenario.loader import load_scenario_file
    scenarios = load_scenario_file(sys.argv[1])
    env_toggles = [t for t in os.environ.get("SGLANG_DEBUG_REVERT_PR", "").split(",") if t]
    for toggles, globs in json.loads(sys.argv[2]):
        # A set beyond the environment's is reverted in this process and restored after its cells.
        extra = revert(parse_toggle_ids(toggles, registry=load_registry(), what="test")) if toggles else None
        key = ",".join(toggles or env_toggles)
        print("REVERTED " + json.dumps([key, reverted_ids()]), flush=True)
        for s in scenarios:
            if any(fnmatch.fnmatch(s.name, g) for g in globs):
                r = run_cell(s, device="cpu", toggles=toggles or env_toggles)
                print("CELL " + json.dumps([key, r.to_json()]), flush=True)
        if extra is not None:
            extra.restore()
""")

# One fresh interpreter each: (SGLANG_DEBUG_REVERT_PR at start-up, [(toggles reverted in-process, globs)]).
# The baseline and 26239 take the production route (the variable, the start-up hook); the parts of
# 27338 / 27460 are reverted and restored one set after the other in one process.
PROCESSES = [
    ("", [([], ["*"])]),
    ("26239:backend-slice", [([], ["dsv4-*"])]),
    ("26880", [([], ["fi-*", "fimla-*"])]),
    (
        "",
        [
            (["27338:sizing"], ["fi-*"]),
            (["27338:assert"], ["fi-*"]),
            (["27338"], ["fi-*"]),
            (["27460:sizing"], ["fimla-*"]),
            (["27460:assert"], ["fimla-*"]),
            (["27460"], ["fimla-*"]),
            (["21987"], ["trtllm-*"]),
        ],
    ),
]


def _run(env_toggles: str, sets: list) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLFIX_", "PYTEST_", "SGLANG_DEBUG_REVERT_PR"))}
    env.update(
        TRITON_INTERPRET="1",
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        SGLFIX_PROFILE="sglang-0.5.23",
    )
    if env_toggles:
        env["SGLANG_DEBUG_REVERT_PR"] = env_toggles
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(SCENARIOS), json.dumps(sets)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=ROOT,
    )
    runs: dict = {}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            key, cell = json.loads(line[len(MARK) :])
            runs[key]["cells"][cell["scenario"]] = cell
        elif line.startswith("REVERTED "):
            key, reverted = json.loads(line[len("REVERTED ") :])
            runs[key] = {"cells": {}, "reverted": reverted}
    assert proc.returncode == 0, (
        f"driver ({env_toggles or 'no variable'}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    assert runs and all(r["cells"] for r in runs.values()), f"no cell ran:\n{proc.stderr[-3000:]}"
    return runs


@pytest.fixture(scope="module")
def runs() -> dict:
    require_sglang()
    with ThreadPoolExecutor(max_workers=len(PROCESSES)) as pool:
        futures = [pool.submit(_run, env, sets) for env, sets in PROCESSES]
        out: dict = {}
        for f in futures:
            out.update(f.result())
        return out


def _findings(cell: dict, verdict: str | None = None) -> list[str]:
    return [f["message"] for f in cell["findings"] if verdict is None or f["verdict"] == verdict]


def _show(cell: dict) -> str:
    return f"{cell['scenario']}: {cell['verdict']} {cell['findings']}"


def test_sglang_is_installed_in_the_profiles_version():
    require_sglang()


def test_each_toggle_set_was_reverted_in_the_process(runs):
    assert set(runs) == {
        "",
        "26239:backend-slice",
        "26880",
        "27338:sizing",
        "27338:assert",
        "27338",
        "27460:sizing",
        "27460:assert",
        "27460",
        "21987",
    }
    for toggles, run in runs.items():
        got = " ".join(run["reverted"])
        for t in toggles.split(",") if toggles else []:
            assert t in got, (toggles, run["reverted"])
        if not toggles:
            assert not run["reverted"], run["reverted"]


def test_baselines_pass_where_checked_and_skip_with_the_reason_elsewhere(runs):
    cells = runs[""]["cells"]
    assert len(cells) == 32, sorted(cells)
    for name, cell in cells.items():
        if name.startswith("trtllm-"):
            assert cell["verdict"] == "SKIP", _show(cell)
            assert "need CUDA and FlashInfer" in cell["findings"][0]["message"], _show(cell)
        elif name.startswith("fimla-draft-topk1"):
            # The known divergence (known/divergences.yaml): the step wrappers are planned from
            # seq_lens, on CPU as on CUDA now that the MLA step backends run on the stand-in.
            assert cell["verdict"] == "DIVERGE", _show(cell)
            assert any(m.startswith("planned read: step 0 row 0") for m in _findings(cell, "DIVERGE")), _show(cell)
        else:
            assert cell["verdict"] == "PASS", _show(cell)
            passes = _findings(cell, "PASS")
            # Something was checked (never PASS for nothing).
            assert any(m.startswith("metadata reference: ") for m in passes), _show(cell)
            if name.startswith("fi-") or (name.startswith("fimla-") and "topk1" not in name):
                # The GQA and MLA step backends run on CPU over FlashInfer's torch stand-ins
                # (``mla_steps_recorded``: not MLA's at topk > 1): every draft step's output is
                # compared with the reference.
                recorded = name.startswith("fimla-")
                assert any(m.startswith("output not checked: ") for m in passes) == recorded, _show(cell)
                assert ((cell.get("error") or {}).get("rows", 0) > 0) != recorded, cell
            else:
                # DeepSeek-V4's step backends are recorded on CPU: the cell says the output was not checked.
                assert any(m.startswith("output not checked: ") for m in passes), _show(cell)


def test_dsv4_metadata_is_the_raw_decode_metadata_with_each_steps_own_slots(runs):
    cell = runs[""]["cells"]["dsv4-draft@steps=4"]
    assert "3 draft step(s) x 3 row(s) are each step's own slots" in cell["findings"][0]["message"]
    assert "flash_mla" in _findings(cell)[-1]


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_26239_backend_slice_crashes_the_eager_dsv4_draft(runs, steps):
    cell = runs["26239:backend-slice"]["cells"][f"dsv4-draft@steps={steps}"]
    assert cell["verdict"] == "CRASH", _show(cell)
    message = _findings(cell, "CRASH")[0]
    # The whole multi-step buffer (3 requests x topk 1 x steps) reaches a one-row-per-request assert.
    assert message.startswith("AssertionError: req_pool_indices.shape=torch.Size([3])"), message
    assert f"out_cache_loc.shape=torch.Size([{3 * steps}])" in message, message
    assert "init_forward_metadata_decode" in message and "deepseek_v4_backend.py" in message, message
    long = runs["26239:backend-slice"]["cells"]["dsv4-draft-long"]
    assert long["verdict"] == "CRASH" and "torch.Size([6])" in _findings(long, "CRASH")[0], _show(long)


@pytest.mark.parametrize(
    "pr,prefix,cls",
    [("27338", "fi", "FlashInferMultiStepDraftBackend"), ("27460", "fimla", "FlashInferMLAMultiStepDraftBackend")],
)
def test_sizing_fails_loudly_assert_alone_is_neutral_both_overflow_silently(runs, pr, prefix, cls):
    overflow = {f"{prefix}-draft-overflow@cg=graph": (564, 384), f"{prefix}-draft-overflow@cg=graph-padded": (580, 512)}
    if prefix == "fi":
        # The host-planned draft (SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR) sizes its rows the same way.
        overflow["fi-draft-host-indptr@topk=4,cg=graph-padded"] = (580, 512)
    # Sizing alone: the graph row lacks the topk factor; sglang's own pre-launch check fires.
    sizing = runs[f"{pr}:sizing"]["cells"]
    for name, (used, cap) in overflow.items():
        cell = sizing[name]
        assert cell["verdict"] == "CRASH", _show(cell)
        assert f"used {used} > capacity {cap}" in _findings(cell, "CRASH")[0], _show(cell)
    # The assertion alone never fires while the rows are sized right.
    for name, cell in runs[f"{pr}:assert"]["cells"].items():
        assert cell["verdict"] == runs[""]["cells"][name]["verdict"], _show(cell)
    # Both: the pre-fix code; the undersized rows reach the Triton kernel and overflow silently.
    both = runs[pr]["cells"]
    for name, (need, width) in overflow.items():
        cell = both[name]
        assert cell["verdict"] == "INVARIANT", _show(cell)
        found = _findings(cell, "INVARIANT")
        row = f"kv_indices rows are {width} wide, the draft kernel writes {need} per row"
        assert any(row in m for m in found), found
        assert any(
            m.startswith("write past a buffer's end: ") and f"{cls}.init_cuda_graph_state" in m for m in found
        ), found
        assert any("exceeds kv_indices length" in m for m in found), found
    # Where the fix must not matter: eager rows (sized with topk), rows wide enough, topk 1.
    for run in (f"{pr}:sizing", pr):
        for name, cell in runs[run]["cells"].items():
            if name not in overflow:
                assert cell["verdict"] == runs[""]["cells"][name]["verdict"], (run, _show(cell))


def test_26880_a_padded_replay_hands_the_draft_backend_the_raw_seq_lens_sum(runs):
    """The draft CUDA-graph runner's own replay runs: reverted, it pads seq_lens (one row of the
    fill value 1 here) and leaves seq_lens_sum at the raw batch's; fixed (the baseline), they agree."""
    cells = runs["26880"]["cells"]
    padded = sorted(n for n in cells if n.endswith("cg=graph-padded"))
    assert len(padded) == 8, sorted(cells)
    for name, cell in cells.items():
        if name in padded:
            assert cell["verdict"] == "INVARIANT", _show(cell)
            message = _findings(cell, "INVARIANT")[0]
            said, summed = (int(x) for x in re.findall(r"seq_lens_sum (\d+), its 4 seq_lens sum to (\d+)", message)[0])
            assert summed == said + 1, message
            assert not any("seq_lens_sum" in m for m in _findings(runs[""]["cells"][name])), _show(cell)
        else:
            assert cell["verdict"] == runs[""]["cells"][name]["verdict"], _show(cell)


def test_flashinfer_mla_topk_gate_is_lifted_and_said(runs):
    cell = runs[""]["cells"]["fimla-draft-overflow@cg=graph"]
    assert any("refuses topk > 1" in m and "lifted" in m for m in _findings(cell, "PASS")), _show(cell)
    topk1 = runs[""]["cells"]["fimla-draft-topk1@cg=eager"]
    assert not any("refuses topk > 1" in m for m in _findings(topk1)), _show(topk1)


def test_21987_is_gpu_only_here(runs):
    cells = runs["21987"]["cells"]
    assert len(cells) == 10
    for cell in cells.values():
        assert cell["verdict"] == "SKIP" and "SM100" in cell["findings"][0]["message"], _show(cell)


# ----------------------------------------------------------------------------- the cell seam (no sglang)


class _MetadataOnly(AdapterBase):
    """A fake adapter whose run returns NoOutput; what it checks is configurable."""

    name = "fake"

    def __init__(self, checks: list, views: bool) -> None:
        from sglfix.harness.invariants import MetadataFields

        self.metadata_fields = MetadataFields(indptr=("kv_indptr",))
        self.checks, self.views = checks, views

    def build(self, scenario, *, device):
        from sglfix.harness.adapters.base import Prepared

        return Prepared(case=None, num_slots=100)

    def make_backend(self, prepared):
        return object()

    def capture(self, prepared, backend, *, scenario, on_metadata):
        return None

    def run(self, prepared, backend, runner, *, scenario, on_metadata):
        from sglfix.harness.unavailable import NoOutput

        on_metadata(backend, None, "eager")
        return NoOutput("no kernel here")

    def static_buffers(self, backend):
        return []

    def metadata_views(self, backend, forward_batch):
        from types import SimpleNamespace

        import torch

        return [("", SimpleNamespace(kv_indptr=torch.tensor([0, 3, 2])), 2)] if self.views else [("", None, 2)]

    def check_metadata(self, prepared, backend):
        return self.checks

    def reference(self, prepared):
        raise AssertionError("no reference for a metadata-only cell")


@pytest.mark.parametrize(
    "checks,views,verdict,first",
    [
        ([], False, "SKIP", "nothing checked: no kernel here"),
        ([("PASS", "metadata reference: ok")], False, "PASS", "metadata reference: ok"),
        ([("DIVERGE", "metadata reference: off")], False, "DIVERGE", "metadata reference: off"),
        ([], True, "INVARIANT", "eager: kv_indptr not monotone"),
    ],
)
def test_a_cell_without_output_judges_metadata_and_is_skip_when_nothing_was_checked(
    monkeypatch, checks, views, verdict, first
):
    import sglfix.harness.adapters as adapters
    from sglfix.harness.cell import run_cell
    from sglfix.scenario import Scenario

    monkeypatch.setattr(adapters, "get_adapter", lambda name, codebase=None: _MetadataOnly(checks, views))
    scenario = Scenario(name="fake", mode="DECODE", prefix_lens=(3, 4), extend_lens=(1, 1))
    result = run_cell(scenario, device="cpu")
    assert result.verdict == verdict, result.findings
    assert result.findings[0]["message"].startswith(first), result.findings
    if verdict != "SKIP":
        assert result.findings[-1]["message"] == "output not checked: no kernel here"


def test_a_cpu_case_never_takes_flash_mla_s_full_init(monkeypatch):
    # The case's device is a torch.device: compared with the string "cpu" it never matched, so a
    # CPU case on a machine with a GPU and FlashMLA would have taken the GPU-only init.
    from types import SimpleNamespace

    import torch

    import sglfix.harness.kits as kits
    from sglfix.harness.adapters.base import Prepared
    from sglfix.harness.adapters.sglang.deepseek_v4 import DeepseekV4DraftAdapter

    monkeypatch.setattr(
        kits, "kit", lambda part: SimpleNamespace(flash_mla_available=lambda: True, has_cuda=lambda: True)
    )
    adapter = DeepseekV4DraftAdapter.__new__(DeepseekV4DraftAdapter)
    assert not adapter._full_init(Prepared(case=SimpleNamespace(device=torch.device("cpu")), num_slots=1))
    assert adapter._full_init(Prepared(case=SimpleNamespace(device=torch.device("cuda")), num_slots=1))
