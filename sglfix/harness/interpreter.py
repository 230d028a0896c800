"""Make the Triton interpreter (CPU cells) cheaper without changing what any kernel computes.

Two costs dominate an interpreted matrix, and both are repeated work:

* **Re-patching the language.** The interpreter rebinds every builtin of ``triton.language``
  on each launch *and again on every nested ``@jit`` call* (once per program instance per
  helper), walking the modules with ``inspect.getmembers`` each time. Here a launch patches once;
  a nested call inside it patches only language modules the launch has not patched yet. Kernels
  see exactly the bindings they saw before.
* **Identical launches.** Toggles change how metadata is built, rarely what a kernel receives:
  most launches of a matrix repeat an earlier one bit for bit. A launch is a pure function of
  the bytes of every storage its tensor arguments live in (the interpreter reads and writes
  those storages and nothing else of ours), its scalar arguments, its grid and the kernel's code
  with the globals that code reads. The memo keys a launch by all of that and, on a repeat,
  writes back the bytes the first run wrote. Launches it cannot key exactly (a callable grid,
  pre-run hooks, an argument of an unknown type) always run. A launch that raises is never
  stored, so a CRASH is reproduced by running it again.

One guard rides along: a kernel that loads or stores outside every tensor it was given (a bad
index or length in the metadata) reads or writes the worker's own memory in the interpreter, and
the worker dies of it or computes on garbage; on a GPU it is an illegal address. Each launch's
accesses are checked against its arguments' storages first, and such a launch raises
``OutOfBounds`` (the code's CRASH, ``sglfix.harness.codefault``) before it touches anything.

One correction rides along: the interpreter stores bfloat16 as uint16 and computes on those raw
bits (``tl.dot``, elementwise arithmetic, comparisons, ``tl.sum``/``tl.max`` and scans all treat
them as integers); ``install`` widens bfloat16 operands to float32 and rounds a bfloat16 result
back (what the GPU computes), so bfloat16 cells of real sglang mean on CPU what they mean on the
GPU.

Both are installed per worker process (``install``); ``SGLFIX_KERNEL_MEMO=0`` turns the memo
off (``SGLFIX_KERNEL_MEMO_MB`` sizes it, default 256 MiB per worker). ``stats()`` counts hits.
"""

from __future__ import annotations

import hashlib
import os
import types
from collections import OrderedDict
from typing import Any, ClassVar

from sglfix.common.environ import envs
from sglfix.harness.tracing import kernel_running

__all__ = ["clear", "install", "installed", "stats"]

_STATE: dict[str, Any] = {"installed": False, "memo": False}
_STATS = {"launches": 0, "hits": 0, "uncacheable": 0, "stored_bytes": 0, "evicted": 0}
_SCALARS = (int, float, bool, str, bytes, type(None))


def installed() -> bool:
    return bool(_STATE["installed"])


def stats() -> dict:
    return dict(_STATS, memo=bool(_STATE["memo"]), entries=len(_MEMO))


def clear() -> None:
    _MEMO.clear()
    _STATS["stored_bytes"] = 0


# -- patch once per launch -----------------------------------------------------------------------


class _Active:
    """The language modules patched by the launch in progress, and how to undo it."""

    scope: ClassVar[Any] = None
    langs: ClassVar[set[int]] = set()


def _langs_of(fn: Any, tl: Any) -> list:
    return [v for v in fn.__globals__.values() if isinstance(v, types.ModuleType) and v in (tl, tl.core)]


def _make_patch_lang(interp: Any, original: Any) -> Any:
    tl = interp.tl

    class _Nested:
        @staticmethod
        def restore() -> None:  # the launch's own scope undoes everything at its end
            pass

    def patch_lang(fn: Any) -> Any:
        if _Active.scope is None:
            scope = original(fn)
            _Active.scope, _Active.langs = scope, {id(m) for m in _langs_of(fn, tl)}

            class _Launch:
                @staticmethod
                def restore() -> None:
                    _Active.scope, _Active.langs = None, set()
                    scope.restore()

            return _Launch
        missing = [m for m in _langs_of(fn, tl) if id(m) not in _Active.langs]
        if missing:
            # A helper sees a language module its launch did not: patch it the way the
            # interpreter would, into the launch's scope so it is undone with the rest.
            extra = original(fn)
            _Active.scope._changes.extend(extra._changes)
            extra._changes = []
            _Active.langs |= {id(m) for m in missing}
        return _Nested

    return patch_lang


# -- launch memo -----------------------------------------------------------------------------
#
# A kernel's run is decided by the scalars, grid and code it is given and by the bytes it loads:
# whatever it stores follows from those (the interpreter runs program instances one after the
# other, so there is no race). The first run of a launch shape records which bytes of each
# argument storage it loaded (before the launch) and which it stored; a later launch of the same
# shape whose storages hold the same bytes at every recorded load address gets the recorded
# stores written back. Bytes it never loads (uninitialised outputs, other requests' slots)
# do not matter, which is what makes repeats frequent. A load or store outside every argument
# storage, or an atomic, makes the launch unrecordable: it always runs.


class _Uncacheable(Exception):
    pass


def _accessed(ptrs: Any, mask: Any) -> Any:
    """The addresses a load or store reaches: its pointers where its mask is set, flat."""
    import numpy as np

    addrs = np.asarray(ptrs, dtype=np.uint64)
    if mask is not None:
        addrs = addrs[np.broadcast_to(np.asarray(mask, dtype=bool), addrs.shape)]
    return addrs.ravel()


def _locate(addrs: Any, itemsize: int, bases: Any, ends: Any) -> tuple[Any, Any]:
    """For each address, the span (of sorted ``bases``/``ends``) it starts in, and whether its
    ``itemsize`` bytes fall outside every span."""
    import numpy as np

    slot = np.searchsorted(bases, addrs, side="right").astype(np.int64) - 1
    outside = (slot < 0) | (addrs + np.uint64(itemsize) > ends[np.maximum(slot, 0)])
    return slot, outside


class _Recorder:
    """Which bytes of each argument storage a running launch loads and stores."""

    current: _Recorder | None = None

    def __init__(self, bases: list[int], sizes: list[int]) -> None:
        import numpy as np

        order = sorted(range(len(bases)), key=lambda i: bases[i])
        self.order = np.array(order, dtype=np.int64)
        self.bases = np.array([bases[i] for i in order], dtype=np.uint64)
        self.ends = np.array([bases[i] + sizes[i] for i in order], dtype=np.uint64)
        self.sizes = sizes
        self.loads: dict[int, Any] = {}
        self.stores: dict[int, Any] = {}
        self.unrecordable: str | None = None

    def touch(self, addrs: Any, itemsize: int, into: dict) -> None:
        """Mark the bytes of ``addrs`` (the launch's accessed addresses, ``_accessed``)."""
        import numpy as np

        if not addrs.size:
            return
        slot, outside = _locate(addrs, itemsize, self.bases, self.ends)
        if bool(outside.any()):
            self.unrecordable = "an access outside every argument storage"
            return
        step = np.arange(itemsize, dtype=np.int64)
        for s in np.unique(slot):
            index = int(self.order[s])
            offsets = (addrs[slot == s] - self.bases[s]).astype(np.int64)
            marks = into.get(index)
            if marks is None:
                marks = into[index] = np.zeros(self.sizes[index], dtype=bool)
            marks[(offsets[:, None] + step).ravel()] = True


def _intervals(marks: Any) -> tuple[Any, Any]:
    import numpy as np

    at = np.flatnonzero(marks)
    if not at.size:
        return at, at
    breaks = np.flatnonzero(np.diff(at) != 1) + 1
    starts = at[np.r_[0, breaks]]
    ends = at[np.r_[breaks - 1, at.size - 1]] + 1
    return starts, ends - starts


def _gather_index(starts: Any, lens: Any) -> Any:
    import numpy as np

    if not starts.size:
        return starts
    shift = starts - np.concatenate(([0], np.cumsum(lens)[:-1]))
    return np.repeat(shift, lens) + np.arange(int(lens.sum()), dtype=np.int64)


class _Entry:
    __slots__ = ("digest", "nbytes", "reads", "writes")

    def __init__(self, reads: list, digest: bytes, writes: list) -> None:
        self.reads = reads  # [(storage index, interval starts, interval lengths)] in bytes
        self.digest = digest
        self.writes = writes  # [(storage index, starts, lengths, the bytes stored there)]
        self.nbytes = sum(a.nbytes + b.nbytes for _, a, b in reads) + sum(
            a.nbytes + b.nbytes + len(d) for _, a, b, d in writes
        )

    def matches(self, views: list) -> bool:
        return _digest(self.reads, views) == self.digest

    def apply(self, views: list) -> None:
        import numpy as np

        for index, starts, lens, data in self.writes:
            views[index][_gather_index(starts, lens)] = np.frombuffer(data, dtype=np.uint8)


def _digest(reads: list, views: list) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    for index, starts, lens in reads:
        h.update(index.to_bytes(4, "little"))
        h.update(starts.tobytes())
        h.update(views[index][_gather_index(starts, lens)].tobytes())
    return h.digest()


_MEMO: OrderedDict[bytes, list[_Entry]] = OrderedDict()
# Everything a key names by id stays alive, so that an id is never reused for another object
# (a code object swapped out by a revert and freed, then a new one at the same address).
_KEEP: dict[int, Any] = {}
_PER_SHAPE = 16  # recorded runs kept per launch shape (each costs a gather and a hash to test)


def _byte_view(storage: Any):
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def _code_fingerprint(fn: Any, h: Any, seen: set[int], jit_types: tuple) -> None:
    """The kernel's code and every global it reads, recursing into the @jit helpers it calls."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    code = fn.__code__
    _KEEP.setdefault(id(code), code)
    h.update(repr((fn.__module__, fn.__qualname__, id(code))).encode())
    names: list[str] = []
    stack = [code]
    while stack:
        c = stack.pop()
        names.extend(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    for name in names:
        if name in cells:
            value = cells[name].cell_contents
        elif name in fn.__globals__:
            value = fn.__globals__[name]
        else:
            continue
        h.update(name.encode())
        _value_fingerprint(value, h, seen, jit_types)


def _value_fingerprint(value: Any, h: Any, seen: set[int], jit_types: tuple) -> None:
    if isinstance(value, jit_types):
        _code_fingerprint(value.fn, h, seen, jit_types)
    elif isinstance(value, types.FunctionType):
        # A plain helper the interpreter runs as Python: its code may be patched like any other.
        _code_fingerprint(value, h, seen, jit_types)
    elif isinstance(value, _SCALARS):
        h.update(repr((type(value).__name__, value)).encode())
    elif type(value).__name__ == "constexpr":
        h.update(repr(("constexpr", value.value)).encode())
    else:
        # Modules, classes, language builtins: their identity is what the kernel binds to.
        _KEEP.setdefault(id(value), value)
        h.update(repr((type(value).__name__, id(value))).encode())


def _arg_fingerprint(arg: Any, h: Any, storages: dict[int, Any]) -> None:
    import torch

    if type(arg).__name__ == "TensorWrapper":
        h.update(repr(("wrapped", str(arg.dtype))).encode())
        arg = arg.base
    if isinstance(arg, torch.Tensor):
        if arg.device.type != "cpu":
            raise _Uncacheable
        storage = arg.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in storages:
            storages[ptr] = storage
        index = list(storages).index(ptr)
        h.update(
            repr(
                ("t", index, storage.nbytes(), arg.storage_offset(), tuple(arg.shape), arg.stride(), str(arg.dtype))
            ).encode()
        )
    elif isinstance(arg, _SCALARS):
        h.update(repr((type(arg).__name__, arg)).encode())
    elif isinstance(arg, tuple):
        h.update(b"(")
        for a in arg:
            _arg_fingerprint(a, h, storages)
        h.update(b")")
    elif type(arg).__name__ == "constexpr":
        h.update(repr(("constexpr", arg.value)).encode())
    elif isinstance(arg, torch.dtype) or type(arg).__module__.startswith("triton.language"):
        h.update(repr((type(arg).__name__, str(arg))).encode())
    else:
        raise _Uncacheable


def _launch_shape(kernel: Any, args: tuple, kwargs: dict, grid: Any, jit_types: tuple) -> tuple[bytes, list]:
    """Everything but memory contents: code, grid, scalars, and how tensors sit in storages."""
    if callable(grid) or kernel.pre_run_hooks:
        raise _Uncacheable
    h = hashlib.blake2b(digest_size=20)
    _code_fingerprint(kernel.fn, h, set(), jit_types)
    h.update(repr(("grid", tuple(grid))).encode())
    storages: dict[int, Any] = {}
    for a in args:
        _arg_fingerprint(a, h, storages)
    for k in sorted(kwargs):
        h.update(k.encode())
        _arg_fingerprint(kwargs[k], h, storages)
    return h.digest(), list(storages.values())


def _budget() -> int:
    try:
        mb = envs.SGLFIX_KERNEL_MEMO_MB.get()
    except ValueError:
        mb = envs.SGLFIX_KERNEL_MEMO_MB.default
    return int(max(0.0, mb) * (1 << 20))


def _store(shape: bytes, entry: _Entry) -> None:
    budget = _budget()
    if entry.nbytes > budget:
        return
    entries = _MEMO.setdefault(shape, [])
    entries.insert(0, entry)
    _MEMO.move_to_end(shape)
    _STATS["stored_bytes"] += entry.nbytes
    if len(entries) > _PER_SHAPE:
        _STATS["stored_bytes"] -= entries.pop().nbytes
        _STATS["evicted"] += 1
    while _STATS["stored_bytes"] > budget and _MEMO:
        _, old = _MEMO.popitem(last=False)
        _STATS["stored_bytes"] -= sum(e.nbytes for e in old)
        _STATS["evicted"] += len(old)


def _record(run: Any, views: list, storages: list) -> tuple[Any, _Entry | None]:
    bases = [s.data_ptr() for s in storages]
    sizes = [s.nbytes() for s in storages]
    before = [v.copy() for v in views]
    recorder = _Recorder(bases, sizes)
    _Recorder.current = recorder
    try:
        out = run()
    finally:
        _Recorder.current = None
    if recorder.unrecordable:
        return out, None
    reads = [(i, *_intervals(m)) for i, m in sorted(recorder.loads.items())]
    writes = []
    for i, m in sorted(recorder.stores.items()):
        starts, lens = _intervals(m)
        writes.append((i, starts, lens, views[i][_gather_index(starts, lens)].tobytes()))
    return out, _Entry(reads, _digest(reads, before), writes)


class _Bounds:
    """The storages a running launch was given: every access must lie inside one of them."""

    current: ClassVar[_Bounds | None] = None

    def __init__(self, kernel: str, storages: list) -> None:
        import numpy as np

        spans = sorted((s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages)
        self.kernel = kernel
        self.bases = np.array([b for b, _ in spans], dtype=np.uint64)
        self.ends = np.array([e for _, e in spans], dtype=np.uint64)

    def check(self, addrs: Any, itemsize: int, kind: str) -> None:
        """Raise OutOfBounds when one of ``addrs`` (``_accessed``) lies outside every storage."""
        if not addrs.size:
            return
        _, outside = _locate(addrs, itemsize, self.bases, self.ends)
        if bool(outside.any()):
            from sglfix.harness.codefault import OutOfBounds

            raise OutOfBounds(
                f"kernel {self.kernel} {kind}s outside every tensor it was given "
                f"({int(outside.sum())} of {addrs.size} address(es) of one {kind})"
            )


def _argument_storages(args: tuple, kwargs: dict) -> list | None:
    """The storages of every tensor argument, as the interpreter finds them (a wrapped tensor's
    base, a descriptor's base, inside tuples); None when an argument holds memory another way."""
    out: dict[int, Any] = {}

    def visit(arg: Any) -> bool:
        if isinstance(arg, (tuple, list)):
            return all(visit(a) for a in arg)
        if type(arg).__name__ == "TensorDescriptor":
            return visit(arg.base)
        if not hasattr(arg, "data_ptr"):
            return True
        base = getattr(arg, "base", arg) if type(arg).__name__ == "TensorWrapper" else arg
        if not hasattr(base, "untyped_storage"):
            return False
        storage = base.untyped_storage()
        out.setdefault(storage.data_ptr(), storage)
        return True

    if not all(visit(a) for a in (*args, *kwargs.values())):
        return None
    return list(out.values())


def _make_run(original: Any, jit_types: tuple) -> Any:
    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        storages = None if warmup else _argument_storages(args, kwargs)
        outer = _Bounds.current
        name = getattr(getattr(self, "fn", None), "__name__", "?")
        _Bounds.current = _Bounds(name, storages) if storages is not None else None
        try:
            with kernel_running(self):
                return memo_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            _Bounds.current = outer

    def memo_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if warmup or not _STATE["memo"] or _Recorder.current is not None:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        _STATS["launches"] += 1
        try:
            shape, storages = _launch_shape(self, args, kwargs, grid, jit_types)
        except _Uncacheable:
            _STATS["uncacheable"] += 1
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        views = [_byte_view(s) for s in storages]
        for entry in _MEMO.get(shape, ()):
            if entry.matches(views):
                entry.apply(views)
                _MEMO.move_to_end(shape)
                _STATS["hits"] += 1
                return None
        out, entry = _record(lambda: original(self, *args, grid=grid, warmup=warmup, **kwargs), views, storages)
        if entry is None:
            _STATS["uncacheable"] += 1
        else:
            _store(shape, entry)
        return out

    return run


def _make_builder_hooks(interp: Any) -> None:
    """Report every load and store of a recorded launch; atomics make it unrecordable."""
    cls = interp.InterpreterBuilder
    np_dtype = interp._get_np_dtype

    def hook(name: str, kind: str) -> None:
        original = getattr(cls, name)

        def load_or_store(self: Any, ptrs: Any, *rest: Any, **kw: Any) -> Any:
            rec, bounds = _Recorder.current, _Bounds.current
            if rec is not None or bounds is not None:
                at = 0 if kind == "load" else 1
                mask = rest[at] if len(rest) > at else kw["mask"]
                size = np_dtype(ptrs.get_element_ty()).itemsize
                addrs = _accessed(ptrs.data, mask.data)  # once for the guard and the recorder
                if bounds is not None:
                    bounds.check(addrs, size, kind)
                if rec is not None:
                    rec.touch(addrs, size, rec.loads if kind == "load" else rec.stores)
            return original(self, ptrs, *rest, **kw)

        setattr(cls, name, load_or_store)

    def refuse(name: str) -> None:
        original = getattr(cls, name)

        def atomic(self: Any, *a: Any, **kw: Any) -> Any:
            if _Recorder.current is not None:
                _Recorder.current.unrecordable = "an atomic"
            return original(self, *a, **kw)

        setattr(cls, name, atomic)

    hook("create_masked_load", "load")
    hook("create_masked_store", "store")
    for name in ("create_atomic_cas", "create_atomic_rmw", "create_atomic_poll"):
        if hasattr(cls, name):
            refuse(name)


def _fix_bfloat16_dot(interp: Any) -> None:
    """``tl.dot`` of bfloat16 operands multiplies their raw bits in the interpreter (it stores
    bfloat16 as uint16 and converts only 8-bit floats before the product), so every bfloat16
    attention kernel of real sglang is wrong on CPU and right on the GPU. Widening bfloat16 to
    float32 first is exact and is what the GPU's tensor cores accumulate in."""
    cls = interp.InterpreterBuilder
    original = cls.create_dot
    bf = _Bfloat16(interp)

    def widen(h: Any) -> Any:
        return bf.widen(h) if bf.is_handle(h) else h

    def create_dot(self: Any, a: Any, b: Any, d: Any, *rest: Any, **kw: Any) -> Any:
        return original(self, widen(a), widen(b), d, *rest, **kw)

    cls.create_dot = create_dot


# Float ops of the interpreter's builder that read their operands' values (``fabs`` and
# ``select`` move bits only and are right as they are).
_FLOAT_OPS = (
    "create_fadd", "create_fsub", "create_fmul", "create_fdiv", "create_frem", "create_fneg",
    "create_precise_divf", "create_approx_divf", "create_fma",
    "create_minimumf", "create_minnumf", "create_maximumf", "create_maxnumf",
    "create_fcmpOLT", "create_fcmpOGT", "create_fcmpOLE", "create_fcmpOGE", "create_fcmpOEQ",
    "create_fcmpONE", "create_fcmpULT", "create_fcmpUGT", "create_fcmpULE", "create_fcmpUGE",
    "create_fcmpUEQ", "create_fcmpUNE",
    "create_exp", "create_exp2", "create_log", "create_log2", "create_sqrt", "create_precise_sqrt",
    "create_rsqrt", "create_cos", "create_sin", "create_floor", "create_ceil", "create_erf",
    "create_clampf",
)  # fmt: skip


class _Bfloat16:
    """Moves interpreter values between bfloat16's uint16 storage and float32."""

    def __init__(self, interp: Any) -> None:
        self.interp, self.tl = interp, interp.tl
        self.bf16, self.f32 = interp.tl.bfloat16, interp.tl.float32

    def is_handle(self, x: Any) -> bool:
        return isinstance(x, self.interp.TensorHandle) and x.dtype == self.bf16

    def is_tensor(self, x: Any, dtype: Any) -> bool:
        return isinstance(x, self.tl.core.tensor) and x.dtype == dtype

    def widen(self, h: Any) -> Any:
        import numpy as np

        bits = np.ascontiguousarray(h.data).view(np.uint16).astype(np.uint32) << 16
        return self.interp.TensorHandle(bits.view(np.float32), self.f32)

    def narrow(self, h: Any) -> Any:
        """Round to nearest even (torch's cast), as the GPU's bfloat16 units round."""
        import numpy as np
        import torch

        data = np.ascontiguousarray(np.asarray(h.data, dtype=np.float32))
        bits = torch.from_numpy(data).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return self.interp.TensorHandle(bits.reshape(data.shape), self.bf16)

    def retype(self, t: Any, handle: Any, dtype: Any) -> Any:
        return self.tl.core.tensor(handle, t.type.with_element_ty(dtype) if t.type.is_block() else dtype)


def _fix_bfloat16_arith(interp: Any) -> None:
    """Elementwise float ops and the numpy fast paths of reductions and scans run on bfloat16's
    uint16 storage as integers (``a * b`` of 1.5 and 2.0 gives 0), so a kernel that multiplies or
    sums bfloat16 tiles (sglang's MHA decode kernel does: ``q * k`` before its float32
    cast) reads NaN or garbage on CPU. Each such op computes on the float32 values here and a
    bfloat16 result is rounded back."""
    bf = _Bfloat16(interp)

    def wrap_op(original: Any) -> Any:
        def op(self: Any, *args: Any, **kw: Any) -> Any:
            if not any(bf.is_handle(a) for a in args):
                return original(self, *args, **kw)
            out = original(self, *(bf.widen(a) if bf.is_handle(a) else a for a in args), **kw)
            return bf.narrow(out) if isinstance(out, interp.TensorHandle) and out.dtype == bf.f32 else out

        return op

    for name in _FLOAT_OPS:
        if hasattr(interp.InterpreterBuilder, name):
            setattr(interp.InterpreterBuilder, name, wrap_op(getattr(interp.InterpreterBuilder, name)))

    def narrow_tensor(t: Any) -> Any:
        return bf.retype(t, bf.narrow(t.handle), bf.bf16) if bf.is_tensor(t, bf.f32) else t

    def wrap_fast_path(original: Any) -> Any:
        def fast(self: Any, input: Any, *args: Any, **kw: Any) -> Any:
            if not bf.is_tensor(input, bf.bf16):
                return original(self, input, *args, **kw)
            out = original(self, bf.retype(input, bf.widen(input.handle), bf.f32), *args, **kw)
            return type(out)(map(narrow_tensor, out)) if isinstance(out, (list, tuple)) else narrow_tensor(out)

        return fast

    for klass, names in ((interp.ReduceOps, ("sum", "min_max")), (interp.ScanOps, ("cumsum", "cumprod"))):
        for name in names:
            if hasattr(klass, name):
                setattr(klass, name, wrap_fast_path(getattr(klass, name)))


def install() -> bool:
    """Install both in this process (interpreter mode only). False when this Triton's
    interpreter does not have the shape relied on; then nothing is changed."""
    if _STATE["installed"]:
        return True
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    needed = (
        "_patch_lang",
        "InterpretedFunction",
        "GridExecutor",
        "_LangPatchScope",
        "tl",
        "InterpreterBuilder",
        "_get_np_dtype",
    )
    if not all(hasattr(interp, n) for n in needed) or not hasattr(interp._LangPatchScope(), "_changes"):
        return False
    jit_types = (interp.InterpretedFunction,)
    try:
        from triton.runtime.jit import JITFunction

        jit_types += (JITFunction,)
    except ImportError:
        pass
    interp._patch_lang = _make_patch_lang(interp, interp._patch_lang)
    interp.InterpretedFunction.run = _make_run(interp.InterpretedFunction.run, jit_types)
    _make_builder_hooks(interp)
    if hasattr(interp, "TensorHandle"):
        _fix_bfloat16_dot(interp)
        if all(hasattr(interp, n) for n in ("ReduceOps", "ScanOps")):
            _fix_bfloat16_arith(interp)
    _STATE["installed"] = True
    _STATE["memo"] = envs.SGLFIX_KERNEL_MEMO.get()
    return True
