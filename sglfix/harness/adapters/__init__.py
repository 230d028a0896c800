"""Backend adapters: one per ``backend:`` name, the seam between a scenario and a backend family.

An adapter builds the case and its ground truth, makes the backend, runs the mode eagerly or
through the CUDA-graph runner (one forward, or several steps for a multi-step draft), names its
metadata fields for the invariant table, lists its static buffers for the guard check and gives
the reference. Adapters import torch and the backends, so they are loaded only in workers.
"""

from __future__ import annotations

import importlib

from sglfix.common.errors import ConfigError

__all__ = ["ADAPTER_MODULES", "get_adapter"]

# backend name -> module defining ``ADAPTER`` (imported on first use)
ADAPTER_MODULES: dict[str, str] = {
    "triton": "sglfix.harness.adapters.triton",
    "flashinfer": "sglfix.harness.adapters.flashinfer",
    "flashinfer_mla": "sglfix.harness.adapters.flashinfer_mla",
    "trtllm_mla": "sglfix.harness.adapters.trtllm_mla",
    "deepseek_v4": "sglfix.harness.adapters.deepseek_v4",
}


def get_adapter(name: str):
    module = ADAPTER_MODULES.get(name)
    if module is None:
        raise ConfigError(f"no adapter for backend {name!r}; known: {', '.join(sorted(ADAPTER_MODULES))}")
    return importlib.import_module(module).ADAPTER
