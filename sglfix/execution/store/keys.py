"""The key a stored result is filed under: everything that can change a cell's verdict except what
its worker's process ran and imported (which each entry lists with digests of its own,
``sglfix.execution.store``).

* the machine: Python and its build, the platform, the device and, for a GPU, its model and
  driver (the packages a worker imports are each entry's, by their installed files);
* the environment variables the engine, the kernels, the interpreter (``PYTHONOPTIMIZE``,
  ``PYTHONHASHSEED``, ...) and the math libraries read;
* sglfix's judge: every source file of sglfix that a worker runs (the commands and the report
  writers only run in the parent, on results; the reproduction's files are its entries');
* the profile's records;
* the cell: its scenario as the worker receives it (but the path of its file), and each part its
  toggle set reverts as it is chosen at this version (patches, targets, variant), or the
  candidate fix's digest.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from sglfix.common.environ import envs

__all__ = ["cell_key", "context_key", "device_facts", "judge_digest"]

FORMAT = 2  # bump when an entry's meaning changes: every older entry then misses

# Read by the engine, the kernels or sglfix's workers: a change may change a verdict.
_ENV_PREFIXES = (
    "SGLANG_",
    "SGLFIX_",
    "TRITON_",
    "FLASHINFER_",
    "TORCH_",
    "PYTORCH_",
    "CUDA_",
    "NVIDIA_",
    "CUBLAS",
    "PYTHON",  # the workers' interpreter flags: PYTHONOPTIMIZE strips asserts, PYTHONHASHSEED orders sets
    "OMP_",
    "MKL_",
    "KMP_",
)
# ... except where a cache lives, which device a worker is given, how many workers there are, and
# what the cell's own toggle set already says (the revert variable, the candidate fixes).
_ENV_IGNORED = {
    envs.REVERT_PR.name,
    envs.SGLFIX_JOBS.name,
    envs.SGLFIX_APPLY.name,
    envs.SGLFIX_CACHE.name,
    envs.SGLFIX_CACHE_DIR.name,
    envs.SGLFIX_STORE.name,
    "TRITON_CACHE_DIR",
    "TRITON_HOME",
    "FLASHINFER_WORKSPACE_BASE",
    "FLASHINFER_JIT_DIR",
    "CUDA_VISIBLE_DEVICES",
    "TORCHINDUCTOR_CACHE_DIR",
    # Where code is found (what is imported is each entry's, by digest) and how output is written.
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUNBUFFERED",
    "PYTHONFAULTHANDLER",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONPYCACHEPREFIX",
    "PYTHONIOENCODING",
    "PYTHONBREAKPOINT",
}
# Parent-only parts of sglfix: they read results, never make them.
_PARENT_ONLY = ("cli", "report")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def judge_digest(*, code_base: str | None = None) -> str:
    """sglfix's own code that runs in a worker, by content (where it is installed does not
    matter); ``code_base``: the folder of the code under test where it lies inside sglfix (the
    reproduction of a wheel), whose files the entries key function by function."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # sglfix/
    h = hashlib.sha256()
    inside = os.path.abspath(code_base) + os.sep if code_base else None
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, root)
        if rel.split(os.sep)[0] in _PARENT_ONLY or (inside and os.path.abspath(path).startswith(inside)):
            continue
        h.update(rel.encode() + b"\0")
        with open(path, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def _gpu_models() -> list[str]:
    """Each GPU's model and the driver, from the driver's files (no CUDA context: the parent
    never starts one); ``nvidia-smi`` where those are not readable."""
    found = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info, encoding="utf-8", errors="replace") as fh:
                found += [line.split(":", 1)[1].strip() for line in fh if line.startswith("Model:")]
        except OSError:
            continue
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as fh:
            found.append(fh.readline().strip())
    except OSError:
        pass
    if found:
        return found
    from sglfix.execution.devices import query_gpus

    return sorted(query_gpus("name", "driver_version") or ()) or ["unknown"]


def device_facts(device: str) -> dict:
    facts: dict[str, Any] = {"device": device, "machine": platform.machine()}
    if device == "cuda":
        facts["gpus"] = _gpu_models()
    return facts


def context_key(*, device: str, codebase: Any, profile: Any, root: str | None = None) -> tuple[str, dict]:
    """The run-wide part of every key, and what it is made of (kept beside the entries);
    ``root``: the code base's package folder."""
    import dataclasses

    # The profile's records as read (where its folder is does not matter).
    records = {k: v for k, v in dataclasses.asdict(profile).items() if k != "folder"}
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) and k not in _ENV_IGNORED}
    parts = {
        "format": FORMAT,
        "python": sys.version,
        "implementation": sys.implementation.name,
        "executable_abi": [sys.abiflags if hasattr(sys, "abiflags") else "", sys.maxsize, sys.byteorder],
        **device_facts(device),
        "env": env,
        "judge": judge_digest(code_base=root if codebase.is_reproduction else None),
        "codebase": [codebase.name, codebase.package],
        "profile": records,
    }
    return _digest(parts), parts


def cell_key(context: str, *, scenario: Any, toggles: Sequence[str], registry: Any) -> str:
    """One cell's key: ``context`` with its scenario and what its toggle set changes, part by part."""
    from sglfix.toggling.candidate import split_ids

    fixes, reverts = split_ids(list(toggles))
    changed: list[Any] = []
    for fid in fixes:
        fix = registry.candidates.get(fid)
        # What it changes, not its file's bytes: the same change written at other line numbers
        # (a mutant after an edit above it in the file) is the same cell.
        part = getattr(fix, "part", None)
        changed.append(["fix", fid, repr(part) if part is not None else getattr(fix, "sha256", None)])
    for rid in reverts:
        changed.append(["revert", rid, [repr(sel.part) for sel in registry.select(rid)]])
    # The scenario as it reads, not where its file is (a store is shared between checkouts).
    shown = {k: v for k, v in scenario.to_json().items() if k != "path"}
    return _digest([context, shown, changed])
