"""What a cell built, as digests: the metadata every init produced and the output the kernels
wrote. ``sglfix mutate`` asks for it to tell a mutant that changed nothing the backend built
(suspected equivalent, with this as its evidence) from one whose change no check could see
(a survivor). Off unless a run asks: on a GPU every metadata tensor read is a copy to the host.

A metadata view is digested field by field (tensors by dtype, shape and bytes; numbers, strings
and lists of them by value; other objects by type name only: a kernel wrapper's identity says
nothing of what was built), in field-name order, after each init the adapter reports. Poisoned
allocations (``sglfix.harness.poison``) hold a fixed pattern, so memory nothing wrote digests the
same in every run.

A probe (``sglfix.harness.probes``) builds no metadata view; it hands what the code under test
built or returned to ``observe``, which digests it as an object graph (tensors, numbers, strings,
containers and the attributes of plain objects, to a bounded depth), so that a probe cell too can
show that a mutant built nothing different."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Fingerprint", "active", "fingerprinting", "observe", "observe_view"]

_active: list[Fingerprint] = []


class Fingerprint:
    def __init__(self) -> None:
        # What was digested, in order: (field name or None, digest of its part). A field the
        # cell's kernels turn out never to read (``unread``, known only after the forward) is
        # left out when the digest is made.
        self._parts: list[tuple[str | None, bytes]] = []
        self.output: str | None = None
        self.views = 0
        self.unread: dict[str, str] = {}
        # Fields declared to choose only how the kernels split the work (``MetadataFields.schedule``).
        self.schedule: set[str] = set()

    def _add(self, field: str | None, data: bytes) -> None:
        self._parts.append((field, hashlib.sha256(data).digest()))

    def add_views(self, views: list[tuple[str, Any, int]], *, reads: Any = None) -> None:
        """Digest each view field by field. With ``reads`` (the adapter's ``MetadataFields``), the
        fields whose read extent it declares are digested as far as the kernels read them: an
        indptr's first ``rows + 1`` entries, a per-row length's first ``rows``, an indices array up
        to where its indptr's rows end, a scratch buffer (``scratch``: the kernels write it
        before they read it) by its dtype, rank and row width only. What lies past (a buffer's
        slack, a slice one entry longer) is never read, so a change there builds nothing
        different."""
        import torch

        from sglfix.harness.hostcopy import to_host

        for phase, metadata, rows in views:
            if metadata is None:
                continue
            self.views += 1
            fields = _fields(metadata)
            self.schedule.update(getattr(reads, "schedule", ()) or ())
            scratch = set(getattr(reads, "scratch", ()) or ())
            offsets = set(getattr(reads, "offsets", ()) or ())
            tensors = [(name, v) for name, v in fields if isinstance(v, torch.Tensor) and name not in scratch]
            host = dict(zip((n for n, _ in tensors), to_host([v for _, v in tensors])))
            if reads is not None:
                host = _read_extent(host, reads, rows)
            self._add(None, f"{phase}|{rows}|".encode())
            for name, value in fields:
                if name in offsets:
                    # Where each row's data lies: what the rows read there is digested as its own field.
                    self._add(name, name.encode() + b"=offsets")
                    continue
                if name in scratch and isinstance(value, torch.Tensor):
                    # Contents are the kernel's own (written before read); a longer row count,
                    # more heads or splits than a launch uses is slack. The row width is kept:
                    # a kernel may derive a dimension from it.
                    data = f"scratch {value.dtype} rank {value.dim()} width {value.shape[-1] if value.dim() else 0}"
                    self._add(name, name.encode() + b"=" + data.encode())
                    continue
                self._add(name, name.encode() + b"=" + _bytes(host.get(name, value)))

    def add_object(self, label: str, obj: Any, *, unread: frozenset[int] = frozenset()) -> None:
        """Digest ``obj`` as an object graph (``_walk``), named by ``label`` among the fields;
        a tensor on a storage in ``unread`` (data pointers) by its dtype alone."""
        self.views += 1
        h = hashlib.sha256()
        h.update(f"{label}|".encode())
        _walk(obj, h, depth=_DEPTH, seen=set(), unread=unread)
        self._parts.append((f"{_OBJECT}{label}", h.digest()))

    def mark_unread(self, fields: dict[str, str]) -> None:
        """Fields of the views that no kernel of this cell read (field -> why): left out of the
        digest, and named beside it."""
        self.unread.update(fields)

    def add_output(self, out: Any) -> None:
        self.output = hashlib.sha256(_bytes(out)).hexdigest()[:16]

    def fields(self) -> dict[str, str]:
        """A short digest per field (its parts over every view, in order), less the unread ones:
        where two cells' metadata digests differ, the fields that differ say what was built
        differently (a survivor's lead, ``sglfix.report.mutation``)."""
        per: dict[str, Any] = {}
        for field, part in self._parts:
            if field is not None and field not in self.unread:
                per.setdefault(field, hashlib.sha256()).update(part)
        return {name: h.hexdigest()[:8] for name, h in sorted(per.items())}

    @property
    def metadata(self) -> Any:
        """The digest of every part digested, less the fields declared unread."""
        h = hashlib.sha256()
        for field, part in self._parts:
            if field is None or field not in self.unread:
                h.update(part)
        return h

    def to_json(self) -> dict:
        # A cell that built nothing (it failed first, or a probe) digests nothing: None, never the
        # digest of nothing, which would read as "the same metadata".
        metadata = self.metadata.hexdigest()[:16] if self.views else None
        out = {"metadata": metadata, "output": self.output, "views": self.views}
        if self.views:
            out["fields"] = self.fields()
            if self.schedule:
                out["schedule"] = sorted(self.schedule)
        if self.unread:
            out["unread"] = dict(sorted(self.unread.items()))
        return out


def _read_extent(host: dict[str, Any], reads: Any, rows: int) -> dict[str, Any]:
    """``host`` (field -> host tensor) with each field ``reads`` declares cut to what is read."""
    out = dict(host)
    for name in reads.indptr:
        t = out.get(name)
        if t is not None and t.dim() == 1:
            out[name] = t[: rows + 1]
    for name in reads.lengths:
        t = out.get(name)
        if t is not None and t.dim() == 1:
            out[name] = t[:rows]
    for name, indptr_name in {**reads.indices, **getattr(reads, "read_to", {})}.items():
        t, indptr = out.get(name), out.get(indptr_name)
        if t is None or indptr is None or t.dim() != 1 or indptr.dim() != 1 or not indptr.numel():
            continue
        # Rows read [indptr[b], indptr[b + 1]); up to the buffer's end when the indptr points past
        # it (the invariants name that), never further. (The indptr is already cut to its rows.)
        out[name] = t[: max(0, min(int(indptr.max()), t.numel()))]
    return out


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
        head = f"{t.dtype}{tuple(t.shape)}".encode()
        # Flat first: a 0-d tensor has no last dimension to view as bytes. One element counts as
        # contiguous whatever its stride (a column of a [n, 2] tensor at n = 1), and view() refuses
        # a stride other than 1: it is given one.
        t = t.contiguous().reshape(-1)
        if t.numel() == 1:
            t = t.as_strided((1,), (1,))
        return head + (t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value).encode()
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str, type(None))) for v in value):
        return repr(list(value)).encode()
    return f"<{type(value).__name__}>".encode()


# A probe's observed object among the fields: its label behind this mark (no metadata field has it).
_OBJECT = "observed:"

# How deep ``observe`` follows attributes: a backend -> its metadata -> a wrapper -> its plan arrays.
_DEPTH = 4
_MAX_ITEMS = 256
_MAX_BYTES = 4 << 20
# What a backend points back to that is not what it built: the runner (its model, server args and
# pools) and the KV caches (data, gigabytes in a real pool).
_NOT_FOLLOWED = ("ModelRunner", "KVPool", "KVCache", "TokenToKV")


def _walk(value: Any, h: Any, *, depth: int, seen: set[int], unread: frozenset[int] = frozenset()) -> None:
    """Feed ``value`` to ``h``: tensors, scalars and lists of them as ``_bytes`` does; containers
    item by item; other objects field by field (``_fields``, private attributes included: a
    wrapper keeps its plan there) while ``depth`` lasts, each object once (by identity). Modules,
    functions, classes and the runner's torch modules are named, not followed."""
    import inspect
    import types

    import torch

    if isinstance(value, torch.Tensor):
        if unread and value.untyped_storage().data_ptr() in unread:
            # A buffer the code under test declares no kernel reads: its size and contents are
            # slack, whatever a view of it shows.
            h.update(f"unread {value.dtype}".encode())
            return
        if value.dtype == torch.uint64 or value.numel() * value.element_size() > _MAX_BYTES:
            # Pointers (a pool's data_ptrs differ in every process) and bulk data (a KV cache):
            # their shape, not their bytes.
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        else:
            h.update(_bytes(value))
        return
    if value is None or isinstance(value, (bool, int, float, str)):
        h.update(_bytes(value))
        return
    if isinstance(value, (torch.device, torch.dtype)):
        h.update(repr(value).encode())
        return
    if isinstance(value, (types.ModuleType, type, torch.nn.Module)) or inspect.isroutine(value):
        h.update(f"<{type(value).__name__}>".encode())
        return
    if id(value) in seen or depth <= 0 or any(part in type(value).__name__ for part in _NOT_FOLLOWED):
        h.update(f"<{type(value).__name__}>".encode())
        return
    seen.add(id(value))
    if isinstance(value, dict):
        items = sorted(((str(k), v) for k, v in value.items()), key=lambda kv: kv[0])[:_MAX_ITEMS]
        for k, v in items:
            h.update(k.encode() + b":")
            _walk(v, h, depth=depth - 1, seen=seen, unread=unread)
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = (
            list(value)[:_MAX_ITEMS]
            if not isinstance(value, (set, frozenset))
            else sorted(value, key=repr)[:_MAX_ITEMS]
        )
        h.update(f"[{len(value)}".encode())
        for v in seq:
            _walk(v, h, depth=depth - 1, seen=seen, unread=unread)
        return
    h.update(f"<{type(value).__name__}>".encode())
    for name, field in _fields(value):
        if inspect.isroutine(field):
            continue
        h.update(name.encode() + b"=")
        _walk(field, h, depth=depth - 1, seen=seen, unread=unread)


def observe(label: str, *objects: Any, unread: Any = ()) -> None:
    """For a probe: digest what the code under test built or returned (``objects``) into the
    running cell's fingerprint, when ``sglfix mutate`` asked for one (otherwise nothing).
    ``unread``: tensors the code under test declares no kernel reads (a verify mask built with
    ``is_read=False``); any view of their storage is digested by its dtype alone."""
    fp = active()
    if fp is None:
        return
    from sglfix.harness.syncwatch import suspended

    with suspended():
        skip = frozenset(t.untyped_storage().data_ptr() for t in unread if t is not None and t.numel())
        for i, obj in enumerate(objects):
            if isinstance(obj, dict):
                # Item by item: a survivor's lead then names the attribute it built otherwise.
                for key, value in sorted(obj.items(), key=lambda kv: str(kv[0])):
                    fp.add_object(f"{label}#{i}.{key}", value, unread=skip)
            else:
                fp.add_object(f"{label}#{i}", obj, unread=skip)


def observe_view(label: str, metadata: Any, *, rows: int, reads: Any) -> None:
    """For a probe that drives a backend's metadata init: digest the metadata as a backend cell's
    view (``Fingerprint.add_views``: as far as the kernels read it, per the adapter's
    ``MetadataFields``), when a fingerprint is asked for."""
    fp = active()
    if fp is None:
        return
    from sglfix.harness.syncwatch import suspended

    with suspended():
        fp.add_views([(label, metadata, rows)], reads=reads)


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
