"""Overlap-scheduler glue: whether the CPU mirrors of seq_lens are published, and publishing them.

``decide_needs_cpu_seq_lens`` is an OR over the spec-v2 attention backends' ``needs_cpu_seq_lens``
flags: publishing ``seq_lens_cpu``/``seq_lens_sum`` costs a device->host sync per step.
"""

from __future__ import annotations

from typing import Any, Sequence

from sglfix.backends.srt.managers.schedule_batch import ScheduleBatch


def decide_needs_cpu_seq_lens(attn_backends: Sequence[Any]) -> bool:
    """Whether FutureMap must publish seq_lens_cpu / seq_lens_sum."""
    # PR 26738: skip unset slots (draft_extend_attn_backend is None on some spec
    # configs); a backend that never declared the flag stays on the legacy path.
    return any(getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None)


def resolve_seq_lens_cpu(batch: ScheduleBatch, *, needs_cpu_seq_lens: bool) -> None:
    """Publish the CPU mirrors only when some backend needs them (gpu_only otherwise)."""
    if needs_cpu_seq_lens:
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    else:
        batch.seq_lens_cpu = None
        batch.seq_lens_sum = None
