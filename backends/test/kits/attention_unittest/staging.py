"""Host-built case inputs sent to the device without waiting for it.

A builder draws its random values and lays out its indices on the host. Copied the plain way, each
host tensor is a wait for the device: torch copies from pageable memory synchronously, and while
several workers share one GPU every wait also waits for the others' work
(``bench/results/contention-h100.json``, ``bench/results/syncs-after-h100.json``: the builders were
the largest share of a cell's waits). Here a host tensor goes to a CUDA device through pinned
memory as a non-blocking copy on the current stream, so the kernels queued after it see its values
and the host does not wait. Pinned staging memory is held by torch's caching host allocator until
the copy is done, so the host tensor may be reused at once. On the CPU every call is the plain one.
Random draws are remembered by generator state (``draws.randn``): the same
scenario under the next toggle set draws the same values.
"""

from __future__ import annotations

from typing import Any

import torch

from sglfix.backends.test.kits.attention_unittest.draws import randn

__all__ = ["fill_", "fill_random_", "mirror", "randn", "tensor", "to_device"]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``; on a CUDA device queued without a wait."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def tensor(data: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype, device=device)`` without a wait."""
    return to_device(torch.tensor(data, dtype=dtype), device)


def fill_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for a host ``src``; into a CUDA ``dst`` without a wait."""
    if dst.device.type != "cuda":
        return dst.copy_(src)
    return dst.copy_(src.pin_memory(), non_blocking=True)


def fill_random_(buffers: Any, *, generator: torch.Generator, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each buffer filled, in order, with standard normal values drawn on the host (float32 from
    ``generator``, then ``dtype``); the host copies returned, for a ground truth laid out on the
    host."""
    host = []
    for buf in buffers:
        host.append(randn(buf.shape, generator=generator, dtype=dtype))
        fill_(buf, host[-1])
    return host


def mirror(t: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """The host mirror of ``t`` (``t.cpu()``), given ``host``, the same values already on the host:
    a CUDA tensor's mirror is ``host``, read without a wait; a CPU tensor's is ``t`` itself, as
    ``t.cpu()`` returns it."""
    if t.device.type != "cuda":
        return t.cpu()
    return host
