"""Backend adapters: one per ``backend:`` name, the seam between a scenario and a backend family.

An adapter builds the case and its ground truth, makes the backend, runs the mode eagerly or
through the CUDA-graph runner (one forward, or several steps for a multi-step draft), names its
metadata fields for the invariant table, lists its static buffers for the guard check and gives
the reference. Adapters import torch and the backends, so they are loaded only in workers.
"""

from __future__ import annotations

import importlib

from sglfix.codebases import REPRODUCTION, CodeBase, active
from sglfix.common.errors import ConfigError

__all__ = ["ADAPTER_MODULES", "get_adapter"]

# backend name -> module defining ``ADAPTER`` for the reproduction (imported on first use);
# each code base has its own table (``sglfix.codebases``).
ADAPTER_MODULES: dict[str, str] = REPRODUCTION.adapters


def get_adapter(name: str, codebase: CodeBase | None = None):
    """The adapter that runs backend ``name`` on ``codebase`` (default: this process's)."""
    cb = codebase or active()
    module = cb.adapters.get(name)
    if module is None:
        raise ConfigError(f"no adapter for backend {name!r} on {cb.name}; known: {', '.join(sorted(cb.adapters))}")
    return importlib.import_module(module).ADAPTER
