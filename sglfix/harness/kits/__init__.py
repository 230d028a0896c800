"""What sglfix copies from one sglang version, pinned per profile: ``kit(part)`` is the active code base's.

The kit (``sglang.test.kits.attention_unittest``) ships in the wheel but is private test code that
changes every release; so does the way its graph runners drive a backend. Every use sglfix makes
of the kit, and every emulation of that version's runners, lives in one package per code base
(``Profile.kit`` in the profile's ``profile.toml``), split by who uses it:

- ``attention``: the dense mock runner, forward batches and the DRAFT_EXTEND_V2 / TARGET_VERIFY
  fixtures the Triton adapter drives;
- ``drafts``: the multi-step EAGLE draft families (DeepSeek-V4, FlashInfer GQA and MLA) and the
  TRT-LLM MLA draft extend: mock runners, slot ground truth, guard zones, CUDA-graph emulation;
- ``probes``: the EAGLE draft worker stand-in the probe scenarios run, with its CPU scope;
- ``graphs``: the CUDA-graph runners as the Triton adapter drives one layer through them.

A profile for another sglang version brings its own package (a copy of an existing one, anywhere
importable) and names it in its ``profile.toml``; the adapters and probes ask for ``kit("drafts")``
and never name a version.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["PARTS", "kit"]

PARTS = ("attention", "drafts", "probes", "graphs")


def kit(part: str) -> ModuleType:
    """The active code base's kit module ``part`` (one of ``PARTS``)."""
    from sglfix.codebases import active

    if part not in PARTS:
        raise ValueError(f"no kit part {part!r}; the parts are {', '.join(PARTS)}")
    codebase = active()
    if not codebase.kit:
        raise RuntimeError(
            f"the code base {codebase.name} has no pinned test kit (Profile.kit); its adapters "
            f"cannot use sglang's attention test kit"
        )
    return importlib.import_module(f"{codebase.kit}.{part}")
