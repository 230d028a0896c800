"""What a cell built, as digests: the metadata every init produced and the output the kernels
wrote. ``sglfix mutate`` asks for it to tell a mutant that changed nothing the backend built
(suspected equivalent, with this as its evidence) from one whose change no check could see
(a survivor). Off unless a run asks: on a GPU every metadata tensor read is a copy to the host.

A metadata view is digested field by field (tensors by dtype, shape and bytes; numbers, strings
and lists of them by value; other objects by type name only: a kernel wrapper's identity says
nothing of what was built), in field-name order, after each init the adapter reports. Poisoned
allocations (``sglfix.harness.poison``) hold a fixed pattern, so memory nothing wrote digests the
same in every run."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Fingerprint", "active", "fingerprinting"]

_active: list[Fingerprint] = []


class Fingerprint:
    def __init__(self) -> None:
        self.metadata = hashlib.sha256()
        self.output: str | None = None
        self.views = 0

    def add_views(self, views: list[tuple[str, Any, int]]) -> None:
        import torch

        from sglfix.harness.hostcopy import to_host

        for phase, metadata, rows in views:
            if metadata is None:
                continue
            self.views += 1
            fields = _fields(metadata)
            tensors = [(name, v) for name, v in fields if isinstance(v, torch.Tensor)]
            host = dict(zip((n for n, _ in tensors), to_host([v for _, v in tensors])))
            self.metadata.update(f"{phase}|{rows}|".encode())
            for name, value in fields:
                self.metadata.update(name.encode() + b"=")
                self.metadata.update(_bytes(host.get(name, value)))

    def add_output(self, out: Any) -> None:
        self.output = hashlib.sha256(_bytes(out)).hexdigest()[:16]

    def to_json(self) -> dict:
        # A cell that built nothing (it failed first, or a probe) digests nothing: None, never the
        # digest of nothing, which would read as "the same metadata".
        metadata = self.metadata.hexdigest()[:16] if self.views else None
        return {"metadata": metadata, "output": self.output, "views": self.views}


def _fields(metadata: Any) -> list[tuple[str, Any]]:
    import dataclasses

    if dataclasses.is_dataclass(metadata) and not isinstance(metadata, type):
        items = [(f.name, getattr(metadata, f.name, None)) for f in dataclasses.fields(metadata)]
    elif hasattr(metadata, "__dict__"):
        items = list(vars(metadata).items())
    else:
        items = [(n, getattr(metadata, n, None)) for n in getattr(type(metadata), "__slots__", ())]
    return sorted(((str(n), v) for n, v in items if not str(n).startswith("__")), key=lambda kv: kv[0])


def _bytes(value: Any) -> bytes:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        head = f"{t.dtype}{tuple(t.shape)}".encode()
        return head + (t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value).encode()
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str, type(None))) for v in value):
        return repr(list(value)).encode()
    return f"<{type(value).__name__}>".encode()


def active() -> Fingerprint | None:
    return _active[-1] if _active else None


@contextmanager
def fingerprinting() -> Iterator[Fingerprint]:
    fp = Fingerprint()
    _active.append(fp)
    try:
        yield fp
    finally:
        _active.pop()
