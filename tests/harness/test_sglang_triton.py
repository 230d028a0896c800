"""Real sglang 0.5.23 as the code under test: the Triton adapter and the profile's built-in scenarios.

Each test starts a fresh Python process the way an sglfix worker of the ``sglang-0.5.23`` profile
is set up (``TRITON_INTERPRET=1`` and no visible GPU before triton is imported, the code base
activated before sglang is imported, ``SGLANG_DEBUG_REVERT_PR`` applied through
``maybe_revert_pr_fix``, the interpreter's launch memo installed) and replays cells of
``profiles/sglang-0.5.23/scenarios/triton.yaml`` through ``run_cell``. The FlashInfer backend's
plain EXTEND under sglang's full prefill graph (``sglang-fi-extend-graph``, the kit's graph runners
as these cells use them) runs through the CLI a user runs, with candidate fixes that break it. A reverted fix can only be
undone by a new process, hence one process per toggle set; each is independent of the others
(pytest-xdist spreads them). sglang must be installed: a missing or wrong version is a failure
that names the install command, never a skip (CI installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

import pytest
from builders import ROOT
from real_sglang import breaking_patch, known_divergences, require_sglang, run_cli

SCENARIOS = ROOT / "profiles" / "sglang-0.5.23" / "scenarios" / "triton.yaml"
MARK = "SGLFIX-TEST-RESULT "
DEV2 = "sglang-triton-draft-extend-v2@"
VERIFY = "sglang-triton-target-verify@"

# What the worker process runs: the cells whose names match ``globs``, with what it imported.
_WORKER = r"""
import fnmatch, inspect, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
args = json.loads(sys.argv[1])
from sglfix import codebases
codebases.activate("sglang-0.5.23")
from sglfix.toggling.env import maybe_revert_pr_fix
maybe_revert_pr_fix()
from sglfix.harness import interpreter
interpreter.install()
from sglfix.harness.adapters import get_adapter
from sglfix.harness.cell import run_cell
from sglfix.scenario.loader import load_scenario_file

adapter = get_adapter("triton")
classes = set()
published = {}
make_backend = adapter.make_backend

def recording_make_backend(prepared):
    backend = make_backend(prepared)
    # A decode context-parallel case wraps the engine case its ranks share.
    case = getattr(prepared.case, "case", prepared.case)
    # What the backend read of the published server args when it was built (a dense case).
    if hasattr(case, "scenario"):
        published[case.scenario.name] = {
            k: getattr(backend, k, None) for k in ("enable_deterministic", "num_draft_tokens", "split_tile_size")
        }
    # A draft case (DRAFT_DECODE) has no single layer or forward batch of its own.
    for obj in (backend, case.runner, case.runner.token_to_kv_pool, case.runner.req_to_token_pool,
                getattr(case, "layer", None), getattr(case, "forward_batch", None)):
        if obj is not None:
            classes.add((type(obj).__module__ + "." + type(obj).__qualname__, inspect.getfile(type(obj))))
    return backend

adapter.make_backend = recording_make_backend
from contextlib import nullcontext
from sglfix.harness.fingerprint import fingerprinting

cells = []
for scenario in load_scenario_file(args["file"]):
    if any(fnmatch.fnmatchcase(scenario.name, g) for g in args["globs"]):
        with fingerprinting() if args.get("fingerprint") else nullcontext() as fp:
            cell = run_cell(scenario, device="cpu", toggles=args["toggles"]).to_json()
        if fp is not None:
            cell["fingerprint"] = fp.to_json()
        cells.append(cell)
print(args["mark"] + json.dumps({
    "cells": cells, "classes": sorted(classes), "adapter": type(adapter).__module__, "published": published,
    "reproduction_modules": sorted(m for m in sys.modules if m.split(".")[:2] == ["sglfix", "backends"]),
    "revert_env": os.environ.get("SGLANG_DEBUG_REVERT_PR"),
}))
"""


@cache
def _run(*, globs: tuple[str, ...], revert: str = "", fingerprint: bool = False) -> dict:
    """The worker's report for the matching cells with ``revert`` applied (a fresh process)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_TOGGLES_DIR", "PYTHONPATH")
    }
    env.update(
        SGLFIX_PROFILE="sglang-0.5.23",
        SGLANG_DEBUG_REVERT_PR=revert,
        TRITON_INTERPRET="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONWARNINGS="ignore",
    )
    args = {
        "file": str(SCENARIOS),
        "globs": list(globs),
        "toggles": [t for t in revert.split(",") if t],
        "mark": MARK,
        "fingerprint": fingerprint,
    }
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _WORKER, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, (
        f"worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    report = json.loads(lines[-1][len(MARK) :])
    assert report["revert_env"] == revert, "the worker saw the toggle set it was given"
    return report


def _cells(report: dict) -> dict[str, dict]:
    return {c["scenario"]: c for c in report["cells"]}


def _scenario_names() -> list[str]:
    from sglfix.scenario.loader import load_scenario_file

    return [s.name for s in load_scenario_file(SCENARIOS)]


def test_every_builtin_scenario_passes_on_real_sglang():
    """Every built-in scenario passes, but for the profile's known upstream divergences, which
    show with their verdict (never hidden)."""
    require_sglang()
    cells = _cells(_run(globs=("*",)))
    assert sorted(cells) == sorted(_scenario_names()), "every built-in scenario runs"
    known = known_divergences(_scenario_names())
    assert known, "the Triton decode window finding is built in, listed as a known divergence"
    assert all(cells[n]["verdict"] in allowed for n, allowed in known.items()), {n: cells[n]["verdict"] for n in known}
    failed = {
        name: f"{c['verdict']}: {c['findings'][:2]}"
        for name, c in cells.items()
        if c["verdict"] != "PASS" and name not in known
    }
    assert not failed, json.dumps(failed, indent=1)
    for name, c in cells.items():
        if name in known:
            continue
        if "-dcp-" in name:
            # One process is one DCP rank: no output, every rank's metadata judged
            # (tests/harness/test_sglang_triton_dcp.py).
            assert c["error"] is None and any(f["message"].startswith("output not checked") for f in c["findings"])
            continue
        # Errors of a right answer, below the tolerance (fp16 1e-2, bf16 2e-2, fp32 1e-4): bfloat16
        # keeps 8 mantissa bits, so its rounding alone is ~4e-3 of a value.
        bound = 1e-5 if "fp32" in name else 1.5e-2 if "bf16" in name else 2e-3
        assert c["error"]["max_abs_err"] < bound, (name, c["error"])
        assert c["error"]["bad_rows"] == 0 and c["error"]["rows"] > 0, (name, c["error"])


def test_cells_run_sglangs_own_backend_batch_and_kit_not_the_reproduction():
    require_sglang()
    import importlib.util

    report = _run(globs=(f"{DEV2}cg=eager,builder=glue,gpu_only=off", f"{VERIFY}cg=graph-padded,gpu_only=on"))
    assert [c["verdict"] for c in report["cells"]] == ["PASS", "PASS"]
    assert report["adapter"] == "sglfix.harness.adapters.sglang.triton"
    assert report["reproduction_modules"] == [], "no module of the reproduction (sglfix.backends) was imported"
    classes = dict(report["classes"])
    sglang_dir = os.path.realpath(next(iter(importlib.util.find_spec("sglang").submodule_search_locations)))
    assert {
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend",
        "sglang.srt.model_executor.forward_batch_info.ForwardBatch",
        "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool",
        "sglang.srt.mem_cache.memory_pool.ReqToTokenPool",
        "sglang.srt.layers.radix_attention.RadixAttention",
        "sglang.test.kits.attention_unittest.attention_methods.dense_attention.MockModelRunner",
    } <= set(classes)
    for name, path in classes.items():
        assert os.path.realpath(path).startswith(sglang_dir + os.sep), (name, path)


# (revert, {cell: verdict}): the cell that detects the toggle part, and controls it must leave alone.
DETECTIONS = [
    pytest.param(
        "26651:fixture",
        {
            f"{DEV2}cg=graph,builder=kit,gpu_only=off": "DIVERGE",
            f"{DEV2}cg=eager,builder=kit,gpu_only=off": "PASS",  # eager reads extend_prefix_lens, not seq_lens
            f"{DEV2}cg=graph,builder=glue,gpu_only=off": "PASS",  # the glue bumps seq_lens itself
        },
        id="26651-fixture",
    ),
    pytest.param(
        "26651:triton-kv-lens",
        {
            f"{DEV2}cg=graph,builder=glue,gpu_only=off": "DIVERGE",
            f"{DEV2}cg=graph,builder=kit,gpu_only=off": "DIVERGE",
            f"{DEV2}cg=eager,builder=glue,gpu_only=off": "PASS",
        },
        id="26651-triton-kv-lens",
    ),
    pytest.param(
        "26651:clamp",
        {
            f"{DEV2}cg=graph-padded,builder=kit,gpu_only=off": "INVARIANT",
            f"{DEV2}cg=graph,builder=kit,gpu_only=off": "PASS",  # no padded row, nothing to clamp
        },
        id="26651-clamp",
    ),
    pytest.param(
        "26738:triton-none",
        {
            f"{VERIFY}cg=eager,gpu_only=on": "CRASH",
            f"{VERIFY}cg=eager,gpu_only=off": "PASS",
            f"{VERIFY}cg=graph,gpu_only=on": "PASS",  # graph replay never runs the eager init
        },
        id="26738-triton-none",
    ),
    # The masking that hid the Triton bug: kit fixture and Triton reverted together agree with
    # each other, the batch the production glue builds does not.
    pytest.param(
        "26651:fixture,26651:triton-kv-lens",
        {
            f"{DEV2}cg=graph,builder=kit,gpu_only=off": "PASS",
            f"{DEV2}cg=graph,builder=glue,gpu_only=off": "DIVERGE",
        },
        id="26651-fixture-masks-triton-kv-lens",
    ),
]


@pytest.mark.parametrize("revert, expected", DETECTIONS)
def test_toggle_part_is_detected_on_real_sglang(revert, expected):
    require_sglang()
    cells = _cells(_run(globs=tuple(expected), revert=revert))
    got = {name: cells[name]["verdict"] for name in expected}
    assert got == expected, json.dumps({n: cells[n]["findings"][:2] for n in expected}, indent=1)
    for name, verdict in expected.items():
        cell = cells[name]
        if verdict == "DIVERGE":
            assert cell["error"]["bad_fraction"] > 0.5, cell["error"]
        elif verdict == "INVARIANT":
            messages = [f["message"] for f in cell["findings"] if f["verdict"] == "INVARIANT"]
            assert any(m.startswith("replay: kv_indptr not monotone") for m in messages), messages
        elif verdict == "CRASH":
            crash = next(f for f in cell["findings"] if f["verdict"] == "CRASH")
            assert crash["type"] == "TypeError", crash
            assert "srt/layers/attention/triton_backend.py" in crash["frame"], crash
            assert "init_forward_metadata" in crash["frame"], crash


def test_deterministic_reaches_the_backend_beside_the_speculative_sizes():
    """deterministic: true publishes --enable-deterministic-inference over the kit runner's server
    args without dropping what was published before (a tree's speculative sizes): the backend
    takes the fixed-tile decode splits and still sizes its verify mask for the tree."""
    require_sglang()
    report = _run(globs=("sglang-triton-target-verify-det@*", "sglang-triton-target-verify-tree@cg=graph"))
    assert {c["scenario"]: c["verdict"] for c in report["cells"]} == {
        "sglang-triton-target-verify-det@cg=eager": "PASS",
        "sglang-triton-target-verify-det@cg=graph": "PASS",
        "sglang-triton-target-verify-tree@cg=graph": "PASS",
    }
    seen = report["published"]
    for name in ("sglang-triton-target-verify-det@cg=eager", "sglang-triton-target-verify-det@cg=graph"):
        assert seen[name] == {"enable_deterministic": True, "num_draft_tokens": 8, "split_tile_size": 256}, seen[name]
    assert seen["sglang-triton-target-verify-tree@cg=graph"]["enable_deterministic"] is False
    assert seen["sglang-triton-target-verify-tree@cg=graph"]["num_draft_tokens"] == 8


def test_a_cells_fingerprint_leaves_out_what_no_kernel_of_it_read():
    """The window fields are read by window layers only, the Lean buffers by the Lean kernel only
    (no launch here asks for it), uneven_batch on ROCm only: left out of the digest and named;
    a window layer's cell digests its window fields."""
    require_sglang()
    plain, window = "sglang-triton-decode@cg=eager,gpu_only=off", "sglang-triton-decode-swa@cg=eager,gpu_only=off"
    cells = _cells(_run(globs=(plain, window), fingerprint=True))
    unread = {name: set(cells[name]["fingerprint"].get("unread") or {}) for name in (plain, window)}
    lean = {"lean_Mp", "lean_Lp", "lean_Op", "lean_locks"}
    assert {"window_kv_indptr", "window_kv_indices", "uneven_batch", "swa_attn_logits"} | lean <= unread[plain]
    assert lean | {"uneven_batch"} <= unread[window]
    assert not {"window_kv_indptr", "window_kv_indices"} & unread[window]
    assert cells[plain]["fingerprint"]["metadata"] and cells[window]["fingerprint"]["metadata"]


# FlashInfer's plain EXTEND under sglang's full prefill CUDA graph (sglang-fi-extend-graph in
# flashinfer.yaml): the kit's PrefillGraphRunner, the backend's _create_full_cg_prefill_wrappers
# and the EXTEND branch of its init_forward_metadata_out_graph.
_FI_EXTEND_GRAPH = "sglang-fi-extend-graph@"
_FI_CELLS = ("cg=eager", "cg=graph", "cg=graph-padded")
# The out-of-graph replay plan of a plain EXTEND (its first line is the branch's own).
_FULL_CG_REPLAY = "prefill_wrappers=self.full_cg_prefill_wrappers,\n                use_ragged=False,"


def test_flashinfer_extend_graph_replays_the_full_prefill_graph(tmp_path):
    """Eager, graph and padded graph (a larger token bucket and a sentinel request slot) all match
    the reference on every row."""
    require_sglang()
    cells = {c["scenario"]: c for c in run_cli(tmp_path, "-s", f"{_FI_EXTEND_GRAPH}*")["cells"]}
    assert set(cells) == {_FI_EXTEND_GRAPH + cell for cell in _FI_CELLS}, sorted(cells)
    for name, c in cells.items():
        assert c["verdict"] == "PASS", (name, c["findings"][:2])
        assert c["error"]["rows"] == 21 and c["error"]["bad_rows"] == 0, (name, c["error"])
        assert ("capture" in c["timings_ms"]) == (not name.endswith("eager")), (name, c["timings_ms"])


@pytest.mark.parametrize(
    "old,new,verdict",
    [
        # The replay plans a ragged part the captured graph never runs: the new tokens' own keys
        # are left out of the paged wrapper it does run.
        (_FULL_CG_REPLAY, _FULL_CG_REPLAY.replace("use_ragged=False", "use_ragged=True"), "DIVERGE"),
        # kv_indices sized by the bucket, not by the slots' context: a capture fits, a replay over
        # cached prefixes does not.
        ("(num_slots * self.max_context_len + 256,)", "(max_num_tokens + 256,)", "CRASH"),
    ],
    ids=["replay-plans-ragged", "kv-indices-by-bucket"],
)
def test_a_broken_full_prefill_graph_fails_its_graph_cells_alone(tmp_path, old, new, verdict):
    require_sglang()
    patch = breaking_patch(tmp_path, "flashinfer_backend", old, new)
    report = run_cli(tmp_path, "-s", f"{_FI_EXTEND_GRAPH}*", "--apply", str(patch))
    cells = {c["scenario"]: c for c in report["cells"] if c.get("toggles")}
    assert {name: c["verdict"] for name, c in cells.items()} == {
        _FI_EXTEND_GRAPH + "cg=eager": "PASS",
        _FI_EXTEND_GRAPH + "cg=graph": verdict,
        _FI_EXTEND_GRAPH + "cg=graph-padded": verdict,
    }, {name: c["findings"][:1] for name, c in cells.items()}
