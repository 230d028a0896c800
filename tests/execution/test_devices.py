"""--devices and --executor: bad values are one-line errors before any cell; workers dealt over
the listed GPUs, each seeing only its own (checked on the worker processes' real environment)."""

from __future__ import annotations

import os

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.execution.devices import parse_devices
from sglfix.execution.pool import WorkerPool
from sglfix.execution.worker import WorkerConfig


@pytest.mark.parametrize(
    "text, want", [("cuda:0,cuda:1", ["0", "1"]), ("0,1", ["0", "1"]), (" cuda:3 ", ["3"]), ("1,cuda:0", ["1", "0"])]
)
def test_device_lists_parse(text, want):
    assert parse_devices(text) == want


@pytest.mark.parametrize("text", ["cuda:x", "0,0", "cuda:0,", "-1", "gpu0", "", "cuda:12345"])
def test_bad_device_lists_are_config_errors(text):
    with pytest.raises(ConfigError, match="--devices"):
        parse_devices(text)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--devices", "cuda:x"], "is not a CUDA device"),
        (["--devices", "0,cuda:0"], "listed twice"),
        (["--devices", "0,1,2", "--jobs", "2"], "fewer workers than the 3 GPUs"),
        (["--devices", "0", "--device", "cpu"], "--device cpu"),
        (["--ray-address", "auto"], "--executor ray"),
        (["--executor", "dask"], "'dask' is not one of 'local', 'ray'"),
    ],
)
@pytest.mark.parametrize("command", ["run", "matrix"])
def test_bad_scale_out_options_exit_2_before_any_cell(tmp_path, command, args, needle):
    out = tmp_path / "r.json"
    r = run_cli(command, *args, "-s", "triton-decode@cg=eager,gpu_only=off", "--json", str(out))
    assert_one_line_error(r, needle)
    assert not out.exists()


def test_a_listed_gpu_that_is_not_there_is_named(tmp_path):
    import torch

    index = str(max(torch.cuda.device_count(), 0) + 7)  # never a GPU of this machine
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    argv = ("matrix", "--devices", f"cuda:{index}", "-s", "triton-decode@cg=eager,gpu_only=off", "--json", str(out))
    r = run_cli(*argv, env=env)
    if torch.cuda.device_count():  # the worker given that GPU says which one it lacks
        assert_one_line_error(r, f"CUDA_VISIBLE_DEVICES={index}", "--devices")
    else:  # no GPU at all: nothing claims a variable the user never set
        line = assert_one_line_error(r, f"--devices cuda:{index}", "no CUDA device")
        assert "CUDA_VISIBLE_DEVICES" not in line
        line = assert_one_line_error(run_cli(*argv, env={**env, "CUDA_VISIBLE_DEVICES": "3"}), "--devices")
        assert "CUDA_VISIBLE_DEVICES=3 is set" in line
    assert not out.exists()


@pytest.mark.parametrize("jobs, want", [(None, [b"1", b"0"]), (5, [b"1", b"0", b"1", b"0", b"1"])])
def test_workers_are_dealt_over_the_devices_each_seeing_only_its_own(jobs, want):
    # device=auto boots on the CPU where the listed GPU is not there (a CPU-only worker would
    # hide every GPU itself): what is checked is the environment each worker process really got.
    with WorkerPool(WorkerConfig(device="auto", timeout=60), jobs=jobs, devices=["1", "0"]) as pool:
        _ = pool.info
        seen = []
        for w in pool.workers:
            with open(f"/proc/{w.proc.pid}/environ", "rb") as fh:
                env = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
            seen.append(env.get(b"CUDA_VISIBLE_DEVICES"))
    assert seen == want


@pytest.mark.parametrize(
    "cores, mib, gpus, want",
    [
        (16, 81559, None, 8),  # one H100, 16 cores: cores allow 8, memory 13
        (64, 81559, 4, 16),  # four H100s, 64 cores: 8 a GPU would be 32; a quarter of the cores
        (32, 81559, 2, 8),  # two GPUs, 32 cores
        (8, 81559, 4, 4),  # few cores: still one a GPU
        (16, 24576, 1, 4),  # a 24 GB card holds four
        (16, 8192, 1, 1),  # an 8 GB card: one
        (16, 81559, 1, 8),  # --devices 0 runs as --device cuda does
    ],
)
def test_default_workers_follow_the_gpus_memory_and_cores(monkeypatch, cores, mib, gpus, want):
    from sglfix.execution import devices

    monkeypatch.setattr(devices, "_cores", lambda: cores)
    monkeypatch.setattr(devices, "query_gpus", lambda *fields: [str(mib)] * (gpus or 1))
    monkeypatch.setattr(devices, "has_cuda_device", lambda: True)
    assert devices.check_jobs(None, "cuda", gpus=gpus) == want


@pytest.mark.parametrize(
    "cores, mib, want",
    [
        (16, 81559, 12),  # one H100 under MPS: three quarters of 16 cores; memory allows 15
        (32, 81559, 12),  # more cores: at most 12
        (8, 81559, 6),  # fewer cores
        (16, 24576, 4),  # a 24 GB card
        (64, 143771, 12),  # an H200: at most 12
    ],
)
def test_under_mps_a_gpu_holds_more_workers(monkeypatch, cores, mib, want):
    from sglfix.execution import devices

    monkeypatch.setattr(devices, "_cores", lambda: cores)
    monkeypatch.setattr(devices, "query_gpus", lambda *fields: [str(mib)])
    monkeypatch.setattr(devices, "has_cuda_device", lambda: True)
    assert devices.check_jobs(None, "cuda", mps=True) == want
    assert devices.check_jobs(None, "cuda", mps=False) <= want


def test_under_mps_several_gpus_still_share_a_quarter_of_the_cores(monkeypatch):
    from sglfix.execution import devices

    monkeypatch.setattr(devices, "_cores", lambda: 64)
    monkeypatch.setattr(devices, "query_gpus", lambda *fields: ["143771"] * 4)
    monkeypatch.setattr(devices, "has_cuda_device", lambda: True)
    assert devices.check_jobs(None, "cuda", gpus=4, mps=True) == 16
    assert devices.check_jobs(None, "cuda", gpus=2, mps=True) == 16  # 24 a GPU by cores, 12 at most
    monkeypatch.setattr(devices, "_cores", lambda: 32)
    # Two GPUs of a 32-core host: a quarter of the cores would be 8, fewer than one GPU gets alone.
    assert (
        devices.check_jobs(None, "cuda", gpus=2, mps=True) == devices.check_jobs(None, "cuda", gpus=1, mps=True) == 12
    )


def test_jobs_with_devices_is_the_total_dealt_over_them():
    from sglfix.execution.devices import check_jobs, deal_devices

    assert check_jobs(5, "cuda", gpus=2) == 5
    assert deal_devices(["0", "1"], 5) == ["0", "1", "0", "1", "0"]
    assert deal_devices(["2", "0", "1"], 2) == ["2", "0"]  # a small plan still spreads over the GPUs
    with pytest.raises(ConfigError, match="--jobs 1 is fewer workers than the 2 GPUs"):
        check_jobs(1, "cuda", gpus=2)


def test_ray_actors_share_the_listed_gpus_as_local_workers_do():
    """Ray packs fractional GPUs: 16 actors on four listed GPUs ask a quarter each (four to a GPU),
    four ask a whole one; without --devices, the GPUs Ray sees are shared the same way."""
    from sglfix.execution.ray_pool import _gpu_share

    class SeesTwo:
        @staticmethod
        def cluster_resources():
            return {"GPU": 2.0}

    four = ["0", "1", "2", "3"]
    assert _gpu_share(SeesTwo, 16, four) == 0.25
    assert _gpu_share(SeesTwo, 4, four) == 1
    assert _gpu_share(SeesTwo, 24, four) * 6 <= 1  # six to a GPU fit, truncated to four decimals
    assert _gpu_share(SeesTwo, 6, None) == 0.3333
    assert _gpu_share(SeesTwo, 1, None) == 1
