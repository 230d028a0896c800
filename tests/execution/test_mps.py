"""Workers sharing a GPU through an MPS daemon of the run's own (sglfix.execution.mps, the pool).

On the CPU box: when a run asks for MPS and when it refuses. On a GPU with the MPS control
program: a fatal fault in one worker's cell (a Triton kernel storing through a wild pointer)
reaches every worker under MPS; each cell that lost its context runs again alone, outside MPS, so
that the faulting cell keeps its own verdict, every other cell passes, and neither worker nor
daemon is left behind. Without MPS the same cells give the same verdicts, and the worker whose
context the fault broke is replaced instead of failing every cell after it.
"""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from builders import SCEN, SCEN2, assert_matched, cell, write_toggle
from clihelp import run_cli
from procs import alive

from sglfix.common.errors import ConfigError
from sglfix.execution.devices import has_cuda_device
from sglfix.execution.mps import CONTROL, check_mps
from sglfix.execution.pool import WorkerConfig, WorkerPool

WILD = 90019
SPIN = 90023


def test_auto_takes_mps_only_for_local_workers_on_cuda(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert check_mps("auto", device="cuda", executor="local")
    assert not check_mps("auto", device="cuda", executor="ray")
    assert not check_mps("auto", device="cpu", executor="local")
    assert not check_mps("off", device="cuda", executor="local")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert not check_mps("auto", device="cuda", executor="local")
    # The user's own daemon: the workers reach it anyway.
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/theirs")
    assert check_mps("auto", device="cuda", executor="local")


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"device": "cpu", "executor": "local"}, "the cells run on the CPU"),
        ({"device": "cuda", "executor": "ray"}, "Ray places its actors itself"),
    ],
)
def test_on_where_it_cannot_be_is_refused_naming_why(kw, says):
    with pytest.raises(ConfigError, match=f"--mps on: {says}"):
        check_mps("on", **kw)


def test_the_cli_refuses_mps_on_for_a_cpu_run_in_one_line():
    r = run_cli("matrix", "-s", SCEN, "--device", "cpu", "--mps", "on", subprocess=True)
    assert r.code == 2, r.err
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--mps on: the cells run on the CPU" in lines[0], r.err


_CUDA_MPS = pytest.mark.skipif(
    shutil.which(CONTROL) is None or shutil.which("nvidia-smi") is None,
    reason="needs a GPU and the MPS control program",
)


def _wild_toggle(d: Path) -> None:
    (d / "wild_store.py").write_text(
        textwrap.dedent(
            """
            import torch, triton, triton.language as tl

            @triton.jit
            def _store(p, off):
                tl.store(p + off, 1.0)

            def wild():
                x = torch.ones(4, device="cuda")
                _store[(1,)](x, 1 << 40)
                torch.cuda.synchronize()
            """
        )
    )
    write_toggle(d, WILD, preamble=f"import sys\nsys.path.insert(0, {str(d)!r})\nfrom wild_store import wild\nwild()")


def _daemons() -> set[str]:
    out = subprocess.run(["pgrep", "-f", "nvidia-cuda-mps"], capture_output=True, text=True).stdout
    return set(out.split())


@_CUDA_MPS
@pytest.mark.parametrize("mps", [True, False])
def test_a_fault_under_mps_is_only_ever_its_own_cells(tmp_path, mps):
    d = tmp_path / "toggles"
    d.mkdir()
    _wild_toggle(d)
    before = _daemons()
    plain = [cell(name) for name in (SCEN, SCEN2) for _ in range(6)]
    cells = [*plain[:4], cell(SCEN, str(WILD)), *plain[4:]]
    with WorkerPool(WorkerConfig(device="cuda", toggles_dir=str(d), timeout=120), jobs=3, mps=mps) as p:
        assert p.mps is mps
        results = p.run(cells)
        pids = p.pids
        after_fault = p.run([cell(SCEN), cell(SCEN2)])  # the pool goes on
    assert_matched(results, cells)
    verdicts = [r.verdict for r in results]
    wild = results[4]
    assert wild.verdict == "CRASH" and "illegal memory access" in wild.key_figure, wild.findings
    assert verdicts[:4] + verdicts[5:] == ["PASS"] * 12, [(r.verdict, r.key_figure) for r in results]
    assert [r.verdict for r in after_fault] == ["PASS", "PASS"]
    if mps:
        assert any(line.startswith(f"{WILD}::{SCEN}: its GPU context was lost under MPS") for line in p.reran_alone)
        assert any(line.endswith("alone it gave CRASH") for line in p.reran_alone), p.reran_alone
    else:
        assert p.reran_alone == []
    assert not any(alive(pid) for pid in pids)
    assert _daemons() <= before, "an MPS daemon outlived its pool"


def _spin_toggle(d: Path) -> None:
    """A toggle whose kernel never ends (it waits for a flag nothing sets)."""
    (d / "spin.py").write_text(
        textwrap.dedent(
            """
            import torch, triton, triton.language as tl

            @triton.jit
            def _spin(p):
                v = tl.load(p, volatile=True)
                while v == 0:
                    v = tl.load(p, volatile=True)

            def spin():
                x = torch.zeros(1, device="cuda", dtype=torch.int32)
                _spin[(1,)](x)
                torch.cuda.synchronize()
            """
        )
    )
    write_toggle(d, SPIN, preamble=f"import sys\nsys.path.insert(0, {str(d)!r})\nfrom spin import spin\nspin()")


@_CUDA_MPS
def test_a_cell_whose_kernel_never_ends_under_mps_times_out_alone_and_the_run_goes_on(tmp_path):
    # Its worker is killed with the kernel in flight: the daemon may then refuse new clients, and
    # the kernel held the SMs every worker there shared. The run must neither stop (a fresh worker
    # finding no GPU is not the user's setup) nor blame the others.
    d = tmp_path / "toggles"
    d.mkdir()
    _spin_toggle(d)
    before = _daemons()
    plain = [cell(name) for name in (SCEN, SCEN2) for _ in range(4)]
    cells = [*plain[:3], cell(SCEN, str(SPIN)), *plain[3:]]
    with WorkerPool(WorkerConfig(device="cuda", toggles_dir=str(d), timeout=20), jobs=3, mps=True) as p:
        assert p.mps
        results = p.run(cells)
        pids = p.pids
        after = p.run([cell(SCEN), cell(SCEN2)])  # the pool goes on
    assert_matched(results, cells)
    assert results[3].verdict == "TIMEOUT", results[3].findings
    others = [r for i, r in enumerate(results) if i != 3]
    assert [r.verdict for r in others] == ["PASS"] * 8, [(r.verdict, r.key_figure) for r in others]
    assert [r.verdict for r in after] == ["PASS", "PASS"]
    assert any("timed out" in line and "under MPS" in line for line in p.reran_alone), p.reran_alone
    assert any(line.endswith("alone it gave TIMEOUT") for line in p.reran_alone), p.reran_alone
    assert not any(alive(pid) for pid in pids)
    assert _daemons() <= before, "an MPS daemon outlived its pool"


def test_a_daemon_that_does_not_come_up_is_one_line_when_asked_for_else_the_workers_go_without(monkeypatch):
    from sglfix.execution import mps, pool

    monkeypatch.setattr(pool, "users_daemon", lambda: None)
    monkeypatch.setattr(mps, "CONTROL", "sglfix-no-such-mps-control")
    # Where MPS matters, a GPU: its workers go without MPS and run their cells there. On the CPU
    # box the same fallback with CPU cells (a GPU machine's own triton may be too old for the
    # interpreter, which the CLI refuses before any cell runs).
    config = WorkerConfig(device="cuda" if has_cuda_device() else "cpu", timeout=120)
    with pytest.raises(ConfigError, match="--mps: sglfix-no-such-mps-control did not start"):
        WorkerPool(config, jobs=2, mps=True, mps_required=True)
    with WorkerPool(config, jobs=2, mps=True) as p:
        assert not p.mps
        results = p.run([cell(SCEN), cell(SCEN2)])
    assert [r.verdict for r in results] == ["PASS", "PASS"], [r.findings for r in results]
