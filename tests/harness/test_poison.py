"""Uninitialised memory the code under test allocates holds a fixed poison pattern, so a cell that
reads rows nothing wrote gives the same verdict every run (sglfix.harness.poison)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from builders import ROOT

from sglfix.common import codebase
from sglfix.harness.poison import PATTERNS, poison_, poisoned, unwritten


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_floating_poison_is_a_nan_the_judge_recognises(dtype):
    t = poison_(torch.zeros(3, 5, dtype=dtype))
    assert torch.isnan(t).all()
    assert unwritten(t).all()
    # A NaN the code computed is not the poison: only the pattern's own bits are.
    assert not unwritten(torch.full((4,), float("nan"), dtype=dtype)).any()
    int_name, bits = PATTERNS[str(dtype).removeprefix("torch.")]
    assert int(t.view(getattr(torch, int_name))[0, 0]) & ((1 << (8 * dtype.itemsize)) - 1) == bits


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_poison_is_negative_an_index_no_pool_holds(dtype):
    t = poison_(torch.zeros(7, dtype=dtype))
    assert (t < 0).all() and t.unique().numel() == 1
    assert not unwritten(t).any()


def test_bool_and_unsigned_poison_are_fixed_bytes():
    assert poison_(torch.zeros(4, dtype=torch.uint8)).tolist() == [0xA5] * 4
    assert poison_(torch.zeros(4, dtype=torch.bool)).view(torch.uint8).tolist() == [0xA5] * 4


def test_a_bool_nothing_wrote_is_told_from_a_written_true():
    # Read as a bool, the poison is True: a mask no code filled would look all visible.
    mask = poison_(torch.zeros(6, dtype=torch.bool))
    assert bool(mask.all())
    mask[:2] = True
    mask[2] = False
    assert unwritten(mask).tolist() == [False, False, False, True, True, True]
    assert not unwritten(torch.ones(3, dtype=torch.bool)).any()


def test_only_the_code_under_tests_allocations_are_poisoned(tmp_path, monkeypatch):
    """An allocation in a file of the code under test holds the poison; one in the caller (this
    test) does not; the patched factories are restored after the block, even after an error."""
    pkg = tmp_path / "fakeengine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            import torch

            def alloc():
                return (torch.empty(6), torch.empty_like(torch.ones(2, dtype=torch.int32)),
                        torch.empty_strided((2, 2), (1, 2)), torch.ones(3).new_empty(5))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    class Record:
        package = "fakeengine"

    import fakeengine

    original = torch.empty
    codebase.set_active(Record())
    codebase.clear_package_dirs()
    try:
        with poisoned():
            floats, ints, strided, new = fakeengine.alloc()
            mine = torch.empty(1 << 20)  # fresh pages: what the allocator gives, not the pattern
            assert unwritten(floats).all() and unwritten(strided).all() and unwritten(new).all()
            assert (ints < 0).all()
            # The caller's own allocation is left as the allocator gave it.
            assert not unwritten(mine).any()
        with pytest.raises(RuntimeError), poisoned():
            raise RuntimeError("boom")
    finally:
        codebase.set_active(None)
        codebase.clear_package_dirs()
    assert torch.empty is original and not hasattr(torch.Tensor.new_empty, "__wrapped__")


_CELL_TWICE = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
from sglfix import codebases
codebases.activate("sglang-0.5.23")
from sglfix.toggling.env import maybe_revert_pr_fix
maybe_revert_pr_fix()
from sglfix.harness import interpreter
interpreter.install()
from sglfix.harness.cell import run_cell
from sglfix.scenario.loader import load_scenario_file
name = sys.argv[2]
scenario = next(s for s in load_scenario_file(sys.argv[1]) if s.name == name)
junk = [__import__("torch").randn(1 << 16) for _ in range(8)]  # recycled memory between the runs
del junk
cells = [run_cell(scenario, device="cpu", toggles=["27545:max-extend-len"]).to_json() for _ in range(2)]
print("CELLS " + json.dumps(cells))
"""


def test_rows_no_kernel_wrote_give_the_same_nan_every_run_on_real_sglang():
    """27545:max-extend-len sizes the extend grid for num_steps + 1 queries: rows past the first
    block of the wide scenario are never computed. Their output memory holds the poison, so the
    verdict is NAN with those rows named, run after run, instead of whatever the allocator held."""
    from sglfix.codebases import check_installed, get_codebase
    from sglfix.common.errors import ConfigError

    try:
        check_installed(get_codebase("sglang-0.5.23"), what="tests/harness/test_poison.py")
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
    env = {k: v for k, v in os.environ.items() if k not in ("SGLFIX_TOGGLES_DIR", "PYTHONPATH")}
    env.update(SGLFIX_PROFILE="sglang-0.5.23", SGLANG_DEBUG_REVERT_PR="27545:max-extend-len", PYTHONWARNINGS="ignore")
    scenarios = ROOT / "profiles" / "sglang-0.5.23" / "scenarios" / "triton.yaml"
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            _CELL_TWICE,
            str(scenarios),
            "sglang-triton-draft-extend-v2-wide@cg=graph,builder=glue",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CELLS ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    cells = json.loads(lines[-1][len("CELLS ") :])
    nans = [next(f for f in c["findings"] if f["verdict"] == "NAN") for c in cells]
    assert [c["verdict"] for c in cells] == ["NAN", "NAN"], [c["findings"][:2] for c in cells]
    never = [f["rows_never_written"] for f in nans]
    assert never[0] == never[1] > 0, nans
    assert "rows hold the poison" in nans[0]["message"], nans[0]["message"]
    # Every non-finite value is in a row nothing wrote: the rows the grid did cover are right.
    assert cells[0]["error"] == cells[1]["error"]
    per_row = cells[0]["error"]["nonfinite"] // never[0]
    assert per_row * never[0] == cells[0]["error"]["nonfinite"]
