"""The result store's folder: what makes a folder a store, the schema it was written in, and its
lifecycle (``sglfix cache show | prune | clear``).

A store folder holds, besides the store's own files (``results.sqlite`` and the mutant memo), a
marker (``sglfix-store.json``: the schema its files were written in), a ``CACHEDIR.TAG`` (backup
and archiving tools skip the folder) and a README saying what the folder is. They are written
when the folder becomes a store: a new or empty folder, or one an earlier sglfix made. A folder
written in another schema (or by an sglfix older than the marker) is emptied and made again, with
one line on stderr, never read. A folder that holds other files and no marker is no store: a run
refuses it (``--cache DIR``) and the cache commands delete nothing in it.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import sqlite3
import sys
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from sglfix.common.errors import ConfigError

__all__ = [
    "MARKER",
    "MUTANT_MEMO",
    "RESULTS_FILE",
    "SCHEMA",
    "TAG",
    "FolderState",
    "Removed",
    "StorePart",
    "StoreSummary",
    "clear_store",
    "folder_state",
    "parse_age",
    "prepare_folder",
    "prune_store",
    "summarize_store",
]

# The layout of every file of the store (the SQLite tables and what a row means). Bump it when
# any of them changes meaning: a folder written in another schema is emptied, never misread.
SCHEMA = 4  # 4: a function's positioned digest is its shape and positions, not a positioned dump
RESULTS_FILE = "results.sqlite"
MUTANT_MEMO = "mutants-mapped.json"  # sglfix.execution.mutate: mutants mapped onto the source
MARKER = "sglfix-store.json"
TAG = "CACHEDIR.TAG"
_README = "README.md"
_IGNORE = ".gitignore"
# The files of the store, in any schema (SQLite's companions with the results).
_STORE_FILES = (RESULTS_FILE, *(RESULTS_FILE + s for s in ("-wal", "-shm", "-journal")), MUTANT_MEMO)
_IDENTITY = (MARKER, TAG, _README, _IGNORE)

# The signature that makes a CACHEDIR.TAG one (https://bford.info/cachedir/).
_TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by sglfix (its result store).\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
_README_TEXT = """# sglfix result store

This folder is sglfix's result store: each cell's result, kept and served again while nothing it
ran has changed (`results.sqlite`), and the mutants a `sglfix mutate` campaign mapped onto the
source (`mutants-mapped.json`). It is a cache: deleting it loses nothing but the time to run the
cells again.

    sglfix cache show                       what it holds, and how old
    sglfix cache prune --older-than 30d     remove what no run used or wrote for 30 days
    sglfix cache clear                      remove every result (this file and the tags stay)

`sglfix-store.json` names the schema the files were written in: a folder of another schema is
emptied by the next run. `CACHEDIR.TAG` tells backup tools to skip the folder.
"""
_IGNORE_TEXT = "# Made by sglfix: a cache, never committed.\n*\n"


class _Marker(BaseModel):
    """``sglfix-store.json``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sglfix result store"] = "sglfix result store"
    schema_version: int


class FolderState(BaseModel):
    """What a folder is to the store: ``new`` (absent, or nothing in it), ``store`` (a marker;
    ``schema`` the one it names, None when the marker cannot be read), ``old`` (the store files of
    an sglfix older than the marker, no marker), ``foreign`` (other files, no marker)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["new", "store", "old", "foreign"]
    schema_version: int | None = None
    tagged: bool = False


def folder_state(directory: str) -> FolderState:
    if not os.path.isdir(directory):
        return FolderState(kind="new")
    names = [n for n in os.listdir(directory) if not _scratch(n)]
    tagged = TAG in names
    # The store's files before the marker: a process making this folder writes the marker first,
    # so one that sees the results file sees the marker that came before it.
    has_files = any(n in _STORE_FILES for n in names)
    marker = os.path.join(directory, MARKER)
    if os.path.exists(marker):
        try:
            with open(marker, encoding="utf-8") as fh:
                schema = _Marker.model_validate(json.load(fh)).schema_version
        except (OSError, ValueError, ValidationError):
            schema = None
        return FolderState(kind="store", schema_version=schema, tagged=tagged)
    if has_files:
        return FolderState(kind="old", tagged=tagged)
    if any(n not in _IDENTITY for n in names):
        return FolderState(kind="foreign", tagged=tagged)
    return FolderState(kind="new", tagged=tagged)


def _scratch(name: str) -> bool:
    """A file a write left on its way (an atomic write's temporary file, a writability probe)."""
    return (name.startswith(".") and name.endswith(".tmp")) or name.startswith(".sglfix-write-")


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    """The folder held against other sglfix processes making or emptying it at the same moment
    (shards and CI jobs share one store)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def prepare_folder(directory: str) -> None:
    """``directory`` made a store of this schema: created, or emptied when another schema (or an
    older sglfix) wrote it (one line on stderr), its marker, tag and README written when missing.
    A folder of other files is refused (``ConfigError``), nothing written in it."""
    os.makedirs(directory, exist_ok=True)
    with _locked(directory):
        state = folder_state(directory)
        if state.kind == "foreign":
            raise ConfigError(_foreign(directory))
        if state.kind == "old" or (state.kind == "store" and state.schema_version != SCHEMA):
            was = "an older sglfix (no schema marker)" if state.kind == "old" else _schema_words(state)
            _remove_store_files(directory, count=False)
            print(
                f"sglfix: the result store at {directory} was written by {was}; this sglfix writes schema "
                f"{SCHEMA}: emptied and made again",
                file=sys.stderr,
            )
        _write_identity(directory, marker=state.kind != "store" or state.schema_version != SCHEMA)


def _schema_words(state: FolderState) -> str:
    return "an unreadable schema marker" if state.schema_version is None else f"schema {state.schema_version}"


def _foreign(directory: str) -> str:
    return (
        f"{directory} holds other files and is not an sglfix result store (no {MARKER} in it); "
        "give a new or empty folder, or one an earlier run made"
    )


def _write_identity(directory: str, *, marker: bool) -> None:
    """The marker (first: see ``folder_state``), then the tag, the README and the .gitignore
    where missing."""
    from sglfix.report.output import write_atomic

    if marker:
        write_atomic(os.path.join(directory, MARKER), _Marker(schema_version=SCHEMA).model_dump_json() + "\n")
    for name, text in ((TAG, _TAG_TEXT), (_README, _README_TEXT), (_IGNORE, _IGNORE_TEXT)):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            write_atomic(path, text)


# -- the lifecycle: show, prune, clear ------------------------------------------------------------


class StorePart(BaseModel):
    """One kind of thing a store folder holds: how many records, their bytes, and when the least
    and the most recently used (or written) of them was."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["results", "mutant memo", "other"]
    records: int
    bytes: int
    oldest: str | None = None
    newest: str | None = None


class StoreSummary(BaseModel):
    """``sglfix cache show``."""

    model_config = ConfigDict(extra="forbid")

    path: str
    exists: bool
    schema_version: int | None  # the schema the folder's marker names (None: none, or unreadable)
    current_schema: int = SCHEMA
    records: int = 0
    bytes: int = 0  # every file of the folder
    parts: list[StorePart] = []
    note: str | None = None  # why the records are not counted (another schema, or no store yet)


class Removed(BaseModel):
    """What ``sglfix cache prune`` or ``clear`` removed."""

    model_config = ConfigDict(extra="forbid")

    path: str
    records: int
    bytes: int
    parts: list[StorePart] = []
    left: int = 0  # files of the folder that are not the store's, left as they were
    note: str | None = None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_age(text: str, *, option: str = "--older-than") -> float:
    """``7d``, ``12h``, ``90m``, ``30s``, ``2w`` (a number and a unit) in seconds; anything else is
    one line naming the option and the fix."""
    m = _AGE.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(f"{option} {text!r}: give an age as a number and a unit, s, m, h, d or w (e.g. {option} 7d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")


def _results_part(directory: str) -> StorePart:
    """The results file's entries (this schema's: read only after the marker said so)."""
    size = sum(_size(os.path.join(directory, n)) for n in _STORE_FILES if n != MUTANT_MEMO)
    path = os.path.join(directory, RESULTS_FILE)
    if not os.path.exists(path):
        return StorePart(kind="results", records=0, bytes=size)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
    try:
        count, oldest, newest = conn.execute(
            "SELECT count(*), min(coalesce(used, stored)), max(coalesce(used, stored)) FROM entries"
        ).fetchone()
    except sqlite3.Error:
        count, oldest, newest = 0, None, None  # made but no table yet: nothing kept
    finally:
        conn.close()
    return StorePart(kind="results", records=count, bytes=size, oldest=_second(oldest), newest=_second(newest))


def _second(stamp: str | None) -> str | None:
    """A stored time (ISO, microseconds) to the second, as the table shows it."""
    if stamp is None:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp).isoformat(timespec="seconds")
    except ValueError:
        return stamp


def _memo_part(directory: str) -> StorePart:
    path = os.path.join(directory, MUTANT_MEMO)
    if not os.path.exists(path):
        return StorePart(kind="mutant memo", records=0, bytes=0)
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh).get("entries") or {}
        count = len(entries) if isinstance(entries, dict) else 0
    except (OSError, ValueError, AttributeError):
        count = 0  # an unreadable memo is an empty one (as the campaign reads it)
    when = _when(os.stat(path).st_mtime)
    return StorePart(kind="mutant memo", records=count, bytes=_size(path), oldest=when, newest=when)


def _others(directory: str) -> list[str]:
    """The folder's files that are neither the store's nor its identity."""
    return sorted(n for n in os.listdir(directory) if n not in _STORE_FILES and n not in _IDENTITY and not _scratch(n))


def _other_part(directory: str) -> StorePart:
    names = _others(directory)
    times = [os.stat(os.path.join(directory, n)).st_mtime for n in names]
    return StorePart(
        kind="other",
        records=len(names),
        bytes=sum(_du(os.path.join(directory, n)) for n in names),
        oldest=_when(min(times)) if times else None,
        newest=_when(max(times)) if times else None,
    )


def _du(path: str) -> int:
    if not os.path.isdir(path) or os.path.islink(path):
        return _size(path)
    return sum(_size(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


def summarize_store(directory: str) -> StoreSummary:
    """What the store at ``directory`` holds (``sglfix cache show``)."""
    state = folder_state(directory)
    if state.kind == "foreign" or (state.kind == "store" and not state.tagged):
        raise ConfigError(_not_a_store(directory, "nothing shown"))
    if not os.path.isdir(directory):
        return StoreSummary(path=directory, exists=False, schema_version=None, note="no store here yet: nothing kept")
    total = _du(directory)
    if state.kind == "new":
        return StoreSummary(path=directory, exists=True, schema_version=None, bytes=total, note="nothing kept yet")
    if state.schema_version != SCHEMA:
        was = "an older sglfix (no schema marker)" if state.kind == "old" else _schema_words(state)
        note = f"written by {was}: not read; the next run empties it"
        return StoreSummary(path=directory, exists=True, schema_version=state.schema_version, bytes=total, note=note)
    parts = [_results_part(directory), _memo_part(directory), _other_part(directory)]
    return StoreSummary(
        path=directory,
        exists=True,
        schema_version=SCHEMA,
        records=sum(p.records for p in parts if p.kind != "other"),
        bytes=total,
        parts=parts,
    )


def _not_a_store(directory: str, what: str) -> str:
    return (
        f"{directory} is not an sglfix result store (no {TAG} and {MARKER} in it): {what}; "
        "give the folder of a store (--cache DIR), or leave --cache out for the default one"
    )


def _checked_store(directory: str, *, what: str) -> FolderState | None:
    """The state of a folder prune or clear may work in; None when there is no folder. One that
    is not a store (no tag and marker) is refused: nothing in it is removed."""
    if not os.path.isdir(directory):
        return None
    state = folder_state(directory)
    if state.kind == "new" and not os.listdir(directory):
        return None
    if state.kind != "store" or not state.tagged:
        raise ConfigError(_not_a_store(directory, f"nothing {what}"))
    return state


def prune_store(directory: str, *, older_than_s: float, now: float | None = None) -> Removed:
    """Remove the results no run used or wrote in the last ``older_than_s`` seconds (and the
    mutant memo if not written since), then give the space back (``sglfix cache prune``)."""
    import time

    state = _checked_store(directory, what="pruned")
    if state is None:
        return Removed(path=directory, records=0, bytes=0, note="no store here: nothing pruned")
    if state.schema_version != SCHEMA:
        raise ConfigError(
            f"{directory} holds the store in {_schema_words(state)}, not this sglfix's schema {SCHEMA}: its ages "
            "cannot be read; sglfix cache clear empties it (the next run does too)"
        )
    cutoff_ts = (time.time() if now is None else now) - older_than_s
    cutoff = datetime.datetime.fromtimestamp(cutoff_ts, datetime.UTC).isoformat(timespec="microseconds")
    with _locked(directory):
        before = _du(directory)
        parts = [_prune_results(directory, cutoff)]
        memo = os.path.join(directory, MUTANT_MEMO)
        dropped = StorePart(kind="mutant memo", records=0, bytes=0)
        if os.path.exists(memo) and os.stat(memo).st_mtime < cutoff_ts:
            dropped = _memo_part(directory)
            os.remove(memo)
        parts.append(dropped)
        freed = max(0, before - _du(directory))
    return Removed(path=directory, records=sum(p.records for p in parts), bytes=freed, parts=parts)


def _prune_results(directory: str, cutoff: str) -> StorePart:
    """Delete the entries last used (or written) before ``cutoff``, the records of processes and
    of what ran that no entry names any longer, then compact the file."""
    path = os.path.join(directory, RESULTS_FILE)
    if not os.path.exists(path):
        return StorePart(kind="results", records=0, bytes=0)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        size = sum(_size(os.path.join(directory, n)) for n in _STORE_FILES if n != MUTANT_MEMO)
        conn.execute("BEGIN IMMEDIATE")
        try:
            oldest, newest = conn.execute(
                "SELECT min(coalesce(used, stored)), max(coalesce(used, stored)) FROM entries "
                "WHERE coalesce(used, stored) < ?",
                (cutoff,),
            ).fetchone()
            gone = conn.execute("DELETE FROM entries WHERE coalesce(used, stored) < ?", (cutoff,)).rowcount
            conn.execute("DELETE FROM processes WHERE id NOT IN (SELECT process FROM entries)")
            conn.execute("DELETE FROM rans WHERE id NOT IN (SELECT ran FROM entries)")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if gone:
            # The space back: a run sharing the file may hold it, and then it stays for later.
            with contextlib.suppress(sqlite3.Error):
                conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    after = sum(_size(os.path.join(directory, n)) for n in _STORE_FILES if n != MUTANT_MEMO)
    return StorePart(
        kind="results", records=gone, bytes=max(0, size - after), oldest=_second(oldest), newest=_second(newest)
    )


def clear_store(directory: str) -> Removed:
    """Remove every result and the mutant memo; the marker, the tag and the README stay, and so
    does any file that is not the store's (``sglfix cache clear``)."""
    state = _checked_store(directory, what="removed")
    if state is None:
        return Removed(path=directory, records=0, bytes=0, note="no store here: nothing removed")
    with _locked(directory):
        removed = _remove_store_files(directory, count=state.schema_version == SCHEMA)
        _write_identity(directory, marker=state.schema_version != SCHEMA)
        left = len(_others(directory))
    return removed.model_copy(update={"left": left})


def _remove_store_files(directory: str, *, count: bool = True) -> Removed:
    """Delete the store's files (any schema's), counting their records where this schema can
    read them (``count``)."""
    parts = [_results_part(directory), _memo_part(directory)] if count else []
    size = 0
    for name in _STORE_FILES:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            size += _size(path)
            os.remove(path)
    return Removed(path=directory, records=sum(p.records for p in parts), bytes=size, parts=parts)
