"""The result store: a cell's result kept and served again while nothing it depends on changed.

An entry is filed under the cell's key (``keys``: the machine, the device, the interpreter and
its flags, the environment, sglfix's judge, the profile, the scenario, the toggle set's patches)
with what its worker's process ran (``process``, made on the worker's side): each function of
the code base that the cell ran, that the process's boot ran, or that an earlier cell of the
process ran where it can leave state behind, by the digest of that function's code
(``fingerprint``); every file of the code base the process imported, by its import-time
skeleton; every third-party package it imported, by its installed files (``installed``); the
top-level modules it looked for and did not find. An entry is served only when all of that still
holds: an edit inside one function re-runs the cells whose record names it, an edit to code that
runs at import re-runs the cells of every process that imported it, an upgraded or edited Triton
re-runs the cells of processes that imported Triton, and installing an unrelated package re-runs
nothing (a package a cell looked for and did not find, installed now, re-runs that cell).

Why a record per cell, and not everything the process ran since boot: a worker runs cells of
every scenario one after another, so after a few cells its cumulative record names nearly every
function, and any one-function edit would re-run nearly every cell. A process's earlier cells
can only reach a later one through state they leave behind; that state is put back between cells
where sglfix can (lazy module state, caches the boot left empty) and, where it cannot, the code
that can leave it is carried into every later cell's record (``process``'s docstring says
which). Measured (``bench/results/store-cpu.json``): one statement put into
``TritonAttnBackend.forward_decode`` re-runs 350 of the reproduction's 3875 cells and 170 of real
sglang's 1260, every served verdict that of a run without the store. The price is a record of the
boot: the C profiler over a worker's imports, about 1.5 s more of a real-sglang worker's 8 s boot
on the CPU box (nothing measurable for the reproduction). ``--verify-store N`` re-runs N served
cells and fails the run on any difference: the check on this reasoning, and on anything it misses.

A cell has as many entries as states it was run in (a few per cell, the newest kept): undoing an
edit is served again. What is never stored: a result a re-run could change (ERROR, TIMEOUT,
FAULT; a finding of a library that could not be loaded or mapped, or of a dependency that could
not be imported; ``unstorable``), a cell whose record of executed code is incomplete, a result
made from a file edited while the run ran (the file the parent digests is not the one the
worker loaded), and cells run with ``--reach-file``. A NOT_REACHED cell depends on its scenario's
baseline: it is filed with the baseline's record. A row that cannot be read (bad JSON, a verdict
that is none, a result of another cell) is a miss, dropped from the store.

The store is one SQLite file in a folder (``--cache DIR``; default ``SGLFIX_STORE`` or the user
cache folder): shards and CI jobs may share it, entries are written as results come back (by a
thread of its own, so that digests and parses never hold up the workers), and a file that
cannot be opened turns the store off for the run with one line, never the run itself. The
folder says which schema wrote it, and is tagged for backup tools to skip (``folder``: a folder
of another schema is emptied, never misread; ``sglfix cache show | prune | clear``). Each entry
keeps when it was written and when a run was last served it (what ``prune`` ages it by). Runs
reach the store through ``layer``: a layer around the worker pool, with the pool's interface.
"""

from __future__ import annotations

import json
import os
import queue
import re
import sqlite3
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from sglfix.common.environ import envs
from sglfix.common.errors import SglfixError
from sglfix.common.verdicts import MARKS, worst
from sglfix.execution.store.fingerprint import content_digest, file_digests, read_digests
from sglfix.execution.store.folder import RESULTS_FILE, SCHEMA, prepare_folder
from sglfix.execution.store.parsed import ParsedMemo
from sglfix.harness.result import CellResult

__all__ = [
    "NOT_STORED",
    "STORE_ENV",
    "ResultStore",
    "StoreMismatch",
    "default_dir",
    "store_disabled_by_env",
    "stored_cells_naming",
    "unstorable",
]

# Verdicts that say sglfix or the machine failed: a rerun may answer otherwise.
NOT_STORED = frozenset({"ERROR", "TIMEOUT", "FAULT"})
STORE_ENV = envs.SGLFIX_STORE.name
_FILE = RESULTS_FILE
_VERSION = SCHEMA  # the file's layout (PRAGMA user_version) too: another one is emptied and remade
_KEPT = 8  # entries kept per cell: the newest
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT NOT NULL, process TEXT NOT NULL, ran TEXT NOT NULL, record TEXT,
    result TEXT NOT NULL, stored TEXT NOT NULL, used TEXT, PRIMARY KEY (key, process, ran));
CREATE TABLE IF NOT EXISTS processes (id TEXT PRIMARY KEY, parts TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rans (id TEXT PRIMARY KEY, functions BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS files (content TEXT PRIMARY KEY, digests TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contexts (id TEXT PRIMARY KEY, parts TEXT NOT NULL, info TEXT);
"""
_OLD_TABLES = ("entries", "imports", "skeletons", "processes", "rans", "files")  # any layout's

# Exceptions and messages of a failure to load code or map memory: the machine's state at that
# moment (a library that could not be mapped, a dependency that failed to import), not the code's.
_TRANSIENT_TYPES = frozenset(
    {
        "ImportError",
        "ModuleNotFoundError",
        "OSError",
        "MemoryError",
        "FileNotFoundError",
        "PermissionError",
        "BlockingIOError",
        "InterruptedError",
        "ConnectionError",
        "BrokenPipeError",
        "TimeoutError",
    }
)
_TRANSIENT_TEXT = re.compile(
    r"shared object|failed to map|cannot map|undefined symbol|dlopen|cannot allocate memory|"
    r"out of memory|resource temporarily unavailable|no space left|too many open files|"
    r"failed to load|could not load|unable to load|cannot import name",
    re.IGNORECASE,
)
# A finding that names a line of the code (a crash's frame): the functions of the files it
# names are keyed on their positioned digests (an edit that moves their lines re-runs it), the
# rest on their plain ones.
_CITES_LINE = re.compile(r"([^\s\[\]()<>,:'\"]+\.py):\d+")


# torch's words for an allocation it could not make, with its size.
_ASKED = re.compile(r"tried to allocate (\d+) bytes")


def _beyond_cap(message: str) -> bool:
    """An allocation larger than a CPU worker's whole address-space cap (``devices.memory_cap``,
    the same on every run of this machine and settings): refused every time, not for want of
    free memory now."""
    from sglfix.execution.devices import memory_cap

    asked, cap = _ASKED.search(message), memory_cap()
    return asked is not None and cap is not None and int(asked.group(1)) > cap


class StoreMismatch(SglfixError):
    """``--verify-store`` found a served result that a fresh run does not give."""

    exit_code = 1


def default_dir() -> str:
    from sglfix.common import cachedir

    return cachedir.results()


def store_disabled_by_env() -> bool:
    return (envs.SGLFIX_STORE.raw() or "").strip().lower() in ("0", "off", "no", "false")


def unstorable(result: CellResult) -> str | None:
    """Why ``result`` is not stored (a re-run could change it), or None."""
    if result.verdict in NOT_STORED:
        return f"{result.verdict} is sglfix's or the machine's failure"
    for f in result.findings:
        if not isinstance(f, dict):
            return "a finding that is not a record"
        if f.get("verdict") in NOT_STORED:
            return f"a finding of {f['verdict']}"
        if f.get("out_of_memory"):
            return "out of memory"
        if f.get("type") in _TRANSIENT_TYPES:
            return f"{f['type']}: a failure to load or to reach the machine's resources"
        if _TRANSIENT_TEXT.search(str(f.get("message", ""))) and not _beyond_cap(str(f.get("message", ""))):
            return "a library or a dependency that could not be loaded"
    return None


def stored_cells_naming(
    directory: str, functions: Sequence[str], *, placed_only: bool = False
) -> set[tuple[str, tuple[str, ...]]]:
    """(scenario, toggles) of every cell whose newest entry in the store at ``directory`` names
    one of ``functions`` (``path::qualified name``, as a process record names them) among what
    it ran (``placed_only``: and is keyed on lines, a result that cites one): the cells an edit
    of those functions re-runs, as the store recorded them."""
    wanted = set(functions)
    conn = sqlite3.connect(os.path.join(directory, _FILE))
    try:
        rows = conn.execute(
            "SELECT e.key, e.result, e.stored, r.functions FROM entries e JOIN rans r ON e.ran = r.id"
        ).fetchall()
    finally:
        conn.close()
    newest: dict[str, tuple[str, str, bytes]] = {}
    for key, result, stored, ran in rows:
        if key not in newest or stored > newest[key][1]:
            newest[key] = (result, stored, ran)
    found = set()
    for result, _, ran in newest.values():
        record = json.loads(zlib.decompress(ran))
        names = wanted & set(record["functions"])
        if placed_only:
            names = {n for n in names if _placed(n, record["placed"])}
        if names:
            cell = json.loads(result)
            found.add((cell["scenario"], tuple(cell["toggles"])))
    return found


def _cited_files(result: dict) -> list[str]:
    """The files whose lines ``result``'s findings name (as a frame shows them: relative to the
    code base's package, or a bare file name)."""
    out: set[str] = set()
    for f in result.get("findings") or ():
        for text in (str(f.get("message", "")), str(f.get("frame", ""))):
            out.update(m.group(1) for m in _CITES_LINE.finditer(text))
    return sorted(out)


def _move_cited_lines(result: Any, moves: Sequence[tuple[str, int, int, int]]) -> None:
    """The lines ``result``'s findings cite, moved where their functions moved (``_moves_of``)."""
    if not moves:
        return

    def moved(m: re.Match) -> str:
        cited, line = m.group(1), int(m.group(0).rsplit(":", 1)[1])
        for rel, first, last, by in moves:
            if (rel == cited or rel.endswith("/" + cited)) and first <= line <= last:
                return f"{cited}:{line + by}"
        return m.group(0)

    for f in result.findings:
        for field in ("message", "frame"):
            if isinstance(f.get(field), str):
                f[field] = _CITES_LINE.sub(moved, f[field])


def _placed(name: str, cited: bool | list[str]) -> bool:
    """Whether the function ``name`` (``path::qualified name``) is keyed on its lines: its file
    is one ``cited`` names (a row of an older store says True or False for every function)."""
    if isinstance(cited, bool):
        return cited
    rel = name.partition("::")[0]
    return any(rel == c or rel.endswith("/" + c) for c in cited)


class _Row(BaseModel):
    """A stored result as it must read: anything else is a damaged row."""

    model_config = ConfigDict(extra="forbid")

    scenario: str
    toggles: list[str]
    device: str
    verdict: Literal[MARKS]  # type: ignore[valid-type]
    findings: list[dict]
    error: dict | None = None
    timings_ms: dict = {}
    revert_env: str | None = None
    kernels: dict | None = None
    reached: list[str] | None = None
    reached_at: dict[str, str] | None = None
    fingerprint: dict | None = None


def _read_row(text: str, *, scenario: str | None, toggles: Sequence[str] | None) -> CellResult | None:
    """The result in a row, or None when the row is damaged or is not this cell's."""
    try:
        row = _Row.model_validate(json.loads(text))
    except (ValueError, ValidationError, TypeError):
        return None
    verdicts = [f.get("verdict") for f in row.findings]
    if any(v not in MARKS or not isinstance(f.get("message"), str) for v, f in zip(verdicts, row.findings)):
        return None
    # Each one is a mark (checked above).
    if row.verdict != worst(cast(list[str], verdicts)) or row.verdict in NOT_STORED:
        return None
    if scenario is not None and row.scenario != scenario:
        return None
    if toggles is not None and list(row.toggles) != list(toggles):
        return None
    return CellResult.from_json(row.model_dump())


class _Files:
    """The code base's files below ``top`` as this run found them, each read once: content
    digest, size and modification time at that read, skeleton and function digests."""

    def __init__(self, top: str, db: _Db, memo: ParsedMemo | None = None) -> None:
        self.top, self.db, self.memo = top, db, memo
        self._read: dict[str, tuple[str, list[int]] | None] = {}
        self._parsed: dict[str, dict | None] = {}
        self._lock = threading.Lock()

    def _once(self, rel: str) -> tuple[str, list[int]] | None:
        with self._lock:
            if rel in self._read:
                return self._read[rel]
        path = os.path.join(self.top, rel)
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                found: Any = (content_digest(fh.read()), [st.st_mtime_ns, st.st_size])
        except OSError:
            found = None
        with self._lock:
            return self._read.setdefault(rel, found)

    def content(self, rel: str) -> str | None:
        got = self._once(rel)
        return got[0] if got else None

    def stat(self, rel: str) -> list[int] | None:
        got = self._once(rel)
        return got[1] if got else None

    def parsed(self, rel: str) -> dict | None:
        with self._lock:
            if rel in self._parsed:
                return self._parsed[rel]
        whole = self.content(rel)
        digests = None
        if whole is not None:
            digests = self.db.digests(whole)
            if digests is None and self.memo is not None:
                digests = self.memo.get(whole)  # parsed of the same bytes by another store here
                if digests is not None:
                    self.db.put_digests(whole, digests)
            if digests is None:
                try:
                    with open(os.path.join(self.top, rel), "rb") as fh:
                        data = fh.read()
                except OSError:
                    data = None
                if data is not None and content_digest(data) == whole:
                    digests = file_digests(data, path=rel)
                    self.db.put_digests(whole, digests)
                    if self.memo is not None:
                        self.memo.put(whole, digests)
        with self._lock:
            return self._parsed.setdefault(rel, digests)

    def skeleton(self, rel: str) -> str | None:
        got = self.parsed(rel)
        return got["skeleton"] if got else None

    def function(self, name: str, *, placed: bool) -> str | None:
        """The digest of ``rel::qualname`` as the file holds it now; a name the file does not
        define (code compiled elsewhere under the file's name) is keyed on the whole file."""
        rel, _, qual = name.partition("::")
        got = self.parsed(rel)
        if got is None:
            return None
        pair = got["functions"].get(qual)
        if pair is None:
            return "file:" + (self.content(rel) or "")
        return pair[1] if placed else pair[0]

    def span(self, name: str) -> list[int] | None:
        """[first line, last line] of ``rel::qualname`` as the file holds it now (None for a
        name the file does not define, or digests made before spans were kept)."""
        rel, _, qual = name.partition("::")
        got = self.parsed(rel)
        entry = got["functions"].get(qual) if got else None
        return list(entry[2:4]) if entry is not None and len(entry) >= 4 else None


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
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                if self.conn.execute("PRAGMA user_version").fetchone()[0] != _VERSION:
                    # Another layout (an older sglfix's): its entries mean something else.
                    for table in (*_OLD_TABLES, "contexts"):
                        self.conn.execute(f"DROP TABLE IF EXISTS {table}")
                    self.conn.execute(f"PRAGMA user_version = {_VERSION}")
                for statement in _SCHEMA.strip().split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise

    def one(self, sql: str, args: Sequence[Any]) -> Any:
        with self.lock:
            return self.conn.execute(sql, tuple(args)).fetchone()

    def all(self, sql: str, args: Sequence[Any]) -> list:
        with self.lock:
            return self.conn.execute(sql, tuple(args)).fetchall()

    def write(self, sql: str, args: Sequence[Any]) -> None:
        with self.lock:
            self.conn.execute(sql, tuple(args))

    def digests(self, content: str) -> dict | None:
        row = self.one("SELECT digests FROM files WHERE content = ?", (content,))
        return read_digests(row[0]) if row is not None else None

    def put_digests(self, content: str, digests: dict) -> None:
        self.write("INSERT OR REPLACE INTO files VALUES (?, ?)", (content, json.dumps(digests)))

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class ResultStore:
    """One run's view of a store folder: ``get`` before cells run, ``put`` as results arrive,
    ``close`` at the end (waits for the writes unless the run was cut short)."""

    def __init__(self, directory: str, *, context: str, parts: dict, top: str) -> None:
        from sglfix.execution.store.installed import Installed

        self.directory = os.path.abspath(os.path.expanduser(directory))
        prepare_folder(self.directory)
        self.context = context
        self.db = _Db(Path(self.directory) / _FILE)
        self.db.write("INSERT OR IGNORE INTO contexts VALUES (?, ?, NULL)", (context, json.dumps(parts)))
        self.parsed = ParsedMemo()
        self.files = _Files(top, self.db, self.parsed)
        self.installed = Installed()
        self._holds: dict[tuple[str, str], bool] = {}  # (table, id) -> whether it holds now
        self._moved: dict[str, list] = {}  # ran id that holds -> the moves of the functions its result cites
        self._procs: dict[str, dict] = {}  # a worker's digest of its process record -> the record
        self._process_of: dict[str, str | None] = {}  # that digest -> the processes row made of it
        self.served = 0
        self.stored = 0
        self.dropped = 0  # damaged rows found and removed
        self.changed: set[str] = set()  # files that changed while the run ran (results not stored)
        self._used: list[tuple[str, str, str]] = []  # the entries served: marked used at the end
        self._failed: str | None = None  # set before the writer starts: it reads it
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="sglfix-store", daemon=True)
        self._writer.start()

    # -- reading ----------------------------------------------------------------------------------

    def get(
        self,
        key: str,
        *,
        record: Sequence[str] | None = None,
        reachability: bool = True,
        scenario: str | None = None,
        toggles: Sequence[str] | None = None,
    ) -> Any:
        """``(result, deps)`` of the newest entry under ``key`` whose record still holds
        (``record``: the targets a baseline must have recorded entries of); else None. A row that
        cannot be read is dropped (``scenario`` and ``toggles``: the cell it must be of)."""
        try:
            rows = self.db.all(
                "SELECT process, ran, record, result, stored FROM entries WHERE key = ? ORDER BY stored DESC",
                (key,),
            )
        except sqlite3.Error:
            return None
        for process, ran, record_json, result_json, stored in rows:
            result = _read_row(result_json, scenario=scenario, toggles=toggles)
            if result is None:
                self._drop(key, process, ran)
                continue
            if result.verdict == "NOT_REACHED" and not reachability:
                continue  # a run of every cell wants each one run
            if record:
                try:
                    had = set(json.loads(record_json)) if record_json else None
                except (ValueError, TypeError):
                    self._drop(key, process, ran)
                    continue
                if had is None or result.reached is None or not set(record) <= had:
                    continue
            if not self._process_holds(process) or not self._ran_holds(ran):
                continue
            _move_cited_lines(result, self._moved.get(ran, ()))
            result.stored = stored
            self.served += 1
            self._used.append((key, process, ran))
            return result, ("entry", process, ran)
        return None

    def _drop(self, key: str, process: str, ran: str) -> None:
        try:
            self.db.write("DELETE FROM entries WHERE key = ? AND process = ? AND ran = ?", (key, process, ran))
            self.dropped += 1
        except sqlite3.Error:
            pass

    def drop(self, key: str, deps: Any) -> None:
        """Remove the entry a served result came from (``--verify-store`` found it wrong)."""
        if deps and deps[0] == "entry":
            self._drop(key, deps[1], deps[2])

    def _memo(self, table: str, ident: str, check: Any) -> bool:
        known = self._holds.get((table, ident))
        if known is None:
            try:
                known = bool(check())
            except (sqlite3.Error, ValueError, TypeError, KeyError, AttributeError, zlib.error):
                known = False  # a damaged row: its entries miss
            self._holds[(table, ident)] = known
        return known

    def _process_holds(self, ident: str) -> bool:
        def check() -> bool:
            row = self.db.one("SELECT parts FROM processes WHERE id = ?", (ident,))
            if row is None:
                return False
            parts = json.loads(row[0])
            if any(self.files.skeleton(rel) != d for rel, d in parts["imports"].items()):
                return False
            if any(self.files.function(n, placed=False) != d for n, d in parts["boot"].items()):
                return False
            for name, digest in parts["roots"].items():
                places = self.installed.locate(name)
                if places is None or self.installed.digest(places) != digest:
                    return False
            if any(self.installed.digest(places) != digest for places, digest in parts["at"]):
                return False
            return not any(self.installed.locate(name) is not None for name in parts["absent"])

        return self._memo("process", ident, check)

    def _ran_holds(self, ident: str) -> bool:
        """Whether every function the entry ran is as it was; on the same read of its record, the
        moves of the functions whose lines its result cites (``_moves_of``)."""

        def check() -> bool:
            row = self.db.one("SELECT functions FROM rans WHERE id = ?", (ident,))
            if row is None:
                return False
            ran = json.loads(zlib.decompress(row[0]))
            cited = ran["placed"]
            if not all(self.files.function(n, placed=_placed(n, cited)) == d for n, d in ran["functions"].items()):
                return False
            self._moved[ident] = self._moves_of(ran.get("spans") or {})
            return True

        return self._memo("ran", ident, check)

    def _moves_of(self, spans: dict) -> list[tuple[str, int, int, int]]:
        """(file, first, last, by how many lines) of each function of ``spans`` (name -> its first
        and last line when stored) that has moved since (an edit above it): the lines a result
        cites there move with it."""
        moves = []
        for name, (first, last) in spans.items():
            now = self.files.span(name)
            if now is not None and now[0] != first:
                moves.append((name.partition("::")[0], first, last, now[0] - first))
        return moves

    def info(self) -> dict | None:
        try:
            row = self.db.one("SELECT info FROM contexts WHERE id = ?", (self.context,))
            return json.loads(row[0]) if row and row[0] else None
        except (sqlite3.Error, ValueError):
            return None

    # -- writing ----------------------------------------------------------------------------------

    def keep_info(self, info: dict) -> None:
        """What the workers said of themselves, for a later run that starts none."""
        kept = {k: v for k, v in info.items() if k not in ("workers", "kept", "executor", "mps", "pid", "boot_s")}
        self._queue.put(("info", kept))

    def put(self, key: str, result: CellResult, *, deps: Any, record: Sequence[str] | None = None) -> None:
        """File ``result`` under ``key``: ``deps`` is the worker's record (``deps_of``) or, for
        a NOT_REACHED cell, what its baseline's entry depends on."""
        if deps is None or unstorable(result) is not None:
            return
        self._queue.put(("put", key, result.to_json(), deps, tuple(record) if record else None))

    def deps_of(self, worker_deps: dict | None) -> Any:
        """A worker's record as the store files it, resolved on the writer thread; here only the
        process record is remembered under its digest."""
        if not isinstance(worker_deps, dict) or "process" not in worker_deps:
            return None
        digest = worker_deps["process"]
        if isinstance(worker_deps.get("proc"), dict):
            self._procs[digest] = worker_deps["proc"]
        if digest not in self._procs:
            return None  # the record came in a reply that was lost: not stored
        return ("worker", list(worker_deps.get("ran") or ()), digest)

    def _process_id(self, digest: str) -> str | None:
        """The processes row of a worker's process record (made once per run and record); None
        when a file it lists cannot be read or is not the one the worker loaded."""
        if digest in self._process_of:
            return self._process_of[digest]
        proc = self._procs[digest]
        ident = None
        imports = {}
        for rel, seen in proc["imported"].items():
            if self.files.stat(rel) != list(seen):
                self.changed.add(rel)
                break
            imports[rel] = self.files.skeleton(rel)
            if imports[rel] is None:
                break
        else:
            boot = {n: self.files.function(n, placed=False) for n in proc["boot"]}
            # A package is found again by its name where this process finds it where the worker
            # did (a reinstall elsewhere, or another environment, is then seen); one the worker
            # reached another way (a vendored copy put on its path at run time, a shadowing
            # hook) is kept by where it was.
            roots, at = {}, []
            for name, places in proc["roots"].items():
                package_digest = self.installed.digest(places)
                if self.installed.locate(name) == sorted(places):
                    roots[name] = package_digest
                else:
                    at.append([sorted(places), package_digest])
            # A module this process finds although the worker did not is no absence to check.
            absent = sorted(n for n in proc["absent"] if self.installed.locate(n) is None)
            if None not in boot.values() and None not in roots.values() and None not in (d for _, d in at):
                parts = {"imports": imports, "boot": boot, "roots": roots, "at": sorted(at), "absent": absent}
                text = json.dumps(parts, sort_keys=True)
                ident = content_digest(text.encode())
                self.db.write("INSERT OR IGNORE INTO processes VALUES (?, ?)", (ident, text))
        self._process_of[digest] = ident
        return ident

    def _resolve(self, deps: Any, result: dict) -> tuple[str, str] | None:
        if deps[0] == "entry":
            return deps[1], deps[2]
        _, names, digest = deps
        process = self._process_id(digest)
        if process is None:
            return None
        imported = self._procs[digest]["imported"]
        cited = _cited_files(result)
        functions, spans = {}, {}
        for name in names:
            rel = name.partition("::")[0]
            if rel in imported and self.files.stat(rel) != list(imported[rel]):
                self.changed.add(rel)
                return None
            placed = _placed(name, cited)
            d = self.files.function(name, placed=placed)
            if d is None:
                return None
            functions[name] = d
            if placed and (span := self.files.span(name)) is not None:
                spans[name] = span
        text = json.dumps({"placed": cited, "functions": functions, "spans": spans}, sort_keys=True)
        ran = content_digest(text.encode())
        self.db.write("INSERT OR IGNORE INTO rans VALUES (?, ?)", (ran, zlib.compress(text.encode())))
        return process, ran

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
                resolved = self._resolve(deps, result)
                if resolved is None:
                    continue
                process, ran = resolved
                result = {k: v for k, v in result.items() if k not in ("deps", "stored")}
                stored = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
                self.db.write(
                    "INSERT OR REPLACE INTO entries (key, process, ran, record, result, stored) VALUES (?, ?, ?, ?, ?, ?)",
                    (key, process, ran, json.dumps(record) if record else None, json.dumps(result), stored),
                )
                # The newest few states of a cell are kept; older ones would rarely come back.
                self.db.write(
                    "DELETE FROM entries WHERE key = ? AND rowid NOT IN "
                    "(SELECT rowid FROM entries WHERE key = ? ORDER BY stored DESC LIMIT ?)",
                    (key, key, _KEPT),
                )
                self.stored += 1
            except (sqlite3.Error, OSError) as exc:
                self._failed = f"{type(exc).__name__}: {exc}"
            finally:
                self._queue.task_done()

    def _mark_used(self) -> None:
        """The entries this run was served, stamped as used now, in one transaction (what
        ``sglfix cache prune --older-than`` ages an entry by, with when it was written)."""
        import datetime

        if not self._used or self._failed is not None:
            return
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
        try:
            with self.db.lock:
                self.db.conn.execute("BEGIN IMMEDIATE")
                try:
                    self.db.conn.executemany(
                        "UPDATE entries SET used = ? WHERE key = ? AND process = ? AND ran = ?",
                        [(now, *entry) for entry in self._used],
                    )
                    self.db.conn.execute("COMMIT")
                except BaseException:
                    self.db.conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            self._failed = f"{type(exc).__name__}: {exc}"

    @property
    def failed(self) -> str | None:
        """Why writing stopped, if it did (the run's results stand; the store misses them)."""
        return self._failed

    def close(self, *, wait: bool = True) -> None:
        if wait:
            self._queue.put(None)
            self._writer.join()
            self._mark_used()
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
        self.installed.close()
        self.parsed.close()
