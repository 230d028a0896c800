"""Guard-zone checks: did any write land past the end of a static buffer?

The backends carve each static buffer out of a larger flat allocation and fill the tail with a
sentinel byte (``cuda_graph_buffer_registry.alloc_static``). This check lives in the judge, not
in the patchable backends, and recomputes the sentinel itself: a revert cannot silence it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SENTINEL_BYTE", "check_guards", "describe_guards", "guard_zones"]

SENTINEL_BYTE = 0x5A


def _guard_bytes(entry: Any):
    import torch

    guard = entry.flat[entry.numel :]
    return guard.contiguous().view(torch.uint8)


def guard_zones(registry: Sequence[Any]) -> list[Any]:
    """The registry's guard zones as bytes, still on the device: for a caller that reads them in
    the same wait as other tensors and hands them to ``describe_guards``."""
    return [_guard_bytes(e) for e in registry]


def _overwritten(entry: Any, raw: Any) -> tuple[int, int] | None:
    """(first overwritten element past the end, elements overwritten) or None; ``raw`` is the
    guard zone's bytes on the host."""
    size = entry.flat.element_size()
    bad = (raw != SENTINEL_BYTE).view(-1, size).any(dim=1).nonzero()
    if not bad.numel():
        return None
    return int(bad[0, 0]), int(bad.numel())


def _hits(registry: Sequence[Any], raws: Sequence[Any] | None = None) -> list[tuple[Any, tuple[int, int] | None]]:
    """Every entry with its overwrite, the guard zones read in one wait for the device (or as
    ``raws``, already read: ``guard_zones`` of the same registry)."""
    import torch

    from sglfix.harness.hostcopy import to_host

    entries = list(registry)
    raws = to_host(guard_zones(entries) if raws is None else list(raws))
    # Nearly every cell leaves every zone intact: one comparison over all of them says so, where
    # four small host ops per zone (a dozen zones a cell) cost more than the rest of the judge.
    flat = [raw.reshape(-1) for raw in raws]
    if not flat or not bool((torch.cat(flat) != SENTINEL_BYTE).any()):
        return [(e, None) for e in entries]
    return [(e, _overwritten(e, raw)) for e, raw in zip(entries, raws, strict=True)]


def check_guards(registry: Sequence[Any]) -> list[str]:
    """Names of the registered buffers whose guard zone was overwritten."""
    return [entry.name for entry, hit in _hits(registry) if hit is not None]


def describe_guards(registry: Sequence[Any], raws: Sequence[Any] | None = None) -> list[str]:
    """The overwritten buffers with shape and first overwritten offset, for reports; ``raws``:
    their guard zones already read (``guard_zones``)."""
    out = []
    for entry, hit in _hits(registry, raws):
        if hit is not None:
            first, count = hit
            out.append(
                f"{entry.name}{list(entry.shape)}: {count} guard element(s) overwritten, the first {first} past the end"
            )
    return out
