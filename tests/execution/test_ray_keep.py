"""--ray-keep against a real Ray head (CPU, as CI runs it): a second run takes the first run's
actors warm with the same verdicts; a changed toggle file, or one touched on disk, is never served
by a stale worker; kept actors exit after their keep time, on ``sglfix ray-workers --stop``, and
when a run is interrupted; bad values are one line before Ray is joined."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli
from procs import RAY_ENV, alive, ray_head, wait_gone

# Looked up, not imported: importing ray here took half a second of every session's collection.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the test extra installs ray")

SUBSET = ["-s", "triton-decode@cg=eager*"]
ENV = RAY_ENV
TOGGLES = ROOT / "toggles"


@pytest.fixture(scope="module")
def head():
    """A Ray head of its own for this module, torn down with it."""
    with ray_head(num_cpus=2) as port:
        yield f"127.0.0.1:{port}"


def _matrix(head: str, tmp_path: Path, name: str, *pre: str, keep: str = "120"):
    path = tmp_path / f"{name}.json"
    r = run_cli(
        *pre, "matrix", "--parts", *SUBSET, "--device", "cpu", "--jobs", "2", "--executor", "ray", "--ray-address", head,
        "--ray-keep", keep, "--json", str(path), env=ENV, timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 0, r.out[-2000:] + r.err[-3000:]
    return json.loads(path.read_text())


def _kept(head: str) -> list[dict]:
    r = run_cli("ray-workers", "--ray-address", head, "--json", env=ENV, timeout=120, subprocess=True)
    assert r.code == 0, r.err[-2000:]
    return json.loads(r.out)


def _stop_all(head: str) -> None:
    r = run_cli(
        "ray-workers", "--ray-address", head, "--stop", "--all", "--json", env=ENV, timeout=120, subprocess=True
    )
    assert r.code == 0, r.err[-2000:]
    wait_gone([row["pid"] for row in json.loads(r.out) if "pid" in row], timeout=30)


def _verdicts(report: dict) -> dict:
    return {c["id"]: (c["verdict"], c.get("findings")) for c in report["cells"]}


def test_a_second_run_takes_the_kept_actors_warm_with_the_same_verdicts(head, tmp_path):
    _stop_all(head)
    first = _matrix(head, tmp_path, "first")
    assert first["executor"]["kept"]["started"] == 2 and first["executor"]["kept"]["reused"] == 0
    kept = _kept(head)
    assert len(kept) == 2 and not any(row["claimed"] for row in kept), kept
    second = _matrix(head, tmp_path, "second")
    assert second["executor"]["name"] == "ray"
    assert second["executor"]["kept"]["reused"] == 2 and second["executor"]["kept"]["started"] == 0, second["executor"]
    assert _verdicts(second) == _verdicts(first)
    # The same two actors (processes), idle again, their keep time counting from the second run.
    again = _kept(head)
    assert sorted(r["pid"] for r in again) == sorted(r["pid"] for r in kept)
    assert all(r["exits_in_s"] > 60 for r in again), again
    _stop_all(head)


def test_a_changed_or_touched_toggle_file_is_never_served_by_a_stale_worker(head, tmp_path):
    _stop_all(head)
    toggles = tmp_path / "toggles"
    shutil.copytree(TOGGLES, toggles)
    first = _matrix(head, tmp_path, "first", "--toggles", str(toggles))
    old = {r["pid"] for r in _kept(head)}
    assert first["executor"]["kept"]["started"] == 2
    # Content changed: another identity, so the old actors are not even asked; the head's two
    # CPUs are theirs, so this run stops them (idle, of another identity) to make room.
    victim = sorted(toggles.glob("*.yaml"))[0]
    victim.write_text(victim.read_text() + "\n# edited\n")
    began = time.monotonic()
    second = _matrix(head, tmp_path, "second", "--toggles", str(toggles))
    kept = second["executor"]["kept"]
    assert (kept["reused"], kept["started"], kept["evicted"], kept["declined"]) == (0, 2, 2, {}), kept
    assert time.monotonic() - began < 60, "the run waited for the old actors' keep time"
    assert not wait_gone(sorted(old), timeout=30), "an evicted actor is still running"
    newer = {r["pid"] for r in _kept(head)}
    assert len(newer) == 2 and not newer & old
    # Same content, touched on disk after those actors booted: asked, each declines and exits.
    stamp = time.time() + 5
    os.utime(victim, (stamp, stamp))
    third = _matrix(head, tmp_path, "third", "--toggles", str(toggles))
    kept = third["executor"]["kept"]
    assert kept["reused"] == 0 and kept["started"] == 2, kept
    assert kept["declined"] == {"stale: files it booted from changed on disk since": 2}, kept
    assert not wait_gone(sorted(newer), timeout=30), "a stale actor outlived its refusal"
    assert _verdicts(third) == _verdicts(second)
    _stop_all(head)


def test_kept_actors_exit_after_their_keep_time_and_on_stop(head, tmp_path):
    _stop_all(head)
    # Long enough for the listing below to find them on a machine busy with other tests (with a
    # keep of 3 s they were at times gone before it ran), short enough to wait out.
    _matrix(head, tmp_path, "short", keep="12")
    pids = [r["pid"] for r in _kept(head)]
    assert len(pids) == 2
    assert not wait_gone(pids, timeout=50), "kept actors outlived --ray-keep 12"
    assert _kept(head) == []
    _matrix(head, tmp_path, "long", keep="600")
    pids = [r["pid"] for r in _kept(head)]
    r = run_cli("ray-workers", "--ray-address", head, "--stop", env=ENV, timeout=120, subprocess=True)
    assert r.code == 0 and r.out.count("-> stopped") == 2, r.out + r.err[-2000:]
    assert not wait_gone(pids, timeout=30)
    assert _kept(head) == []


def test_an_interrupted_run_keeps_nothing(head, tmp_path):
    _stop_all(head)
    proc = subprocess.Popen(
        # Every cell run (no reachability): a run of minutes, so the signal always falls inside it
        # however long the listing of its actors takes on a busy machine.
        [sys.executable, "-m", "sglfix", "matrix", "--parts", "--no-reachability", "--device", "cpu", "--jobs", "2",
         "--executor", "ray", "--ray-address", head, "--ray-keep", "600", "--json", str(tmp_path / "r.json")],
        env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Ctrl-C's default action, whatever this pytest inherited: a background job of a
        # non-interactive shell starts with SIGINT ignored, and the run would inherit that.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not _kept(head) and time.monotonic() < deadline:  # its actors exist: the run is under way
        time.sleep(0.5)
    pids = [r["pid"] for r in _kept(head)]
    assert pids, "the run never started its actors"
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert not (tmp_path / "r.json").exists()
    assert not wait_gone(pids, timeout=30), "an interrupted run left its actors behind"
    assert _kept(head) == []
    assert all(not alive(p) for p in pids)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ray-keep", "60"], "--executor ray --ray-address"),
        (["--executor", "ray", "--ray-keep", "60"], "--executor ray --ray-address"),
        (["--executor", "ray", "--ray-address", "auto", "--ray-keep", "0"], "--ray-keep 0"),
        (["--executor", "ray", "--ray-address", "auto", "--ray-keep", "nan"], "--ray-keep nan"),
        (["--executor", "ray", "--ray-address", "auto", "--ray-keep", "90000"], "at most 86400"),
    ],
)
def test_bad_ray_keep_is_one_line_before_ray_is_joined(args, needle):
    r = run_cli("matrix", "--parts", *SUBSET, "--device", "cpu", *args, env=ENV, subprocess=True)
    assert_one_line_error(r, needle)


def test_ray_workers_all_without_stop_is_one_line():
    assert_one_line_error(
        run_cli("ray-workers", "--ray-address", "auto", "--all", subprocess=True), "--all goes with --stop"
    )


def test_an_idle_worker_gives_its_cache_back_and_still_runs_cells():
    """``Worker.idle`` (what a kept actor asks when given back) answers, changes no verdict, and
    leaves the worker up: the next cell runs in the same process."""
    from sglfix.execution.worker import Worker, WorkerConfig
    from sglfix.scenario import load_scenarios

    scenario = next(s for s in load_scenarios() if s.name == "triton-decode@cg=eager,gpu_only=off")
    worker = Worker(WorkerConfig(device="cpu"))
    try:
        assert worker.idle() is None  # not up yet: nothing to give back
        first = worker.run(scenario_json=scenario.to_json(), scenario_name=scenario.name, toggles=())
        pid = worker.proc.pid
        assert worker.idle() == {"device_reserved_mib": None}
        again = worker.run(scenario_json=scenario.to_json(), scenario_name=scenario.name, toggles=())
        assert worker.proc.pid == pid and worker.restarts == 0
        assert (first.verdict, again.verdict) == ("PASS", "PASS")
    finally:
        worker.kill()


def test_identity_and_disk_state_cover_what_a_worker_runs_and_nothing_else(tmp_path):
    """The identity follows the toggles' content (not their times), the disk state follows their
    times too, and neither reads the checkout around the packages (tests, benchmarks, caches)."""
    from sglfix.execution.ray_keep import _SGLFIX_PACKAGES, _package_dirs, disk_state, identity
    from sglfix.execution.worker import WorkerConfig

    dirs = _package_dirs(_SGLFIX_PACKAGES)
    assert dirs and all(os.path.isfile(os.path.join(d, "__init__.py")) for d in dirs), dirs
    assert not any(os.path.isfile(os.path.join(d, "pyproject.toml")) for d in dirs), dirs
    toggles = tmp_path / "toggles"
    shutil.copytree(TOGGLES, toggles)
    config = WorkerConfig(device="cpu", toggles_dir=str(toggles))
    key, state = identity(config, {"num_cpus": 1}), disk_state(config)
    assert identity(config, {"num_cpus": 1}) == key and disk_state(config) == state
    assert identity(config, {"num_gpus": 0.5, "num_cpus": 0}) != key  # another Ray share
    assert identity(WorkerConfig(device="cpu", toggles_dir=str(toggles), timeout=301), {"num_cpus": 1}) != key
    victim = sorted(toggles.glob("*.yaml"))[0]
    stamp = time.time() + 5
    os.utime(victim, (stamp, stamp))
    assert identity(config, {"num_cpus": 1}) == key and disk_state(config) != state
    victim.write_text(victim.read_text() + "\n# edited\n")
    assert identity(config, {"num_cpus": 1}) != key
