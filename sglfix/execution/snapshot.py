"""What the code under test binds, by identity: proof that a toggle set left nothing behind.

A worker takes a snapshot after boot and compares against it before each new toggle set; a
change means the next set would not start from clean code, so the worker is replaced.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["StateSnapshot"]

_MISSING = object()


class _Contents:
    """A shallow copy of a mutable container, compared item by item by identity."""

    __slots__ = ("items", "mapping")

    def __init__(self, value: Any) -> None:
        self.items = tuple(value.items()) if isinstance(value, dict) else tuple(value)
        self.mapping = dict(self.items) if isinstance(value, dict) else None

    def prefix_of(self, current: dict) -> bool:
        """Every key of the snapshot is still there, bound to the same object."""
        return all(k in current and current[k] is v for k, v in self.items)

    def same(self, other: _Contents) -> bool:
        return len(self.items) == len(other.items) and all(
            (a is b) if not isinstance(a, tuple) else (a[0] is b[0] and a[1] is b[1])
            for a, b in zip(self.items, other.items)
        )


class StateSnapshot:
    """What the modules under test bind, by identity: module attributes, one level into their
    dicts, lists and sets, class attributes, and each function's code and defaults.

    A name rebound or removed is a change. A name added is not, unless it shadows a builtin:
    the Triton interpreter adds its helpers to a kernel's module the first time it runs it,
    and code that never had a name cannot read it. Added names join the snapshot, so a later
    rebinding of them is seen. Holds references, so an id cannot be reused between snapshots.
    In-place changes deeper than one level (a tensor's contents, an object's fields) are not seen.

    A module attribute that was ``None`` in the snapshot and is bound now is upstream's lazy
    module cache (``global_workspace_buffer``: allocated by the first backend built in the
    process): ``reset_lazy`` puts ``None`` back, which is exactly the snapshot's state, so the
    next set starts from it without a fresh process. Likewise a module-level dict that only
    gained keys is a memo filled by use (sglang's JIT ``_digest_cache``): ``reset_lazy`` removes
    the added keys, so the dict holds again exactly what the snapshot saw (a value changed or a
    key removed is still a change).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.entries = self._take()

    def _take(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, module in sorted(sys.modules.items()):
            if module is None or not (name == self.prefix or name.startswith(self.prefix + ".")):
                continue
            out[name] = module
            for key, value in list(vars(module).items()):
                self._add(out, f"{name}.{key}", value)
                if isinstance(value, (dict, list, set)) and not key.startswith("__"):
                    out[f"{name}.{key}[...]"] = _Contents(value)
                if isinstance(value, type) and value.__module__ == name:
                    for attr, member in list(vars(value).items()):
                        self._add(out, f"{name}.{key}.{attr}", member)
        return out

    @staticmethod
    def _add(out: dict, path: str, value: Any) -> None:
        out[path] = value
        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        # A type test, never hasattr: an engine's lazy-import proxies import their module on any
        # attribute lookup (sglang's would import uvloop, which a CPU box need not have).
        if isinstance(fn, types.FunctionType):
            out[path + ".__code__"] = fn.__code__
            out[path + ".__defaults__"] = fn.__defaults__
            out[path + ".__kwdefaults__"] = fn.__kwdefaults__

    def reset_lazy(self) -> list[str]:
        """Rebind to ``None`` every module attribute that was ``None`` in the snapshot, and drop
        the keys a module-level dict gained since; the paths."""
        reset = []
        for path, old in self.entries.items():
            if isinstance(old, _Contents) and old.mapping is not None:
                current = self.entries.get(path[: -len("[...]")])
                if isinstance(current, dict) and len(current) > len(old.items) and old.prefix_of(current):
                    for key in [k for k in current if k not in old.mapping]:
                        del current[key]
                    reset.append(path)
                continue
            if old is not None:
                continue
            owner, _, name = path.rpartition(".")
            module = self.entries.get(owner)
            if isinstance(module, type(sys)) and getattr(module, name, None) is not None:
                setattr(module, name, None)
                reset.append(path)
        return reset

    def changes(self) -> list[str]:
        """Paths bound differently now than in the snapshot (empty: nothing leaked)."""
        import builtins

        now = self._take()
        changed = []
        for path, old in self.entries.items():
            new = now.get(path, _MISSING)
            if isinstance(old, _Contents) and isinstance(new, _Contents):
                if not old.same(new):
                    changed.append(path)
            elif old is not new:
                changed.append(path)
        added = now.keys() - self.entries.keys()
        shadows = []
        for path in added:
            owner, _, name = path.rpartition(".")
            if isinstance(now.get(owner), type(sys)) and not name.startswith("__") and hasattr(builtins, name):
                shadows.append(path)
        changed.extend(sorted(shadows))
        if not changed:
            self.entries.update((p, now[p]) for p in added)
        return changed
