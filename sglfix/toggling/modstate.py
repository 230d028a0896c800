"""Module state a revert changes as a side effect, and putting it back.

A reverted function may rebind module attributes when it runs (``global CACHE; CACHE = ...``,
``other_module.X = ...``). Putting its code object back alone would leave that state behind
for the next cell or the next revert. A ``ModuleSnapshot`` is a shallow copy of the
``__dict__`` of every loaded module under the patchable prefixes, and of the targets' modules;
``restore()`` rebinds the keys that changed, and removes an added key only where it shadows a
builtin (it would change what a name means). Other added names stay: runtimes add helpers to a
module the first time its code runs (the Triton interpreter binds its semantic objects into a
kernel's module), and removing them would break every later run in the process.

A shallow copy cannot see inside objects mutated in place (a dict filled as a cache); those
keep their content. A submodule imported meanwhile stays bound on its package: the import is
no side effect of the revert, and unbinding it would break ``package.submodule`` lookups.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable

from sglfix.common.codebase import under

__all__ = ["ModuleSnapshot"]


class ModuleSnapshot:
    """Copies of module namespaces, keyed by the namespace's identity."""

    def __init__(self, copies: dict[int, tuple[dict, dict]]) -> None:
        self._copies = copies

    @classmethod
    def take(cls, *, prefixes: Iterable[str], namespaces: Iterable[dict] = ()) -> ModuleSnapshot:
        prefixes = tuple(prefixes)
        chosen: list[dict] = [
            module.__dict__
            for name, module in list(sys.modules.items())
            if isinstance(module, types.ModuleType) and any(under(name, p) for p in prefixes)
        ]
        chosen.extend(namespaces)
        return cls({id(ns): (ns, dict(ns)) for ns in chosen})

    def __len__(self) -> int:
        return len(self._copies)

    def changed(self) -> list[str]:
        """``module.key`` for each binding that differs from the snapshot (for messages, tests)."""
        out: list[str] = []
        for ns, saved in self._copies.values():
            name = ns.get("__name__", "?")
            for key in set(ns) | set(saved):
                if key not in saved and key not in _BUILTIN_NAMES:
                    continue
                if ns.get(key, _MISSING) is not saved.get(key, _MISSING):
                    out.append(f"{name}.{key}")
        return sorted(out)

    def restore(self) -> None:
        for ns, saved in self._copies.values():
            for key in [k for k in ns if k not in saved]:
                if key in _BUILTIN_NAMES:
                    del ns[key]
            for key, value in saved.items():
                if ns.get(key, _MISSING) is not value:
                    ns[key] = value

    def older_than(self, newer: ModuleSnapshot) -> ModuleSnapshot:
        """One snapshot that restores to this (older) point wherever both saw a module."""
        return ModuleSnapshot({**newer._copies, **self._copies})


_MISSING = object()
_BUILTIN_NAMES = frozenset(dir(__import__("builtins")))
