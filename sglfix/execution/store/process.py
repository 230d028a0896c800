"""What a worker's process ran, as the result store keys a cell's result on it (the worker's side
of ``sglfix.execution.store``; the parent turns these names into digests).

A cell's record names, function by function (``path::qualified name``), the code of the code
base that can have made its result:

* **the boot**: every function the worker's imports ran (``entered.record_boot``), a helper that
  computes a constant at import included; the same for every cell of the process;
* **the cell**: every function the cell itself ran; lazily filled module state and
  ``lru_cache`` caches that were empty after the boot are emptied before each cell (the
  worker's session does it, with ``lru_caches`` and the snapshot's ``reset_lazy``), so a cell
  that uses a cached value computes it, and names the code that does, as the first cell of a
  fresh worker would;
* **what earlier cells of the process left**: a function an earlier cell ran is carried into
  every later cell's record when its code can leave state behind (it rebinds a global or a
  closure's variable, or stores into, or calls a mutating method of, an object reached from a
  global, a closure or ``cls``, or the ``self`` of an object a module holds:
  ``shared_classes``), and every function that ran under a module's import during a cell (its
  import-time calls may fill state later cells read; ``tracing.watch_imports`` tells them apart).

So an edit to a function re-runs the cells that ran it, the cells of a process whose boot ran it
and the cells after one that ran it where it could have left state, not every cell of a process
that once ran it. What this does not see is state left deeper than the code that left it shows
(an object's field set through a local alias of a global); ``--verify-store`` re-runs served
cells to catch what any such rule misses.

The process record (``proc``) also lists the code base's files the process imported, each with
its size and modification time as the worker found them (the parent stores a result only when
the file it digests is the one the worker loaded: a file edited during the run is not stored),
the top-level packages it imported from elsewhere than the standard library, sglfix and the code
base (the parent digests their installed files: only the distributions a process imported are in
its key), and the top-level modules it looked for and did not find.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import json
import os
import re
import sys
import types
from typing import Any

__all__ = ["ProcessRecord", "leaves_state", "lru_caches", "shared_classes"]

# A reverted or patched function's code names a folder of its file's name (sglfix.patching).
_PATCHED_AT = re.compile(r"[/\\]\[sglfix [^\]]*\](?=[/\\])")
# Methods that change the container they are called on (a registry, a memo, the environment).
_MUTATORS = frozenset(
    {
        "append",
        "appendleft",
        "extend",
        "extendleft",
        "insert",
        "add",
        "update",
        "setdefault",
        "pop",
        "popitem",
        "remove",
        "discard",
        "clear",
        "register",
        "__setitem__",
        "__delitem__",
        "__setattr__",
    }
)
_CO_NEWLOCALS = 0x2  # set for a function's code; a module's or class body's has it clear


def _shared_base(ins: list, j: int, code: types.CodeType, own: str | None = None) -> bool:
    """Whether the value the instruction at ``j`` leaves is reached from state that outlives a
    call: a global, a closure's variable, a class method's ``cls``, an object's ``__class__``
    (through any chain of attribute loads), or ``own`` (the ``self`` of an object that lives in
    a module's globals)."""
    via_class = False
    while j >= 0 and ins[j].opname in ("LOAD_ATTR", "LOAD_METHOD"):
        via_class = via_class or ins[j].argval == "__class__"
        j -= 1
    if j < 0:
        return False
    op, name = ins[j].opname, ins[j].argval
    if op in ("LOAD_GLOBAL", "LOAD_NAME"):
        return True
    if op in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        return name in code.co_freevars
    return op.startswith("LOAD_FAST") and (via_class or name == "cls" or name == own)


def leaves_state(code: types.CodeType, *, shared_self: bool = False) -> bool:
    """Whether ``code`` can leave state that a later call reads (see the module's docstring);
    ``shared_self``: its first argument is an object that outlives the call (a method of a class
    with an instance in a module's globals)."""
    try:
        ins = list(dis.get_instructions(code))
    except Exception:  # unreadable bytecode: assume the worst
        return True
    own = code.co_varnames[0] if shared_self and code.co_argcount else None
    for i, x in enumerate(ins):
        op = x.opname
        if op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            return True
        if op in ("STORE_DEREF", "DELETE_DEREF") and x.argval in code.co_freevars:
            return True
        if op in ("STORE_ATTR", "DELETE_ATTR") and _shared_base(ins, i - 1, code, own):
            return True
        if op in ("STORE_SUBSCR", "DELETE_SUBSCR") and i >= 2 and _shared_base(ins, i - 2, code, own):
            return True
        if op in ("LOAD_METHOD", "LOAD_ATTR") and x.argval in _MUTATORS and _shared_base(ins, i - 1, code, own):
            return True
    return False


def shared_classes(values: Any, package: str) -> set[tuple[str, str]]:
    """(file, qualified name) of each class of ``package`` that has an instance among ``values``
    (module and class attributes): its methods' ``self`` outlives a cell."""
    found = set()
    for value in values:
        kind = type(value)
        module = getattr(kind, "__module__", None)
        if not isinstance(module, str) or not (module == package or module.startswith(package + ".")):
            continue
        if isinstance(value, (type, types.ModuleType, types.FunctionType)):
            continue
        path = getattr(sys.modules.get(module), "__file__", None)
        if isinstance(path, str):
            found.add((path, kind.__qualname__))
    return found


def lru_caches(values: Any) -> list:
    """The ``functools.lru_cache`` wrappers among ``values`` (module and class attributes), through
    static and class methods, properties and ``functools.wraps`` chains."""
    found: dict[int, Any] = {}

    def visit(value: Any, depth: int = 0) -> None:
        if depth > 8:
            return
        if isinstance(value, (staticmethod, classmethod)):
            visit(value.__func__, depth + 1)
        elif isinstance(value, property):
            for accessor in (value.fget, value.fset, value.fdel):
                if accessor is not None:
                    visit(accessor, depth + 1)
        elif isinstance(value, functools._lru_cache_wrapper):
            found[id(value)] = value
            visit(getattr(value, "__wrapped__", None), depth + 1)
        elif isinstance(value, types.FunctionType):
            inner = value.__dict__.get("__wrapped__")
            if inner is not None:
                visit(inner, depth + 1)

    for value in values:
        visit(value)
    return list(found.values())


def _stdlib_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The standard library's folders, and the site folders that may lie inside them."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    std = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    sites = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    try:
        sites.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:
        pass
    return tuple(p + os.sep for p in std), tuple(p + os.sep for p in sites)


class ProcessRecord:
    """One worker's record, kept across its cells (the module's docstring)."""

    def __init__(self, *, package: str, root: str | None, boot: list | None, shared: Any = frozenset()) -> None:
        self.package, self.root = package, root
        self.top = os.path.dirname(root) if root else None
        # "rel::Class" of every class with an instance in a module's globals (``shared_classes``).
        self._shared = {f"{rel}::{qual}" for path, qual in shared if (rel := self._rel(path)) is not None}
        self._info: dict[int, tuple[Any, Any]] = {}  # id(code) -> (code, what it is): codes kept alive
        self.boot: list[str] | None = None
        if boot is not None and root is not None:
            self.boot = sorted({n for c in boot if (n := self._function(c)) is not None})
        self._carried: dict[str, None] = {}
        self._stat: dict[str, list[int]] = {}
        self._roots: tuple[int, dict] = (-1, {})
        self._sent: str | None = None
        self._made: tuple[tuple, tuple[dict, str]] | None = None  # _process's last answer, by its key
        self._sglfix = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
        self._std = _stdlib_dirs()
        self._imported()  # the files as the boot loaded them, before any cell runs

    def _imported(self) -> dict[str, list[int]] | None:
        """The code base's files this process imported, each with its size and modification time
        when this record first saw it imported (None: one cannot be read)."""
        if self.root is None:
            return None
        imported = {}
        for m in list(sys.modules.values()):
            path = getattr(m, "__file__", None)
            if not isinstance(path, str) or (rel := self._rel(path)) is None:
                continue
            if rel not in self._stat:
                assert self.top is not None  # a path under root was found, so root is set
                try:
                    st = os.stat(os.path.join(self.top, rel))
                except OSError:
                    return None
                self._stat[rel] = [st.st_mtime_ns, st.st_size]
            imported[rel] = self._stat[rel]
        return dict(sorted(imported.items()))

    # -- what a code object is ------------------------------------------------------------------

    def _rel(self, filename: str) -> str | None:
        path = _PATCHED_AT.sub("", filename)
        if not self.root or not path.startswith(self.root + os.sep):
            return None
        return os.path.relpath(path, self.top)

    def _what(self, code: Any) -> Any:
        """None (not the code base's), ``("module", rel)`` (a module's body), ``("import", rel)``
        (a class body or a module-level lambda: its file's skeleton) or ``(name, state)``."""
        held = self._info.get(id(code))
        if held is not None and held[0] is code:
            return held[1]
        what: Any = None
        rel = self._rel(getattr(code, "co_filename", ""))
        if rel is not None:
            qual = getattr(code, "co_qualname", code.co_name)
            head = qual.split(".<locals>", 1)[0]
            if code.co_name == "<module>":
                what = ("module", rel)
            elif any(part.startswith("<") for part in head.split(".")) or not code.co_flags & _CO_NEWLOCALS:
                what = ("import", rel)
            else:
                owner = f"{rel}::{head.rpartition('.')[0]}"
                what = (f"{rel}::{head}", leaves_state(code, shared_self=owner in self._shared))
        self._info[id(code)] = (code, what)
        return what

    def _function(self, code: Any) -> str | None:
        what = self._what(code)
        return what[0] if what is not None and what[0] not in ("module", "import") else None

    # -- a cell's record ------------------------------------------------------------------------

    def cell(self, codes: list | None, imported: list | None = None) -> dict | None:
        """What the store keys this cell's result on (the module's docstring); None when a record
        is incomplete (nothing is stored then). ``imported``: what ran under the imports the
        cell made, recorded apart. Call once per cell, in order."""
        if codes is None or self.boot is None or self.root is None:
            return None
        ran: dict[str, None] = dict(self._carried)
        at_import: dict[str, None] = {}
        for code in imported or ():
            name = self._function(code)
            if name is not None:
                at_import[name] = None
        tainted = False
        for code in codes:
            what = self._what(code)
            if what is None:
                continue
            if what[0] == "module":
                tainted = True  # a module body run outside the watched import: not told apart
            elif what[0] != "import":
                ran[what[0]] = None
                if what[1]:
                    self._carried[what[0]] = None
        ran.update(at_import)
        # What ran under an import made state this process keeps: every later cell names it.
        self._carried.update(at_import)
        if tainted:
            self._carried.update((n, None) for n in ran)
        made = self._process()
        if made is None:
            return None
        proc, digest = made
        out: dict[str, Any] = {"ran": sorted(ran), "process": digest}
        if digest != self._sent:
            out["proc"] = proc
            self._sent = digest
        return out

    def _process(self) -> tuple[dict, str] | None:
        """The process's record and its digest; made again only when modules were imported or
        looked for in vain since the last cell (as ``_imported_roots``: most cells import nothing)."""
        from sglfix.execution.entered import absent_modules

        absent = absent_modules()
        if absent is None:
            return None
        key = (len(sys.modules), tuple(absent))
        if self._made is not None and self._made[0] == key:
            return self._made[1]
        imported = self._imported()
        if imported is None:
            return None
        proc = {
            "boot": self.boot,
            "imported": imported,
            "roots": self._imported_roots(len(sys.modules)),
            "absent": absent,
        }
        made = (proc, hashlib.sha256(json.dumps(proc, sort_keys=True).encode()).hexdigest()[:32])
        self._made = (key, made)
        return made

    def _imported_roots(self, count: int) -> dict[str, list[str]]:
        """Top-level package -> its folders (or module -> its file), for every one imported from
        outside the standard library, sglfix and the code base; remade when modules were added."""
        if self._roots[0] == count:
            return self._roots[1]
        std, sites = self._std
        skip = self.package.split(".")[0]
        out: dict[str, list[str]] = {}
        for name in sorted({n.partition(".")[0] for n in list(sys.modules)}):
            module = sys.modules.get(name)
            if module is None or name in (skip, "sglfix", "__main__") or name.startswith("__editable__"):
                continue
            where = getattr(module, "__path__", None)
            places = list(where) if where is not None else [getattr(module, "__file__", None)]
            kept = []
            for place in places:
                if not isinstance(place, str) or not place:
                    continue
                real = os.path.realpath(place)
                probe = real + (os.sep if os.path.isdir(real) else "")
                if probe.startswith(std) and not probe.startswith(sites):
                    continue
                if os.path.abspath(place).startswith(self._sglfix) or probe.startswith(self._sglfix):
                    continue
                kept.append(os.path.abspath(place))
            if kept:
                out[name] = sorted(set(kept))
        self._roots = (count, out)
        return out
