"""What the code under test binds, by identity: proof that a toggle set left nothing behind.

A worker takes a snapshot after boot and compares against it before each new toggle set; a
change means the next set would not start from clean code, so the worker is replaced.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from itertools import chain
from typing import Any

__all__ = ["StateSnapshot"]

_MISSING = object()
_SCALARS = (bool, int, str, bytes, type(None))
_REBINDS = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})


def _unset(value: Any) -> bool:
    """An "unset" marker: ``None``, or a bare ``object()`` (upstream's "not resolved yet"
    sentinel, e.g. ``_UNRESOLVED = object()``): nothing but its identity means anything."""
    return value is None or type(value) is object


def _plain(value: Any, depth: int = 0) -> bool:
    """Immutable data all the way down: a number, a string, bytes, or a tuple/frozenset of them."""
    kind = type(value)
    if kind in _SCALARS or kind is float or kind is complex:
        return True
    return kind in (tuple, frozenset) and depth < 4 and all(_plain(v, depth + 1) for v in value)


def _equal_value(old: Any, new: Any) -> bool:
    """Equal immutable values of one type: no code can tell them apart but by ``is``
    (``frozenset()`` made anew, ``64 * 1024 * 1024`` computed again). Floats compare by their
    bits, so ``-0.0`` is not ``0.0`` and a NaN is itself."""
    kind = type(old)
    if kind is not type(new):
        return False
    if kind is float:
        return old.hex() == new.hex()
    if kind is complex:
        return old.real.hex() == new.real.hex() and old.imag.hex() == new.imag.hex()
    if kind in (tuple, frozenset):
        if len(old) != len(new) or not (_plain(old) and _plain(new)):
            return False
        if kind is tuple:
            return all(_equal_value(a, b) for a, b in zip(old, new))
        return old == new and all(type(v) not in (float, complex) for v in old)
    return kind in _SCALARS and old == new


def _codes_of(value: Any, module_dict: dict, out: list) -> None:
    """The code objects of ``value`` that run with ``module_dict`` as their globals: a function
    of the module (through ``functools.wraps``/``lru_cache`` wrappers), or a class's methods,
    static and class methods and property accessors."""
    for _ in range(8):  # a chain of wrappers, bounded
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            for accessor in (value.fget, value.fset, value.fdel):
                _codes_of(accessor, module_dict, out)
            return
        if isinstance(value, functools.cached_property):
            value = value.func
        if isinstance(value, types.FunctionType):
            if value.__globals__ is module_dict:
                out.append(value.__code__)
            value = value.__dict__.get("__wrapped__")
        elif isinstance(value, functools._lru_cache_wrapper):
            value = value.__wrapped__
        else:
            return


def _rebound_names(code: types.CodeType, out: set[str]) -> None:
    """Every module global that ``code`` (or code nested in it) rebinds: ``global X; X = ...``."""
    for ins in dis.get_instructions(code):
        if ins.opname in _REBINDS:
            out.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _rebound_names(const, out)


def _raw_items(value: dict) -> tuple:
    """What a dict holds, read as a plain dict: a subclass's own ``items`` may do anything
    (transformers' lazy config mapping imports every model's module to list them)."""
    return tuple(dict.items(value))


def _raw_members(value: Any) -> tuple:
    return tuple(list.__iter__(value) if isinstance(value, list) else set.__iter__(value))


class _Contents:
    """A shallow copy of a mutable container, compared item by item by identity."""

    __slots__ = ("items", "mapping")

    def __init__(self, value: Any) -> None:
        self.items = _raw_items(value) if isinstance(value, dict) else _raw_members(value)
        self.mapping = dict(self.items) if isinstance(value, dict) else None

    def prefix_of(self, current: dict) -> bool:
        """Every key of the snapshot is still there, bound to the same object."""
        return all(dict.get(current, k, _MISSING) is v for k, v in self.items)

    def same(self, other: _Contents) -> bool:
        return len(self.items) == len(other.items) and all(
            (a is b) if not isinstance(a, tuple) else (a[0] is b[0] and a[1] is b[1])
            for a, b in zip(self.items, other.items)
        )


def _print(module: types.ModuleType) -> tuple[list[int], list[int]]:
    """What ``StateSnapshot`` records of one module, as the identities of the objects in it, in
    one fixed order (its names and what they bind, then one level into its containers, its
    classes' attributes, each function's code and defaults), and the containers' sizes. Equal
    prints (the snapshot holds the objects, so no id is reused) mean nothing the snapshot records
    changed; only a module whose print differs is walked in full.

    Every set switch prints every module under test (1300 of sglang's), so the common cases are
    tested by exact type first: a function (no subclass exists) or a class of the module."""
    name = module.__name__
    items = list(vars(module).items())
    out: list[Any] = [module]
    out += chain.from_iterable(items)
    sizes: list[int] = []
    for key, value in items:
        kind = type(value)
        if kind is _FUNCTION:
            out += (value.__code__, value.__defaults__, value.__kwdefaults__)
        elif isinstance(value, type):
            if value.__module__ == name:
                attrs = list(vars(value).items())
                out += chain.from_iterable(attrs)
                for _, member in attrs:
                    if type(member) is _FUNCTION:
                        out += (member.__code__, member.__defaults__, member.__kwdefaults__)
                    elif isinstance(member, _METHOD_WRAPPERS):
                        _function_print(member, out)
        elif isinstance(value, (dict, list, set)):
            if key.startswith("__"):
                continue
            if isinstance(value, dict):
                out += dict.keys(value)
                out += dict.values(value)
                sizes.append(dict.__len__(value))
            else:
                members = _raw_members(value)
                out += members
                sizes.append(len(members))
        elif isinstance(value, _METHOD_WRAPPERS):
            _function_print(value, out)
    return list(map(id, out)), sizes


_FUNCTION = types.FunctionType
_METHOD_WRAPPERS = (staticmethod, classmethod)


def _function_print(value: Any, out: list) -> bool:
    """A function's (or a static or class method's) code and defaults into ``out``, as
    ``StateSnapshot._add`` records them; False for anything else."""
    fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if not isinstance(fn, types.FunctionType):
        return False
    out += (fn.__code__, fn.__defaults__, fn.__kwdefaults__)
    return True


class StateSnapshot:
    """What the modules under test bind, by identity: module attributes, one level into their
    dicts, lists and sets, class attributes, and each function's code and defaults.

    A name rebound or removed is a change. A name added is not, unless it shadows a builtin:
    the Triton interpreter adds its helpers to a kernel's module the first time it runs it,
    and code that never had a name cannot read it. Added names join the snapshot, so a later
    rebinding of them is seen. Holds references, so an id cannot be reused between snapshots.
    In-place changes deeper than one level (a tensor's contents, an object's fields) are not seen.

    What the code under test does to its own module state as it runs is no leftover:

    - Lazy initialisation. A module attribute that was unset in the snapshot (``None``, or a
      bare ``object()`` sentinel such as sglang's ``fused_op._UNRESOLVED``) and is bound now is
      a cache filled on first use (``global_workspace_buffer``: allocated by the first backend
      built in the process; ``_forced_backend``: read from the environment on first use):
      ``reset_lazy`` puts the unset value back, which is exactly the snapshot's state, so the
      next set starts from it without a fresh process, computes it afresh with its own code,
      and its first-use code paths run again (reachability recording relies on that).
      Likewise a module-level dict that only gained keys is a memo filled by use (sglang's JIT
      ``_digest_cache``): ``reset_lazy`` removes the added keys, so the dict holds again
      exactly what the snapshot saw (a value changed or a key removed is still a change).
    - The module's own run-time state. A global that a function of its own module rebinds
      (``global X; X = ...`` in the code the snapshot saw: a setter's configuration such as
      sglang's ``_allowed_media_domains``, a calibration such as
      ``global_diff_realtime_monotonic``, a once-flag guarding a registration) is state the
      module keeps by design, not code: a new binding is accepted and the snapshot takes it.
      It is not reset: a flag put back while what it guards (an op registered with torch, a
      signal handler, a hook) stays done is a state no process is ever in. A revert's own
      rebindings are put back by the revert itself (``sglfix.toggling.modstate``).
    - An equal immutable value. A name rebound to an equal number, string, bytes, or a
      tuple/frozenset of them (a setter recomputing its default) cannot be told apart by any
      code but ``is``: no change.

    Still a change: a function's code or defaults changed, a class attribute rebound, a global
    that no function of its module rebinds (a constant) rebound to another value, even by code
    a revert added to the module, a dict value changed or a key removed.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._codes: dict[str, list[types.CodeType]] = {}  # module -> code that runs in its globals
        self._owned: dict[str, frozenset[str]] = {}  # module -> globals its own code rebinds
        self.entries = self._take(codes=self._codes)
        self._index()

    def _modules(self) -> dict[str, types.ModuleType]:
        return {
            name: module
            for name, module in sys.modules.items()
            if module is not None and (name == self.prefix or name.startswith(self.prefix + "."))
        }

    def _index(self, modules: Any = None) -> None:
        """Each module's paths, its identity print (``_prints``), and the paths ``reset_lazy``
        looks at: made at the start, then remade for ``modules`` whenever their entries change."""
        if modules is None:
            self._paths: dict[str, list[str]] = {}
            self._prints: dict[str, tuple] = {}
            self._lazy: dict[str, list[str]] = {}
            fresh = list(self.entries)
        else:
            # The changed modules' paths as they were, and every path added since.
            kept = [p for name in modules for p in self._paths.pop(name, ()) if p in self.entries]
            fresh = [*kept, *(p for p in self.entries if p not in self._known)]
            for name in modules:
                self._prints.pop(name, None)
                self._lazy.pop(name, None)
                if isinstance(self.entries.get(name), types.ModuleType) and name in sys.modules:
                    self._paths[name] = []
        for path in fresh:
            if isinstance(self.entries[path], types.ModuleType) and path in sys.modules:
                self._paths.setdefault(path, [])
        for path in fresh:  # each once: the kept ones were known, the others not
            owner = self._owner(path)
            if owner:
                self._paths[owner].append(path)
        touched = self._paths if modules is None else [m for m in modules if m in self._paths]
        for name in touched:
            self._prints[name] = _print(self.entries[name])
            # Module attributes that were unset, and module-level dicts: what ``reset_lazy`` may undo.
            self._lazy[name] = [
                p
                for p in self._paths[name]
                if (isinstance(self.entries[p], _Contents) and self.entries[p].mapping is not None)
                or (_unset(self.entries[p]) and isinstance(self.entries.get(p.rpartition(".")[0]), types.ModuleType))
            ]
        self._known: set[str] = set(self.entries)

    def _owner(self, path: str) -> str:
        """The module a path belongs to: the longest module name it starts with."""
        owner = path
        while owner and owner not in self._paths:
            owner = owner.rpartition(".")[0]
        return owner

    def _dirty(self) -> list[str]:
        """The modules whose identity print differs from the snapshot's (or that came or went):
        only those can hold a change, so only those are walked in full."""
        now = self._modules()
        dirty = [n for n in now if n not in self._prints or _print(now[n]) != self._prints[n]]
        return dirty + [n for n in self._prints if n not in now]

    def _take(self, codes: dict[str, list] | None = None, only: Any = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, module in sorted(sys.modules.items()):
            if module is None or not (name == self.prefix or name.startswith(self.prefix + ".")):
                continue
            if only is not None and name not in only:
                continue
            out[name] = module
            namespace = vars(module)
            found: list = []  # kept only when ``codes`` asks for it
            for key, value in list(namespace.items()):
                self._add(out, f"{name}.{key}", value)
                if isinstance(value, (dict, list, set)) and not key.startswith("__"):
                    out[f"{name}.{key}[...]"] = _Contents(value)
                is_class = isinstance(value, type) and value.__module__ == name
                if is_class:
                    for attr, member in list(vars(value).items()):
                        self._add(out, f"{name}.{key}.{attr}", member)
                if codes is not None:
                    for member in vars(value).values() if is_class else (value,):
                        _codes_of(member, namespace, found)
            if codes is not None:
                codes[name] = found
        if only is not None:
            # A submodule's name is also its package's attribute: a whole walk writes the module
            # itself last there, so a walk of some modules must too.
            for path in list(out):
                owner = sys.modules.get(path)
                if owner is not None and (path == self.prefix or path.startswith(self.prefix + ".")):
                    out[path] = owner
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

    def _module_of(self, path: str) -> tuple[str, types.ModuleType | None, str]:
        """For a ``module.name`` path: the module's name, the module, and the name (the module
        is None for any other path)."""
        owner, _, name = path.rpartition(".")
        module = self.entries.get(owner)
        return owner, (module if isinstance(module, types.ModuleType) else None), name

    def owns(self, path: str) -> bool:
        """Whether ``path`` is a global of its module that the module's own code, as the
        snapshot saw it, rebinds (``global X; X = ...``)."""
        owner, module, name = self._module_of(path)
        if module is None or owner not in self._codes:
            return False
        owned = self._owned.get(owner)
        if owned is None:
            names: set[str] = set()
            for code in self._codes[owner]:
                _rebound_names(code, names)
            owned = self._owned[owner] = frozenset(names)
        return name in owned

    def reset_lazy(self) -> list[str]:
        """Put the unset value back (``None`` or the very sentinel) in every module attribute
        that held it in the snapshot and holds a value now, and drop the keys a module-level
        dict gained since; the paths."""
        reset = []
        for path in [p for paths in self._lazy.values() for p in paths]:
            old = self.entries[path]
            if isinstance(old, _Contents) and old.mapping is not None:
                current = self.entries.get(path[: -len("[...]")])
                if isinstance(current, dict) and dict.__len__(current) > len(old.items) and old.prefix_of(current):
                    for key in [k for k in dict.keys(current) if k not in old.mapping]:
                        dict.__delitem__(current, key)
                    reset.append(path)
                continue
            if not _unset(old):
                continue
            _, module, name = self._module_of(path)
            if module is None:
                continue
            # vars(), never getattr: a module's __getattr__ may import on a missing name.
            current = vars(module).get(name, _MISSING)
            if current is old or current is _MISSING or (type(old) is object and type(current) is object):
                continue  # unset still; or gone, or another marker: a change
            setattr(module, name, old)
            reset.append(path)
        return reset

    def changes(self) -> list[str]:
        """Paths bound differently now than in the snapshot (empty: nothing leaked)."""
        import builtins

        dirty = self._dirty()
        if not dirty:
            return []
        now = self._take(only=set(dirty))
        changed = []
        accepted: list[str] = []  # the module's own state, rebound by its own code

        def under_accepted(path: str) -> bool:
            return any(path.startswith(a) and path[len(a)] in ".[" for a in accepted if len(path) > len(a))

        # The paths of the changed modules, and any other path their walk met (a package's
        # name for a submodule is also the submodule's own path).
        paths = dict.fromkeys(p for name in dirty for p in self._paths.get(name, ()))
        paths.update((p, None) for p in now if p in self.entries)
        for path in paths:
            old = self.entries[path]
            if accepted and under_accepted(path):
                continue  # what the accepted binding holds: taken afresh below
            new = now.get(path, _MISSING)
            if isinstance(old, _Contents) and isinstance(new, _Contents):
                if not old.same(new):
                    changed.append(path)
            elif old is not new and not _equal_value(old, new):
                if not _unset(old) and self.owns(path):  # unset ones: reset_lazy's
                    accepted.append(path)
                else:
                    changed.append(path)
        added = now.keys() - self.entries.keys()
        shadows = []
        for path in added:
            owner, _, name = path.rpartition(".")
            if isinstance(now.get(owner), type(sys)) and not name.startswith("__") and hasattr(builtins, name):
                shadows.append(path)
        changed.extend(sorted(shadows))
        if not changed:
            if accepted:  # the snapshot takes them (and what they hold) as they are now
                mine = set(accepted)
                for path in [p for p in self.entries if p in mine or under_accepted(p)]:
                    del self.entries[path]
                self.entries.update((p, v) for p, v in now.items() if p in mine or under_accepted(p))
            self.entries.update((p, now[p]) for p in added)
            self._index(set(dirty))
        return changed
