"""The Ray executor (local Ray on CPU, as CI runs it): the same verdicts as the local pool, a
segfault is FAULT and the run completes, a dead actor is FAULT and replaced, no process left."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from builders import SCEN, SCEN2, write_toggle
from clihelp import run_cli
from procs import wait_untagged

SEGV, KILL_ACTOR, HANG = 90101, 90102, 90103


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ray-toggles")
    for pr, preamble in (
        (SEGV, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"),
        # The worker's parent is the actor's process: the actor dies mid-cell.
        (KILL_ACTOR, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(60)\n"),
    ):
        write_toggle(d, pr, preamble=preamble, title=f"hostile {pr}")
    return d


@pytest.fixture(scope="module")
def hanging(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ray-hang")
    write_toggle(d, HANG, preamble="import time\ntime.sleep(600)\n", title="hangs")
    return d


def _cells(report: dict) -> dict:
    return {
        (",".join(c["toggles"]), c["scenario"]): {k: v for k, v in c.items() if k not in ("timings_ms", "kernels")}
        for c in report["cells"]
    }


def _run(*args: str, tag: str, timeout: float = 600):
    return run_cli(*args, env={"SGLFIX_TEST_TAG": tag}, timeout=timeout, subprocess=True)


def _failing_under_each_executor(tmp_path, *args: str, tag: str) -> dict:
    """The same command under the local pool and under Ray, each exiting 1: executor -> its report."""
    reports = {}
    for executor in ("local", "ray"):
        path = tmp_path / f"{executor}.json"
        r = _run(*args, "--executor", executor, "--json", str(path), tag=tag)
        assert r.code == 1, r.out[-2000:] + r.err[-2000:]
        reports[executor] = json.loads(path.read_text())
    return reports


def test_ray_matrix_equals_the_local_pool_cell_by_cell(tmp_path):
    subset = ["-s", "triton-decode*", "-s", "triton-draft-extend-v2-ps16*"]
    tag = uuid.uuid4().hex
    local, ray = tmp_path / "local.json", tmp_path / "ray.json"
    r = _run("matrix", "--parts", *subset, "--device", "cpu", "--json", str(local), tag=tag)
    assert r.code == 0, r.err[-2000:]
    r = _run("matrix", "--parts", *subset, "--device", "cpu", "--executor", "ray", "--json", str(ray), tag=tag)
    assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    a, b = json.loads(local.read_text()), json.loads(ray.read_text())
    assert _cells(a) == _cells(b) and len(a["cells"]) > 50
    assert a["summary"] == b["summary"] and a["expectations"] == b["expectations"] and a["stray"] == b["stray"]
    assert not wait_untagged(tag), "processes left behind"


def test_a_segfault_is_fault_under_ray_as_locally_and_the_run_completes(tmp_path, hostile):
    tag = uuid.uuid4().hex
    # FAULT fails the run; it completes
    reports = _failing_under_each_executor(
        tmp_path, "--toggles", str(hostile), "run", "-r", str(SEGV), "-s", SCEN, "-s", SCEN2, "--device", "cpu", tag=tag
    )
    assert {c["verdict"] for c in reports["ray"]["cells"]} == {"FAULT"}
    assert _cells(reports["local"]).keys() == _cells(reports["ray"]).keys()
    for key, cell in _cells(reports["ray"]).items():
        local = _cells(reports["local"])[key]
        assert cell["verdict"] == local["verdict"] == "FAULT"
        assert (
            "signal SIGSEGV" in cell["findings"][0]["message"] and "triton_backend.py" in cell["findings"][0]["message"]
        )
    assert not wait_untagged(tag), "processes left behind"


def test_a_dead_actor_is_fault_for_its_cell_and_is_replaced(tmp_path, hostile):
    tag = uuid.uuid4().hex
    path = tmp_path / "ray.json"
    r = _run(
        "--toggles",
        str(hostile),
        "matrix",
        "-s",
        SCEN,
        "-s",
        SCEN2,
        "--device",
        "cpu",
        "--executor",
        "ray",
        "--jobs",
        "1",
        "--no-reachability",
        "--json",
        str(path),
        tag=tag,
    )
    report = json.loads(path.read_text())
    verdicts = {(",".join(c["toggles"]), c["scenario"]): c for c in report["cells"]}
    assert len(verdicts) == len(report["cells"]) == 3 * 2
    for scen in (SCEN, SCEN2):
        assert verdicts[("", scen)]["verdict"] == "PASS"  # the replacement ran the rest
        dead, segv = verdicts[(str(KILL_ACTOR), scen)], verdicts[(str(SEGV), scen)]
        assert dead["verdict"] == "FAULT" and "Ray actor died" in dead["findings"][0]["message"], dead
        assert segv["verdict"] == "FAULT" and "signal SIGSEGV" in segv["findings"][0]["message"], segv
    assert r.code == 1
    assert not wait_untagged(tag), "processes left behind"


def test_a_lost_call_of_several_cells_runs_them_again_one_by_one(hostile, monkeypatch):
    # Nine cells that each take their actor down, on one actor: the first call carries two cells
    # (a call takes a quarter of the waiting cells an actor), a second is queued behind it. Which
    # cell of the lost two-cell call killed the actor is unknown, so both run again alone: every
    # cell ends FAULT exactly once, charged to itself. (Each loss costs an actor's boot: no more
    # cells than that takes.)
    from types import SimpleNamespace

    from sglfix.cli.common import load_selected
    from sglfix.cli.context import Options
    from sglfix.execution.ray_pool import RayPool
    from sglfix.execution.worker import WorkerConfig

    tag = uuid.uuid4().hex
    monkeypatch.setenv("SGLFIX_TEST_TAG", tag)
    chosen = load_selected(Options(), ["triton-decode*@cg=eager*", "triton-extend*"], [], None)
    cells = [SimpleNamespace(scenario=s, toggles=(str(KILL_ACTOR),)) for s in (chosen * 2)[:9]]
    assert len(cells) == 9
    with RayPool(WorkerConfig(device="cpu", timeout=60, toggles_dir=str(hostile)), jobs=1) as pool:
        results = pool.run(cells)
        replaced = len(pool.replacements)
    assert [r.scenario for r in results] == [c.scenario.name for c in cells]
    for r in results:
        assert r.verdict == "FAULT" and "Ray actor died" in r.findings[0]["message"], r
    assert replaced > len(cells)  # some actor was lost on a call of several cells, and its cells ran again
    assert not wait_untagged(tag), "processes left behind"


def test_a_hang_is_timeout_at_the_same_limit_under_ray(tmp_path, hanging):
    tag = uuid.uuid4().hex
    reports = _failing_under_each_executor(
        tmp_path,
        "--toggles",
        str(hanging),
        "run",
        "-r",
        str(HANG),
        "-s",
        SCEN,
        "--device",
        "cpu",
        "--timeout",
        "8",
        tag=tag,
    )
    got = {}
    for executor, report in reports.items():
        (cell,) = report["cells"]
        got[executor] = (cell["verdict"], cell["findings"][0]["message"].split(";")[0])
    assert got["ray"] == got["local"] and got["ray"][0] == "TIMEOUT", got
    assert not wait_untagged(tag), "processes left behind"


@pytest.mark.parametrize(
    ("gpus", "size", "devices", "share"),
    [(1, 4, None, 0.25), (2, 4, None, 0.5), (2, 2, None, 1), (1, 3, None, 0.3333), (2, 2, ["0", "1"], 1)],
)
def test_actors_share_the_gpus_ray_sees_as_local_workers_do(gpus, size, devices, share):
    from types import SimpleNamespace

    from sglfix.execution.ray_pool import _gpu_share

    ray = SimpleNamespace(cluster_resources=lambda: {"CPU": 16.0, "GPU": float(gpus)})
    assert _gpu_share(ray, size, devices) == share
    # Every actor fits: the shares of one GPU never add up to more than it.
    assert share * size <= max(gpus, len(devices or ()))


def test_ray_without_a_gpu_on_cuda_is_one_line():
    from types import SimpleNamespace

    from sglfix.common.errors import ConfigError
    from sglfix.execution.ray_pool import _gpu_share

    with pytest.raises(ConfigError, match="Ray sees no GPU"):
        _gpu_share(SimpleNamespace(cluster_resources=lambda: {"CPU": 2.0}), 2, None)
