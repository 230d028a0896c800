"""A code base file's parse (its skeleton and function digests, ``fingerprint.file_digests``) by
content, kept beside sglfix's other caches (``parsed-digests.sqlite``): a store that has not seen a
file yet (a new CI job's, a test's, a fresh folder's) takes what another store on this machine
parsed of the same bytes, instead of parsing a code base's thousand files again. The digests are a
function of the content and of the store's schema, which the key holds: a schema that changes what
they mean never reads another's. A memo that cannot be opened or written only costs time.
"""

from __future__ import annotations

import json
import sqlite3
import threading

from sglfix.execution.store.fingerprint import read_digests

__all__ = ["ParsedMemo"]

_SCHEMA = "CREATE TABLE IF NOT EXISTS parsed (key TEXT PRIMARY KEY, digests TEXT NOT NULL)"


class ParsedMemo:
    """The memo, opened once per run; ``get``/``put`` by content digest."""

    def __init__(self, path: str | None = None) -> None:
        from sglfix.common import cachedir
        from sglfix.execution.store.folder import SCHEMA
        from sglfix.execution.store.installed import open_memo

        self._prefix = f"{SCHEMA}:"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = open_memo(path or cachedir.parsed_digests(), _SCHEMA)

    def get(self, content: str) -> dict | None:
        with self._lock:
            if self._conn is None:
                return None
            try:
                row = self._conn.execute(
                    "SELECT digests FROM parsed WHERE key = ?", (self._prefix + content,)
                ).fetchone()
            except sqlite3.Error:
                return None
        return read_digests(row[0]) if row else None

    def put(self, content: str, digests: dict) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.execute(
                    "INSERT OR REPLACE INTO parsed VALUES (?, ?)", (self._prefix + content, json.dumps(digests))
                )
            except sqlite3.Error:
                pass

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
