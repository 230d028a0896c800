"""What the judge attaches to a real sglang backend: guard zones of sentinel bytes after its static
buffers (read back by ``sglfix.harness.guards``) and a hook on its metadata inits, so that the
invariants see every init: eager, capture and replay."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglfix.harness.adapters.base import MetadataHook

__all__ = ["PERSISTENT", "GuardedBuffer", "around", "guard_buffers", "guard_verify_mask", "guarded", "watch_metadata"]


@dataclass
class GuardedBuffer:
    """A static buffer carved out of a larger flat allocation whose tail is the sentinel
    (``sglfix.harness.guards`` reads ``name``, ``flat``, ``numel``, ``shape``)."""

    name: str
    flat: Any
    numel: int
    shape: tuple


def _guarded_copy(t: Any, *, name: str) -> tuple[Any, GuardedBuffer]:
    """An identical tensor followed by a guard zone of sentinel bytes, and its registry entry."""
    import torch

    from sglfix.harness.guards import SENTINEL_BYTE

    guard = max(64, t.numel() // 4)
    flat = torch.empty(t.numel() + guard, dtype=t.dtype, device=t.device)
    flat[t.numel() :].view(torch.uint8).fill_(SENTINEL_BYTE)
    view = flat[: t.numel()].view(t.shape)
    view.copy_(t)
    return view, GuardedBuffer(name=name, flat=flat, numel=t.numel(), shape=tuple(t.shape))


# The backend's buffers whose contents persist between metadata inits (indptrs sized for the
# request pool; the CUDA-graph state is the kit's GRAPH_STATE), guarded before anything points into them.
PERSISTENT = ("kv_indptr", "qo_indptr", "mask_indptr", "window_kv_indptr")


def _registry(backend: Any) -> list:
    return backend.__dict__.setdefault("_sglfix_guarded", [])


def guarded(backend: Any) -> list:
    """The guard zones registered on ``backend``, in the order they were made."""
    return list(backend.__dict__.get("_sglfix_guarded", []))


def guard_buffers(backend: Any, attrs: tuple[str, ...]) -> None:
    """Swap each of the backend's contiguous tensors ``attrs`` for a guarded copy; a list of
    tensors (one per wrapper) element by element, in place, so that whoever holds the list
    (FlashInfer's indices updaters) sees the guarded copies."""
    import torch

    for attr in attrs:
        t = getattr(backend, attr, None)
        if isinstance(t, torch.Tensor) and t.is_contiguous():
            view, entry = _guarded_copy(t, name=attr)
            setattr(backend, attr, view)
            _registry(backend).append(entry)
        elif isinstance(t, list):
            for i, item in enumerate(t):
                if isinstance(item, torch.Tensor) and item.is_contiguous():
                    t[i], entry = _guarded_copy(item, name=f"{attr}[{i}]")
                    _registry(backend).append(entry)


def guard_verify_mask(backend: Any) -> None:
    """The verify mask buffer (a frozen struct: swapped whole, as sglang resizes it)."""
    import msgspec

    mask = getattr(backend, "_verify_mask", None)
    if mask is None:
        return
    view, entry = _guarded_copy(mask.buffer, name="_verify_mask.buffer")
    backend._verify_mask = msgspec.structs.replace(mask, buffer=view)
    _registry(backend).append(entry)


def watch_metadata(backend: Any, on_metadata: MetadataHook) -> None:
    """Wrap this backend instance's metadata inits so that the judge sees every one of them:
    eager (``init_forward_metadata``), capture and replay (``init_forward_metadata_out_graph``)."""

    def judge(forward_batch: Any, phase: str) -> None:
        later = getattr(backend, "_sglfix_judge_later", None)
        if later is not None:
            # An init the worker completes with its post-join fix-up (``init_then_join``): the
            # judge looks once that has run.
            later.append(lambda: on_metadata(backend, forward_batch, phase))
        else:
            on_metadata(backend, forward_batch, phase)

    around(backend, "init_forward_metadata", after=lambda forward_batch: judge(forward_batch, "eager"))
    around(
        backend,
        "init_forward_metadata_out_graph",
        after=lambda forward_batch, in_capture=False: judge(forward_batch, "capture" if in_capture else "replay"),
    )
    # A breakable prefill graph's captured tables: built at capture, refreshed at every replay.
    around(
        backend,
        "init_forward_metadata_for_breakable_cuda_graph_capture",
        after=lambda forward_batch: judge(forward_batch, "capture"),
    )
    around(
        backend,
        "prepare_forward_metadata_for_breakable_cuda_graph_replay",
        after=lambda capture_metadata, forward_batch, **_: judge(forward_batch, "replay"),
    )


def around(
    backend: Any, name: str, *, before: Callable[..., None] | None = None, after: Callable[..., None] | None = None
) -> None:
    """Wrap this backend instance's method ``name`` (where it has one): ``before`` is called with the
    call's arguments ahead of it, ``after`` with them once it returned."""
    method = getattr(backend, name, None)
    if method is None:
        return

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args, **kwargs)
        result = method(*args, **kwargs)
        if after is not None:
            after(*args, **kwargs)
        return result

    setattr(backend, name, wrapped)
