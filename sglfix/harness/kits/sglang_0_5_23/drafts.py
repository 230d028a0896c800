"""sglang 0.5.23's attention test kit, for the multi-step EAGLE draft families (DeepSeek-V4, FlashInfer
GQA and MLA) and TRT-LLM MLA draft extend: ``kit("drafts")`` of ``sglfix.harness.kits``.

What comes from the kit: its mock model runners (real ``ModelRunner`` subclasses with real memory
pools, publishing server args through ``sglang.srt.runtime_context``), its DSv4 fixture, and its
``_configure_runner_for_eagle_draft`` (server args of an EAGLE draft worker). The backends are
built the way production builds them (``DraftBackendFactory(...).create_decode_backend()``).
What is sglfix's: the slot layout (scattered, from the scenario's seed), the forward batches, the
recorded step backends on a machine without CUDA, the
guard zones, the CPU placement of the code's ``device="cuda"`` allocations, and every check.

The adapters reach this part by name only (``kit("drafts").X``), so this module is its one face;
the code lives in the kit package's modules split by seam:

- ``environment``: ``prepare()`` and the availability checks;
- ``slots``: the slot ground truth (``DraftSlots``, ``PagedSlots``);
- ``allocations``: the CUDA allocation mode that places and guards the backends' buffers;
- ``host_steps``: the recorded step backends and the MLA topk gate;
- ``draft_batches`` and ``draft_cases``: the multi-step draft's batches and cases;
- ``draft_replay``: the draft CUDA-graph runner's replay (its padding of the batch);
- ``draft_extend``: TRT-LLM MLA's draft extend.

Nothing here imports sglang at module level: call ``prepare()`` first (the code base must be
active, so that sglang's missing CUDA-only packages are stood in for).
"""

from __future__ import annotations

from .allocations import SGLANG_ROOT, CudaAllocations, GuardedBuffer
from .draft_batches import make_capture_batch, make_draft_batch
from .draft_cases import DSV4_PAGE_SIZE, DraftCase, build_draft, build_dsv4_draft
from .draft_extend import build_trtllm_draft_extend, trtllm_capture_batch, trtllm_prefill_case, trtllm_replay_view
from .draft_replay import replay_draft
from .environment import draft_backend_factory, flash_mla_available, flashinfer_available, has_cuda, prepare
from .host_steps import (
    MLA_GATE_NOTE,
    HostStepRecorder,
    host_plan,
    host_step_children,
    lift_mla_topk_gate,
    mla_steps_recorded,
)
from .slots import DraftSlots, PagedSlots

__all__ = [
    "DSV4_PAGE_SIZE",
    "MLA_GATE_NOTE",
    "SGLANG_ROOT",
    "CudaAllocations",
    "DraftCase",
    "DraftSlots",
    "GuardedBuffer",
    "HostStepRecorder",
    "PagedSlots",
    "build_draft",
    "build_dsv4_draft",
    "build_trtllm_draft_extend",
    "draft_backend_factory",
    "flash_mla_available",
    "flashinfer_available",
    "has_cuda",
    "host_plan",
    "host_step_children",
    "lift_mla_topk_gate",
    "make_capture_batch",
    "make_draft_batch",
    "mla_steps_recorded",
    "prepare",
    "replay_draft",
    "trtllm_capture_batch",
    "trtllm_prefill_case",
    "trtllm_replay_view",
]
