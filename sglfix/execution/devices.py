"""Where cells may run and how many workers: the device, the GPUs of --devices, the worker count
and the memory a CPU worker may hold, checked in the parent before any worker starts (this process
never imports torch)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError


def has_cuda_device() -> bool:
    """Whether a GPU is visible, without importing torch (the CLI parent never does)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def uses_cuda(device: str) -> bool:
    """Whether cells of ``device`` (auto, cpu, cuda) run on a GPU here."""
    return device == "cuda" or (device == "auto" and has_cuda_device())


def check_device(device: str) -> None:
    """``--device cuda`` where no GPU is visible is one line before any worker starts. The check
    reads the device nodes and CUDA_VISIBLE_DEVICES only (this process never imports torch); a
    GPU that is there but unusable (a CPU build of torch) is still reported by the first worker."""
    if device == "cuda" and not has_cuda_device():
        raise ConfigError("--device cuda: no CUDA device here; use --device cpu")


# What a worker holds on the GPU: up to 4 GiB of allocator cache between cells
# (sglfix.harness.allocator) plus what its current cell needs (inputs, KV pools, the graphs'
# pools, the shared 384 MiB FlashInfer workspace). Without MPS a GPU's workers take turns on it:
# on one H200 with 16 cores, 6 workers took 10.7-10.9 s of cells, 8 took 9.8-10.3 s and 12
# 10.0-10.1 s, the GPU's peak 23, 25 and 36 GB (bench/results/workspace-h200.json). Six GiB a
# worker lets an 80 GB H100 run eight; 12 GiB was the budget while every FlashInfer backend
# still made a workspace of its own.
_GPU_GIB_PER_WORKER = 6
_MAX_GPU_WORKERS = 8
# Under MPS (sglfix.execution.mps) the workers share one context on the device and run side by
# side, so the host's cores bound them rather than the GPU: on one H200 with 16 cores the full
# matrix took 8.2-9.2 s of cells with eight workers, 7.1-7.8 s with ten and 6.9-7.2 s with
# twelve, the GPU's peak 25-27, 32 and 36 GB (bench/results/workspace-h200.json; before the
# FlashInfer workspace was shared, eight held 67-80 GB and more than eight ran out of memory on
# an H100). So three quarters of the cores, at 5 GiB a worker, at most 12.
_GPU_GIB_PER_WORKER_MPS = 5
_MAX_GPU_WORKERS_MPS = 12


# On several GPUs the workers' fixed costs (boot, CUDA context, each kernel's first load) contend
# across the whole machine, not per GPU: on four H100s with 64 cores, 16 workers ran the full
# matrix in 10.9 s of cells and 24 (six a GPU, as one GPU runs best) in 13.3 s, 8 in 13.2 s
# (bench/results/scale-out-h100x4.json); under MPS on four H200s, 16 took 8.51 s, 24 8.54 s and
# 32 9.79 s (bench/results/scale-out-h200x4.json). So the total is held to a quarter of the cores.
_CORES_PER_WORKER_ACROSS_GPUS = 4


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _gpu_bounds(*, mps: bool) -> tuple[int, int]:
    """The cores the workers of every GPU share, and the most workers one GPU holds: its memory
    at what one worker keeps, at most 8 (12 under ``mps``); 2 when its memory is unknown."""
    share = 3 * _cores() // 4 if mps else _cores() // 2
    try:
        mib = min(int(line) for line in query_gpus("memory.total") or ())
    except ValueError:  # memory unknown: the two that fit any GPU sglfix runs on
        return share, 2
    per_worker = _GPU_GIB_PER_WORKER_MPS if mps else _GPU_GIB_PER_WORKER
    most = _MAX_GPU_WORKERS_MPS if mps else _MAX_GPU_WORKERS
    return share, max(1, min(mib // (per_worker * 1024), most))


def default_gpu_workers(gpus: int = 1, *, mps: bool = False, bounds: tuple[int, int] | None = None) -> int:
    """Workers sharing each GPU when --jobs is not given. A cell is host-bound (Python, kernel
    launches, metadata building), so several workers keep one GPU busy: half the cores this
    process may use (the rest serve the parent and the kernel compilers; three quarters under
    ``mps``, where the workers run side by side), shared among the ``gpus`` in use, no more than
    a GPU's memory holds at what one worker keeps, and at most 8 (12 under ``mps``). ``bounds``:
    ``_gpu_bounds`` already read (its GPU query is a subprocess)."""
    share, most = bounds if bounds is not None else _gpu_bounds(mps=mps)
    return min(max(1, share // max(1, gpus)), most)


def query_gpus(*fields: str) -> list[str] | None:
    """``nvidia-smi --query-gpu=FIELDS``, a line per GPU (no CUDA context: the parent never
    starts one); None when it cannot be asked."""
    import subprocess

    try:
        probe = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in probe.stdout.splitlines() if line.strip()]


def max_jobs() -> int:
    """The most worker processes sglfix starts here: 4 per core this process may use, and no more
    than one per GiB of the machine's memory (a worker holds torch and the code base; past that
    the machine swaps instead of running cells)."""
    cores = _cores()
    try:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    except (ValueError, OSError, AttributeError):
        gib = 4 * cores
    return max(1, min(4 * cores, gib))


def check_jobs(jobs: int | None, device: str, *, gpus: int | None = None, mps: bool = False) -> int:
    """How many workers a run starts. With ``gpus`` (the GPUs of --devices) the workers are dealt
    over them in turn: by default each GPU gets as many as one GPU would, up to a quarter of the
    cores in all (at least one a GPU); ``--jobs N`` is the total, at least one per GPU."""
    if jobs is None:
        if gpus == 1:
            return default_gpu_workers(mps=mps)
        if gpus:
            bounds = _gpu_bounds(mps=mps)
            spread = min(default_gpu_workers(gpus, bounds=bounds) * gpus, _cores() // _CORES_PER_WORKER_ACROSS_GPUS)
            # Never fewer than one GPU alone would get: a second GPU only adds room.
            return max(gpus, spread, default_gpu_workers(bounds=bounds))
        if uses_cuda(device):
            return default_gpu_workers(mps=mps)
        return max(1, min(2, os.cpu_count() or 1))
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be at least 1")
    if gpus and jobs < gpus:
        raise ConfigError(
            f"--jobs {jobs} is fewer workers than the {gpus} GPUs of --devices (the total, dealt over them); "
            f"give --jobs {gpus} or more, or list fewer GPUs"
        )
    ceiling = max_jobs()
    if jobs > ceiling:
        raise ConfigError(
            f"--jobs {jobs} is more workers than this machine can run at once (at most {ceiling}: 4 per core, "
            f"one per GiB of memory); give --jobs {ceiling} or fewer"
        )
    return jobs


def deal_devices(devices: Sequence[str], jobs: int) -> list[str]:
    """The GPU of each of ``jobs`` workers: the listed GPUs in turn, so that a run that starts
    fewer workers (a small plan) still spreads them over every GPU."""
    return [devices[i % len(devices)] for i in range(jobs)]


def parse_devices(text: str) -> list[str]:
    """``cuda:0,cuda:1`` / ``0,1`` / ``all`` -> CUDA device indices, checked (exit 2 if bad)."""
    value = text.strip()
    if value == "all":
        count = _cuda_device_count()
        if count < 1:
            raise ConfigError("--devices all: no CUDA device here; run on a GPU machine or use --jobs N on CPU")
        return [str(i) for i in range(count)]
    out: list[str] = []
    for item in value.split(","):
        item = item.strip()
        index = item[len("cuda:") :] if item.startswith("cuda:") else item
        # ASCII digits only: str.isdigit() also takes superscripts ("²"), which int() refuses.
        if not (index.isascii() and index.isdigit()) or len(index) > 4:
            raise ConfigError(f"--devices {text!r}: {item!r} is not a CUDA device; give cuda:0,cuda:1 (or 0,1) or all")
        if index in out:
            raise ConfigError(f"--devices {text!r}: cuda:{index} is listed twice")
        out.append(str(int(index)))
    return out


def _cuda_device_count() -> int:
    """How many GPUs a worker would see. The driver lists them (nvidia-smi) where nothing narrows
    the view; with CUDA_VISIBLE_DEVICES set (indices, UUIDs, MIG slices) a fresh interpreter asks
    CUDA (this process never imports torch)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        listed = query_gpus("index")
        if listed:
            return len(listed)
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        return int(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ConfigError(
            f"--devices all: could not count the GPUs ({(probe.stderr or probe.stdout).strip()[-200:]})"
        ) from None


MEMORY_ENV = envs.SGLFIX_WORKER_MEMORY_GB.name  # a CPU worker's address-space cap; 0 or off: none
_MIN_CAP = 4 << 30  # a worker of real sglang peaks near 1.2 GiB of address space


def memory_cap() -> int | None:
    """Bytes of address space a CPU worker may hold: ``SGLFIX_WORKER_MEMORY_GB``, else 80 % of
    the machine's memory shared by as many workers as it has cores (at least 4 GiB); None for
    no cap."""
    raw = (envs.SGLFIX_WORKER_MEMORY_GB.get() or "").strip().lower()
    if raw in ("0", "off", "no", "none"):
        return None
    if raw:
        try:
            return int(float(raw) * (1 << 30)) or None
        except ValueError:
            return None
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return max(_MIN_CAP, int(total * 0.8) // max(1, os.cpu_count() or 1))
