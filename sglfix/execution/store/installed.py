"""Digests of installed packages' files, by content: what a stored result keys the third-party
packages its worker imported on (Triton, torch, ...), so that a package edited in place at the
same version, rebuilt or reinstalled makes the results of the processes that imported it miss,
and a package no worker imported changes nothing.

Hashing Triton and torch is 1.7 GB of reading; each file's digest is kept in a memo beside the
other caches of sglfix (``file-digests.sqlite``), keyed by the file's device and inode, and read
again only when its size, modification or change time differs. The digests themselves are of
content, so stores shared between machines agree. A memo that cannot be opened only costs time:
the files are hashed again.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sqlite3
import sys
import threading
from collections.abc import Iterable

__all__ = ["Installed", "open_memo"]

# A file by device and inode (a link and its file are one), with its size, mtime and ctime then.
_SCHEMA = "CREATE TABLE IF NOT EXISTS files (file TEXT PRIMARY KEY, stat TEXT NOT NULL, digest TEXT NOT NULL)"


def open_memo(path: str, schema: str) -> sqlite3.Connection | None:
    """A memo file beside sglfix's caches, shared by every process of the machine (WAL, autocommit,
    waiting on a writer); None when it cannot be opened: a memo only saves time."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(schema)
        return conn
    except (sqlite3.Error, OSError):
        return None


def _memo_path() -> str:
    from sglfix.common import cachedir

    return cachedir.file_digests()


def _files(place: str) -> list[tuple[str, str]]:
    """(path below ``place``, path) of every file under a folder (``__pycache__`` left out), in
    a fixed order; a file is itself."""
    if not os.path.isdir(place):
        return [(os.path.basename(place), place)]
    out = []
    for folder, dirs, names in os.walk(place):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            path = os.path.join(folder, name)
            out.append((os.path.relpath(path, place), path))
    return out


class Installed:
    """One run's digests of installed locations (a package's folders, or a module's file)."""

    def __init__(self, memo: str | None = None) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[str, ...], str | None] = {}
        self._known: dict[str, tuple[str, str]] | None = None  # the memo, read once
        self._conn: sqlite3.Connection | None = open_memo(memo or _memo_path(), _SCHEMA)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def locate(self, name: str) -> list[str] | None:
        """Where a worker would import the top-level module ``name`` from (its package's folders,
        or its file); None when it is not importable. A worker's path has no current folder
        (``python -P``): neither has this search."""
        here = os.getcwd()
        path = [p for p in sys.path if p and os.path.abspath(p) != here]
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            for finder in sys.meta_path:
                if spec is not None:
                    break
                if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, None)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if spec.submodule_search_locations:
            return sorted({os.path.abspath(p) for p in spec.submodule_search_locations})
        return [os.path.abspath(spec.origin)] if spec.origin and os.path.exists(spec.origin) else None

    def digest(self, places: Iterable[str]) -> str | None:
        """The digest of every file under ``places`` (folders walked, ``__pycache__`` left out),
        by path below each place and content; None when one cannot be read."""
        key = tuple(sorted(places))
        with self._lock:
            if key in self._done:
                return self._done[key]
        try:
            found = self._digest(key)
        except OSError:
            found = None
        with self._lock:
            self._done[key] = found
        return found

    def _digest(self, places: tuple[str, ...]) -> str:
        h = hashlib.sha256()
        memo = self._memo()
        fresh = []
        for place in places:
            for rel, path in _files(place):
                st = os.stat(path)  # through a link: the file itself
                ident, stat = f"{st.st_dev}:{st.st_ino}", f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
                known = memo.get(ident)
                if known is not None and known[0] == stat:
                    digest = known[1]
                else:
                    with open(path, "rb") as fh:
                        digest = hashlib.file_digest(fh, "sha256").hexdigest()
                    fresh.append((ident, stat, digest))
                h.update(f"{rel}\0{digest}\n".encode())
        self._remember(fresh)
        return h.hexdigest()

    def _memo(self) -> dict[str, tuple[str, str]]:
        with self._lock:
            if self._known is None:
                self._known = {}
                if self._conn is not None:
                    try:
                        rows = self._conn.execute("SELECT file, stat, digest FROM files").fetchall()
                        self._known = {p: (s, d) for p, s, d in rows}
                    except sqlite3.Error:
                        pass
            return self._known

    def _remember(self, rows: list[tuple[str, str, str]]) -> None:
        if not rows:
            return
        with self._lock:
            if self._known is not None:
                self._known.update((p, (s, d)) for p, s, d in rows)
            if self._conn is None:
                return
            try:
                self._conn.execute("BEGIN")
                self._conn.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?)", rows)
                self._conn.execute("COMMIT")
            except sqlite3.Error:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
