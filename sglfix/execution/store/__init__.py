"""The result store: a cell's result kept and served again while nothing it depends on changed.

An entry is filed under the cell's key (``keys``: the machine, the device, the environment,
sglfix's judge, the profile, the scenario, the toggle set's patches) and lists the code base's
files it depends on, each with a digest (``fingerprint``): every file the cell ran code of, by
content; every other file its worker had imported, by its import-time skeleton. An entry is
served only when every one of those digests still holds, so an edit to a file a cell ran re-runs
that cell, and an edit inside a function no cell entered re-runs nothing.

What is never stored: ERROR, TIMEOUT and FAULT (sglfix or the machine failed, not a finding),
a cell whose record of executed code is incomplete, and cells run with ``--record``.
A NOT_REACHED cell depends on its scenario's baseline: it is filed with the baseline's files.

The store is one SQLite file in a folder (``--cache DIR``; default ``SGLFIX_STORE`` or the user
cache folder): shards and CI jobs may share it, entries are written as results come back (by a
thread of its own, so that digests and parses never hold up the workers), and a file that
cannot be opened turns the store off for the run with one line, never the run itself.
"""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglfix.execution.store.fingerprint import content_digest, skeleton_digest
from sglfix.harness.result import CellResult

__all__ = ["NOT_STORED", "STORE_ENV", "ResultStore", "default_dir", "store_disabled_by_env"]

# Verdicts that say sglfix or the machine failed: a rerun may answer otherwise.
NOT_STORED = frozenset({"ERROR", "TIMEOUT", "FAULT"})
STORE_ENV = "SGLFIX_STORE"
_FILE = "results.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, ran TEXT NOT NULL, imports TEXT NOT NULL, record TEXT,
    result TEXT NOT NULL, stored TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS imports (id TEXT PRIMARY KEY, files TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS skeletons (content TEXT PRIMARY KEY, skeleton TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contexts (id TEXT PRIMARY KEY, parts TEXT NOT NULL, info TEXT);
"""


def default_dir() -> str:
    env = os.environ.get(STORE_ENV)
    if env:
        return env
    from sglfix.codebases.releases import cache_root

    return str(cache_root() / "results")


def store_disabled_by_env() -> bool:
    return os.environ.get(STORE_ENV, "").strip().lower() in ("0", "off", "no", "false")


class _Files:
    """Current digests of the code base's files below ``top``, each read once per run."""

    def __init__(self, top: str, db: _Db) -> None:
        self.top, self.db = top, db
        self._content: dict[str, str | None] = {}
        self._skeleton: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def _read(self, rel: str) -> bytes | None:
        path = os.path.join(self.top, rel)
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def _once(self, memo: dict[str, str | None], rel: str, make: Any) -> str | None:
        with self._lock:
            if rel in memo:
                return memo[rel]
        digest = make(rel)
        with self._lock:
            memo[rel] = digest
        return digest

    def content(self, rel: str) -> str | None:
        return self._once(self._content, rel, self._content_of)

    def skeleton(self, rel: str) -> str | None:
        return self._once(self._skeleton, rel, self._skeleton_of)

    def _content_of(self, rel: str) -> str | None:
        data = self._read(rel)
        return None if data is None else content_digest(data)

    def _skeleton_of(self, rel: str) -> str | None:
        data = self._read(rel)
        if data is None:
            return None
        whole = content_digest(data)
        with self._lock:
            self._content.setdefault(rel, whole)
        digest = self.db.skeleton(whole)
        if digest is None:
            digest = skeleton_digest(data, path=rel)
            self.db.put_skeleton(whole, digest)
        return digest


class _Db:
    """The SQLite file, one connection shared under a lock (lookups in the caller's thread,
    writes in the store's)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        with self.lock:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.executescript(_SCHEMA)

    def one(self, sql: str, args: Sequence[Any]) -> Any:
        with self.lock:
            return self.conn.execute(sql, tuple(args)).fetchone()

    def write(self, sql: str, args: Sequence[Any]) -> None:
        with self.lock:
            self.conn.execute(sql, tuple(args))

    def skeleton(self, content: str) -> str | None:
        row = self.one("SELECT skeleton FROM skeletons WHERE content = ?", (content,))
        return row[0] if row else None

    def put_skeleton(self, content: str, skeleton: str) -> None:
        self.write("INSERT OR REPLACE INTO skeletons VALUES (?, ?)", (content, skeleton))

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class ResultStore:
    """One run's view of a store folder: ``get`` before cells run, ``put`` as results arrive,
    ``close`` at the end (waits for the writes unless the run was cut short)."""

    def __init__(self, directory: str, *, context: str, parts: dict, top: str) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory))
        os.makedirs(self.directory, exist_ok=True)
        self.context = context
        self.db = _Db(Path(self.directory) / _FILE)
        self.db.write("INSERT OR IGNORE INTO contexts VALUES (?, ?, NULL)", (context, json.dumps(parts)))
        self.files = _Files(top, self.db)
        self._imports_ok: dict[str, bool] = {}
        self._listed: dict[str, list[str]] = {}  # a worker's digest of its imported list -> the list
        self._imports_of: dict[str, str] = {}  # that digest -> the imports entry made of it
        self.served = 0
        self.stored = 0
        self._failed: str | None = None  # set before the writer starts: it reads it
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="sglfix-store", daemon=True)
        self._writer.start()

    # -- reading ----------------------------------------------------------------------------------

    def get(self, key: str, *, record: Sequence[str] | None = None, reachability: bool = True) -> Any:
        """``(result, deps)`` of the entry under ``key`` if every file it lists is as it was
        (``record``: the targets a baseline must have recorded entries of); else None."""
        row = self.db.one("SELECT ran, imports, record, result, stored FROM entries WHERE key = ?", (key,))
        if row is None:
            return None
        ran_json, imports_id, record_json, result_json, stored = row
        result = CellResult.from_json(json.loads(result_json))
        if result.verdict == "NOT_REACHED" and not reachability:
            return None  # a run of every cell wants each one run
        if record:
            had = set(json.loads(record_json)) if record_json else None
            if had is None or result.reached is None or not set(record) <= had:
                return None
        ran = json.loads(ran_json)
        if not self._imports_hold(imports_id):
            return None
        if any(self.files.content(rel) != digest for rel, digest in ran.items()):
            return None
        result.stored = stored
        self.served += 1
        return result, (ran, imports_id)

    def _imports_hold(self, imports_id: str) -> bool:
        if imports_id not in self._imports_ok:
            row = self.db.one("SELECT files FROM imports WHERE id = ?", (imports_id,))
            ok = row is not None and all(self.files.skeleton(rel) == d for rel, d in json.loads(row[0]).items())
            self._imports_ok[imports_id] = ok
        return self._imports_ok[imports_id]

    def info(self) -> dict | None:
        row = self.db.one("SELECT info FROM contexts WHERE id = ?", (self.context,))
        return json.loads(row[0]) if row and row[0] else None

    # -- writing ----------------------------------------------------------------------------------

    def keep_info(self, info: dict) -> None:
        """What the workers said of themselves, for a later run that starts none."""
        kept = {k: v for k, v in info.items() if k not in ("workers", "kept", "executor", "mps")}
        self._queue.put(("info", kept))

    def put(self, key: str, result: CellResult, *, deps: Any, record: Sequence[str] | None = None) -> None:
        """File ``result`` under ``key``: ``deps`` is the worker's record (``CellResult.deps``)
        or, for a NOT_REACHED cell, what its baseline's entry depends on."""
        if result.verdict in NOT_STORED or deps is None:
            return
        self._queue.put(("put", key, result.to_json(), deps, tuple(record) if record else None))

    def deps_of(self, worker_deps: dict | None) -> Any:
        """A worker's record as the store files it (``(ran, imports)``), made on the writer
        thread; here only the imported list is remembered under its digest."""
        if worker_deps is None:
            return None
        listed = worker_deps.get("imported")
        if listed is not None:
            self._listed[worker_deps["imports"]] = list(listed)
        if worker_deps["imports"] not in self._listed:
            return None  # the list came in a reply that was lost: not stored
        return ("worker", list(worker_deps["ran"]), worker_deps["imports"])

    def _resolve(self, deps: Any) -> tuple[dict, str] | None:
        if deps[0] != "worker":
            return deps
        _, ran_files, digest = deps
        ran = {}
        for rel in ran_files:
            d = self.files.content(rel)
            if d is None:
                return None
            ran[rel] = d
        imports_id = self._imports_of.get(digest)
        if imports_id is None:
            files = {}
            for rel in self._listed[digest]:
                d = self.files.skeleton(rel)
                if d is None:
                    return None
                files[rel] = d
            imports_id = content_digest(json.dumps(files, sort_keys=True).encode())
            self.db.write("INSERT OR IGNORE INTO imports VALUES (?, ?)", (imports_id, json.dumps(files)))
            self._imports_of[digest] = imports_id
        return ran, imports_id

    def _write_loop(self) -> None:
        import datetime

        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._failed is not None:
                    continue
                if item[0] == "info":
                    self.db.write("UPDATE contexts SET info = ? WHERE id = ?", (json.dumps(item[1]), self.context))
                    continue
                _, key, result, deps, record = item
                resolved = self._resolve(deps)
                if resolved is None:
                    continue
                ran, imports_id = resolved
                result = {k: v for k, v in result.items() if k not in ("deps", "stored")}
                stored = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
                self.db.write(
                    "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        key,
                        json.dumps(ran),
                        imports_id,
                        json.dumps(record) if record else None,
                        json.dumps(result),
                        stored,
                    ),
                )
                self.stored += 1
            except (sqlite3.Error, OSError) as exc:
                self._failed = f"{type(exc).__name__}: {exc}"
            finally:
                self._queue.task_done()

    @property
    def failed(self) -> str | None:
        """Why writing stopped, if it did (the run's results stand; the store misses them)."""
        return self._failed

    def close(self, *, wait: bool = True) -> None:
        if wait:
            self._queue.put(None)
            self._writer.join()
        else:
            # Cut short: what is queued is dropped, the entry being written finishes.
            while True:
                try:
                    self._queue.get_nowait()
                    self._queue.task_done()
                except queue.Empty:
                    break
            self._queue.put(None)
            self._writer.join(timeout=10)
        self.db.close()
