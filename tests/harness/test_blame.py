"""Whose failure is it: the code under test's (CRASH) or sglfix's (ERROR)?

A cell names the owner of the innermost frame that is neither a library's nor one of sglfix's
wrappers forwarding a call (a torch function mode, Triton's launch tracer). Code the engine calls
back through sglfix's stand-in for the engine's caller breaks the caller's contract (no backend,
too few step backends): the code's crash. A fault of the GPU surfaces at the next wait, wherever
it is: the cell's kernels' fault. Each rule was an ERROR blamed on sglfix in a mutation campaign.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os

import pytest
import torch
from clihelp import run_cli

import sglfix
from sglfix.common.codebase import is_code_under_test
from sglfix.harness.cell import is_device_fault, raised_by_code_under_test
from sglfix.harness.kits.sglang_0_5_23.allocations import CudaAllocations
from sglfix.harness.misfit import PASSTHROUGH, innermost_owner

_CODE_FILE = os.path.join(
    importlib.util.find_spec("sglfix.backends").submodule_search_locations[0],
    "srt",
    "layers",
    "attention",
    "triton_backend.py",
)
_SGLFIX_FILE = os.path.join(os.path.dirname(sglfix.__file__), "harness", "cell.py")


def _compiled(source: str, filename: str, name: str):
    """A function whose frames carry ``filename``, as if it were defined there."""
    namespace: dict = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def _raised(fn, *args):
    try:
        fn(*args)
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


def test_the_frames_used_here_belong_where_they_claim():
    assert is_code_under_test(_CODE_FILE) and not is_code_under_test(_SGLFIX_FILE)


@pytest.mark.parametrize(("forwarding", "owner"), [(True, "code"), (False, "sglfix")])
def test_a_wrapper_that_was_forwarding_the_call_is_passed_over_and_one_that_raised_itself_is_not(forwarding, owner):
    wrapper = _compiled(
        f"def wrapper(op, *args):\n    {PASSTHROUGH} = {forwarding}\n    return op(*args)\n", _SGLFIX_FILE, "wrapper"
    )
    # torch's add is C: the wrapper's frame is the innermost Python frame, as for a torch function mode
    caller = _compiled(
        "def caller(wrapper):\n    return wrapper(torch.zeros(2).add, torch.zeros(3))\n", _CODE_FILE, "caller"
    )
    assert innermost_owner(_raised(caller, wrapper)) == owner


def test_a_size_mismatch_under_sglfixs_torch_function_mode_is_the_codes_crash():
    # sglang's graph runner copies into its buffers while the allocation watcher is active: the
    # watcher forwards the copy, and the mismatch is the copy's caller's.
    caller = _compiled(
        "def caller(mode):\n    with mode:\n        torch.zeros(2).copy_(torch.zeros(3))\n", _CODE_FILE, "caller"
    )
    exc = _raised(caller, CudaAllocations(remap=False))
    assert raised_by_code_under_test(exc), exc


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("CUDA error: an illegal memory access was encountered", True),
        ("CUDA error: device-side assert triggered", True),
        ("CUDA error: operation not supported on global/shared address space", True),
        ("CUDA error: misaligned address", True),
        ("CUDA error: out of memory", False),
        ("CUDA error: invalid device ordinal", False),
        ("The size of tensor a (2) must match the size of tensor b (3)", False),
    ],
)
def test_a_fault_of_the_device_is_told_from_its_text(text, fault):
    assert is_device_fault(RuntimeError(text)) is fault


def _patch(tmp_path, module: str, match: str, replace: str) -> str:
    """A diff of the installed sglang file of ``module`` in the code base's own paths, as --apply reads one."""
    # The file is found from the top-level package, which finding does not import: importing
    # sglang's submodules into the test process would leave them behind for later tests.
    top = importlib.util.find_spec("sglang").submodule_search_locations[0]
    origin = os.path.join(os.path.dirname(top), *module.split(".")) + ".py"
    with open(origin) as fh:
        text = fh.read()
    assert text.count(match) == 1, match
    rel = "python/" + module.replace(".", "/") + ".py"
    diff = difflib.unified_diff(
        text.splitlines(keepends=True), text.replace(match, replace).splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    path = tmp_path / "broken.diff"
    path.write_text(f"diff --git a/{rel} b/{rel}\n" + "".join(diff))
    return str(path)


@pytest.mark.parametrize(
    ("module", "match", "replace", "scenario", "said"),
    [
        (  # the factory builds no multi-step backend: the engine's draft loop has none to run
            "sglang.srt.speculative.draft_utils",
            "        if self.speculative_num_steps <= 1:\n            return None\n",
            "        return None\n",
            "fimla-draft-overflow@cg=eager",
            "built no draft backend",
        ),
        (  # the graph runner copies a batch into one row too few (under the allocation watcher)
            "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
            "        raw_bs = forward_batch.batch_size\n",
            "        raw_bs = forward_batch.batch_size - 1\n",
            "fimla-draft-fits@cg=graph-padded",
            "must match the size",
        ),
    ],
)
def test_what_the_code_breaks_where_sglfix_plays_the_engine_is_its_crash(
    tmp_path, module, match, replace, scenario, said
):
    patch = _patch(tmp_path, module, match, replace)
    out = tmp_path / "run.json"
    r = run_cli(
        "--profile", "sglang-0.5.23", "run", "-s", scenario, "--apply", patch,
        "--device", "cpu", "--no-cache", "--json", str(out), subprocess=True,
    )  # fmt: skip
    assert r.code == 1, r.err
    (cell,) = [c for c in json.loads(out.read_text())["cells"] if c["toggles"]]
    assert cell["verdict"] == "CRASH", cell
    assert said in cell["findings"][0]["message"], cell


def test_a_plan_flashinfer_refuses_under_sglfixs_plan_observer_is_the_planning_codes_crash():
    # On the GPU, sglfix watches each MLA step's plan() (what it is planned to read) and forwards
    # it: FlashInfer refusing metadata the code built is the code's crash.
    from sglfix.harness.adapters.sglang.draft_checks import observe_plan

    library = _compiled(
        "class Wrapper:\n    def plan(self, *args, **kwargs):\n        raise ValueError('kv_indptr metadata must start at zero.')\n",
        os.path.join(os.sep, "site-packages", "flashinfer", "mla.py"),
        "Wrapper",
    )
    wrapper = library()
    observe_plan(wrapper, {}, 0)
    caller = _compiled(
        "def caller(w):\n    w.plan(torch.zeros(2), torch.zeros(3), torch.zeros(3), torch.zeros(2))\n",
        _CODE_FILE,
        "caller",
    )
    exc = _raised(caller, wrapper)
    assert isinstance(exc, ValueError) and raised_by_code_under_test(exc), exc
