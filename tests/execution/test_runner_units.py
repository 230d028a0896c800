"""Runner building blocks: the reference, invariants, the CPU sync watch, and worker isolation."""

from __future__ import annotations

import json
import math
import types

import torch
from clihelp import run_cli

from sglfix.harness.invariants import check_metadata
from sglfix.harness.reference import compare_outputs, reference_attention
from sglfix.harness.syncwatch import watch_syncs


def _naive(q, k, v, mask, scale):
    bs, nq, h, d = q.shape
    group = h // k.shape[2]
    out = torch.zeros(bs, nq, h, d, dtype=torch.float64)
    for b in range(bs):
        for i in range(nq):
            for hh in range(h):
                idx = mask[b, i].nonzero().flatten()
                if idx.numel() == 0:
                    continue
                s = (k[b, idx, hh // group].double() @ q[b, i, hh].double()) * scale
                p = torch.softmax(s, 0)
                out[b, i, hh] = p @ v[b, idx, hh // group].double()
    return out


def test_reference_matches_a_naive_loop():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=g).half()
    k = torch.randn(2, 6, 2, 8, generator=g).half()
    v = torch.randn(2, 6, 2, 8, generator=g).half()
    mask = torch.rand(2, 3, 6, generator=g) > 0.4
    mask[:, :, 0] = True
    mask[1, 2] = False  # a row that sees nothing gives zeros
    ref = reference_attention(q_pad=q, k_pad=k, v_pad=v, mask=mask, scale=1 / math.sqrt(8))
    assert torch.allclose(ref, _naive(q, k, v, mask, 1 / math.sqrt(8)), atol=1e-9)


def test_compare_outputs_locates_the_first_bad_row():
    ref = torch.zeros(2, 3, 1, 4, dtype=torch.float64)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    out = torch.zeros(5, 1, 4)
    out[3, 0, 2] = 0.5  # request 1, row 1
    out[4, 0, 0] = float("nan")
    c = compare_outputs(out=out, ref=ref, q_valid=valid, tolerance=1e-2)
    assert (c.bad_rows, c.rows, c.first_bad_request, c.first_bad_row, c.nonfinite) == (2, 5, 1, 1, 1)
    assert c.max_abs == float("inf") or c.max_abs >= 0.5
    ok = compare_outputs(out=torch.zeros(5, 1, 4), ref=ref, q_valid=valid, tolerance=1e-2)
    assert ok.bad_rows == 0 and ok.first_bad_request is None


def test_invariants_flag_each_kind_of_corruption():
    md = types.SimpleNamespace(
        kv_indptr=torch.tensor([0, 3, 1, 4]),
        kv_indices=torch.arange(10),
        qo_indptr=torch.tensor([1, 2, 3, 4]),
        mask_indptr=None,
        max_extend_len=4,
    )
    found = check_metadata(md, rows=3, num_slots=100, phase="replay")
    assert any("kv_indptr not monotone at row 1: 3 -> 1" in f for f in found)
    assert any("qo_indptr[0] = 1" in f for f in found)
    md = types.SimpleNamespace(
        kv_indptr=torch.tensor([0, 2, 5]),
        kv_indices=torch.tensor([1, 2, 3, 99, 4]),
        qo_indptr=None,
        mask_indptr=None,
        max_extend_len=None,
    )
    assert check_metadata(md, rows=2, num_slots=50, phase="eager") == [
        "eager: kv_indices[3] = 99 (row 1) outside the KV pool [0, 50)"
    ]
    md.kv_indptr = torch.tensor([0, 2, 9])
    assert "exceeds kv_indices length" in check_metadata(md, rows=2, num_slots=200, phase="eager")[0]
    md.kv_indptr = torch.tensor([0, 2, 5])
    md.kv_indices = torch.tensor([1, 2, 3, 4, 5])
    assert check_metadata(md, rows=2, num_slots=50, phase="eager") == []


def test_cpu_sync_watch_sees_host_reads_from_the_code_under_test_only():
    t = torch.tensor([3, 1, 2])
    backend_code = compile("def probe(t):\n    return int(t.max().item())\n", "backend.py", "exec")
    ns = {"__name__": "sglfix.backends.fake"}
    exec(backend_code, ns)
    with watch_syncs("cpu") as found:
        assert ns["probe"](t) == 3
        t.max().item()  # the tool's own read: not the engine's doing
    assert len(found) == 1 and "sglfix.backends.fake:2 in probe" in found[0]
    with watch_syncs("cpu", enabled=False) as off:
        ns["probe"](t)
    assert off == []
    assert torch.Tensor.item.__name__ == "item"  # restored


def test_sync_free_cuda_is_judged_on_cuda_only_and_a_cpu_cell_says_it_was_not(tmp_path):
    # The reproduction's FlashInfer stand-in plans on the host: declared sync-free everywhere, its
    # CPU cell is SYNC; declared for CUDA only, the CPU cell passes and says the promise went unjudged.
    node = (
        "name: fi-sync-{how}\nbackend: flashinfer\nmode: DRAFT_DECODE\nbatch: {{prefix_lens: [37, 5]}}\n"
        "model: {{num_heads: 4, num_kv_heads: 2, head_dim: 64, dtype: float16}}\nspec: {{topk: 1, num_steps: 3}}\n"
        "sync_free: {how}\n"
    )
    verdicts = {}
    for how in ("true", "cuda"):
        path, report = tmp_path / f"{how}.yaml", tmp_path / f"{how}.json"
        path.write_text(node.format(how=how))
        run_cli("run", "--scenario-file", str(path), "--device", "cpu", "--no-cache", "--json", str(report))
        (cell,) = json.loads(report.read_text())["cells"]
        verdicts[how] = cell["verdict"], [f for f in cell["findings"] if f.get("syncs_checked") is False]
    assert verdicts["true"][0] == "SYNC" and verdicts["true"][1] == []
    assert verdicts["cuda"][0] == "PASS" and "declared for CUDA only" in verdicts["cuda"][1][0]["message"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(node.format(how="gpu"))
    refused = run_cli("run", "--scenario-file", str(bad), "--device", "cpu", "--no-cache")
    assert refused.code == 2 and "must be true, false or cuda" in refused.out + refused.err


def test_a_cuda_sync_warning_counts_where_the_code_under_test_made_it_only():
    """torch's sync warnings are attributed from the live stack: through the harness's pass-through
    frames (its allocation mode makes the engine's call) to the engine's frame; a sync of the
    harness's own (building or reading back the ground truth) is not the engine's."""
    import warnings

    from sglfix.harness.syncwatch import _sync_recorder

    def passthrough(call):
        __sglfix_passthrough__ = True  # noqa: F841
        return call()

    # A torch operation that synchronizes: the warning is raised in its frame.
    op = {"__name__": "torch.fake", "warnings": warnings}
    exec('def sync():\n    warnings.warn("called a synchronizing CUDA operation (at x.cpp:1.)", stacklevel=1)\n', op)
    sync = op["sync"]
    ns = {"__name__": "sglfix.backends.fake", "passthrough": passthrough, "sync": sync}
    exec(compile("def engine():\n    return passthrough(sync)\n", "backend.py", "exec"), ns)
    found: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _sync_recorder(found)
        ns["engine"]()
        passthrough(sync)  # the harness's own: no engine frame on the stack
        warnings.warn("another warning", stacklevel=1)
    assert found == ["called a synchronizing CUDA operation (at x.cpp:1.) at sglfix.backends.fake:2 in engine"], found


FAULT_TOGGLE = """\
pr: 55555
title: test-only toggle that makes the worker die or hang
parts:
  die:
    summary: kill the worker process
    patches:
      - target: sglfix.backends.srt.model_executor.cuda_graph_runner.run_eager
        edits:
          - match: backend.init_forward_metadata(forward_batch)
            prepend: |
              import os, signal
              os.kill(os.getpid(), signal.SIGKILL)
  hang:
    summary: never return
    patches:
      - target: sglfix.backends.srt.model_executor.cuda_graph_runner.run_eager
        edits:
          - match: backend.init_forward_metadata(forward_batch)
            prepend: |
              import time
              time.sleep(600)
"""


def test_worker_fault_and_timeout_are_verdicts_and_the_worker_restarts(toggles_dir, tmp_path):

    (toggles_dir / "55555.yaml").write_text(FAULT_TOGGLE)
    out = tmp_path / "r.json"
    scen = "triton-decode@cg=eager,gpu_only=off"
    for rid, verdict in (("55555:die", "FAULT"), ("55555:hang", "TIMEOUT")):
        r = run_cli(
            "run",
            "-r",
            rid,
            "-s",
            scen,
            "-s",
            "triton-extend",
            "--device",
            "cpu",
            "-j",
            "1",
            "--timeout",
            "4",
            "--json",
            str(out),
            timeout=300,
            subprocess=True,
        )
        assert r.code == 1, r.out + r.err
        cells = {c["scenario"]: c for c in json.loads(out.read_text())["cells"]}
        assert cells[scen]["verdict"] == verdict, cells[scen]
        # The next cell ran in a restarted worker (with the same revert, so it fails the same way).
        assert cells["triton-extend"]["verdict"] == verdict
    r = run_cli("run", "-s", scen, "--device", "cpu", "--json", str(out), subprocess=True)
    assert r.code == 0


def test_a_worker_that_cannot_start_stops_the_run_with_one_line(tmp_path):
    shadow = tmp_path / "torch"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('torch is broken here')\n")
    r = run_cli("run", "-s", "triton-extend", "--device", "cpu", env={"PYTHONPATH": str(tmp_path)}, subprocess=True)
    assert r.code == 2 and "worker failed to start" in r.err and "torch is broken here" in r.err
    assert len([line for line in r.err.splitlines() if line.strip()]) == 1
