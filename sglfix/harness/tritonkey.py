"""Triton's own key, computed once per Triton install instead of once per worker process.

Before a process compiles or loads its first Triton kernel, ``triton.runtime.cache.triton_key()``
hashes Triton's compiler, backends and language sources and its whole ``libtriton`` library:
0.41 s on the H100 machine (``bench/results/first-use-h100.json``), paid by every worker inside
its first cells. The value depends only on those files and Triton's version, so a worker reads it
from a memo in sglfix's cache folder, keyed by the install's folder and checked at each use
against the size, modification time and inode of every file under the folders Triton hashes (a
superset of what it reads): an upgraded, rebuilt or edited Triton misses and is hashed again.
Triton hands its key to its own helper processes the same way (they get the parent's value).
Anything unexpected (no such function, a memo that cannot be read or written) leaves Triton as
it is: the memo only ever saves time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys

__all__ = ["fingerprint", "remember_triton_key"]

# What triton_key() reads, relative to the triton package folder: these folders whole (and the
# runtime's cache module, which holds the function itself).
_HASHED = ("compiler", "backends", "language", "_C", os.path.join("runtime", "cache.py"))
_MARK = "_sglfix_memo"


def fingerprint(root: str, version: str) -> str | None:
    """A digest of ``version`` and the size, mtime and inode of every file Triton's key may read
    under ``root``; None when one cannot be read."""
    h = hashlib.sha256(version.encode())
    try:
        for rel in _HASHED:
            top = os.path.join(root, rel)
            paths = [top] if os.path.isfile(top) else []
            for folder, dirs, files in os.walk(top):
                dirs.sort()
                paths += [os.path.join(folder, f) for f in sorted(files)]
            for path in paths:
                st = os.stat(path)
                h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    except OSError:
        return None
    return h.hexdigest()


def _memo_path(root: str) -> str:
    from sglfix.common import cachedir

    where = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]
    return os.path.join(cachedir.triton_key(), f"{where}.json")


def _read(path: str, print_: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("fingerprint") != print_ or not isinstance(entry.get("key"), str):
        return None
    return entry["key"]


def _write(path: str, print_: str, key: str) -> None:
    from sglfix.common.atomic import write_atomic

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Whole or not at all: a worker beside this one may be reading. Not synced: an entry is
        # checked at each read, so one a crash of the machine cut short is a miss.
        write_atomic(path, json.dumps({"fingerprint": print_, "key": key}), fsync=False)
    except OSError:
        pass


def remember_triton_key() -> str | None:
    """Install the memo in this process (before its first kernel): "memo" when the key came from
    it, "computed" when it was hashed here and stored, None when Triton was left as it is."""
    cache = sys.modules.get("triton.runtime.cache")
    if cache is None:
        try:
            import triton.runtime.cache as cache
        except ImportError:
            return None
    real = getattr(cache, "triton_key", None)
    if real is None or getattr(real, _MARK, False) or not callable(getattr(real, "__wrapped__", None)):
        return None  # not the lru-cached function of the Triton releases this reads
    import triton

    root = os.path.dirname(os.path.abspath(triton.__file__))
    print_ = fingerprint(root, str(getattr(triton, "__version__", "")))
    if print_ is None:
        return None
    path = _memo_path(root)
    key, how = _read(path, print_), "memo"
    if key is None:
        key, how = real(), "computed"
        _write(path, print_, key)

    @functools.lru_cache
    def triton_key() -> str:
        return key

    setattr(triton_key, _MARK, True)
    # Every module that holds Triton's function by name (the runtime's cache, the autotuner).
    for name, module in list(sys.modules.items()):
        if (name == "triton" or name.startswith("triton.")) and getattr(module, "triton_key", None) is real:
            module.triton_key = triton_key
    return how
